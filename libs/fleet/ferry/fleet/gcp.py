"""The ``gcp`` provider: Compute Engine instances through its REST API (v1).

- A launch inserts ``projects/P/zones/Z/instances`` (``machineType`` the offer's, a spot offer
  with ``scheduling.provisioningModel: SPOT`` that is deleted when preempted), labelled
  ``ferry-cluster``, ``ferry-node`` and ``ferry-offer``, booting ``provider_image`` with
  ``provider_user_data`` as its ``startup-script``; then follows the zone operation, and the
  instance until it is RUNNING.
- An operation that ends in an error Compute Engine documents as a refusal (the zone's pool
  exhausted, a quota, an invalid machine type) is ``LaunchRefused``; nothing stays behind.
- ``nodes()`` lists this cluster's instances in the zones of its offers; those Compute Engine
  preempted (a ``compute.instances.preempted`` operation names them) are marked interrupted.

The token is an OAuth access token (``provider_token_file``: the metadata server's on a GCE
machine, refreshed by whoever writes the file); the endpoint can be set (a local double in the
tests, since no cloud is reachable from CI).
"""

import asyncio
import time
from typing import Any

from ferry.fleet.cloud import CLUSTER_TAG, NODE_TAG, CloudConfig, require
from ferry.fleet.provider import InstanceType, LaunchRefused, NodeState, ProvidedNode, ProviderError
from ferry.fleet.rest import Rest

ENDPOINT = "https://compute.googleapis.com"
REFUSALS = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                      "QUOTA_EXCEEDED", "quotaExceeded", "invalid", "UNSUPPORTED_OPERATION", "resourceNotReady"})
STATES: dict[str, NodeState] = {"PROVISIONING": "launching", "STAGING": "launching", "RUNNING": "running",
                                "STOPPING": "terminating", "SUSPENDING": "terminating", "SUSPENDED": "terminated",
                                "TERMINATED": "terminated", "REPAIRING": "launching"}


def error_code(doc: Any) -> str:
    """The first reason of a Compute Engine error answer or operation error."""
    err = doc.get("error", {}) if isinstance(doc, dict) else {}
    errors = err.get("errors") or [{}] if isinstance(err, dict) else [{}]
    return str(errors[0].get("reason") or errors[0].get("code") or "")


def label(value: str) -> str:
    """A label value Compute Engine accepts: lowercase letters, digits, '-' and '_'."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in value.lower())[:63]


def insert_body(config: CloudConfig, node_id: str, offer: InstanceType) -> dict[str, Any]:
    """The instance resource of one node of ``offer`` (a pure function: the tests read it)."""
    scheduling: dict[str, Any] = ({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                   "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
                                  if offer.spot else {"provisioningModel": "STANDARD", "automaticRestart": True})
    body: dict[str, Any] = {
        "name": node_id,
        "machineType": f"zones/{offer.zone}/machineTypes/{offer.name}",
        "labels": {k: label(v) for k, v in config.tags(node_id, offer).items()},
        "scheduling": scheduling,
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
            "sourceImage": require(config.image, "provider_image", "gcp")}}],
        "networkInterfaces": [{"network": config.network or "global/networks/default"}],
    }
    if script := config.boot_script(node_id):
        body["metadata"] = {"items": [{"key": "startup-script", "value": script}]}
    return body


PREEMPTED = "preempted by Compute Engine"


def provided(instance: dict[str, Any], preempted: set[str]) -> ProvidedNode:
    name = str(instance.get("name", ""))
    return ProvidedNode(id=str(instance.get("labels", {}).get(NODE_TAG, name)),
                        instance_type=str(instance.get("machineType", "")).rsplit("/", 1)[-1],
                        zone=str(instance.get("zone", "")).rsplit("/", 1)[-1],
                        spot=instance.get("scheduling", {}).get("provisioningModel") == "SPOT",
                        state=STATES.get(str(instance.get("status", "")), "failed"),
                        # still listed while its preemption's operation is already there: say so
                        reason=str(instance.get("statusMessage", "")) or (PREEMPTED if name in preempted else ""),
                        interrupted=name in preempted)


class GcpProvider:
    name = "gcp"

    def __init__(self, config: CloudConfig) -> None:
        self.config = config
        self.project = require(config.project, "provider_project", "gcp")
        self.api = Rest(config.endpoint or ENDPOINT, config.token, "Compute Engine", REFUSALS, error_code)

    def _zone(self, zone: str) -> str:
        return f"/compute/v1/projects/{self.project}/zones/{zone}"

    async def instance_types(self) -> list[InstanceType]:
        return self.config.offers()

    async def _operation(self, zone: str, op: dict[str, Any]) -> None:
        """Follows a zone operation to its end; its error, if any, is raised."""
        deadline = time.monotonic() + self.config.timeout_s
        while op.get("status") != "DONE":
            if time.monotonic() > deadline:
                raise ProviderError(f"Compute Engine: operation {op.get('name')} did not end in time")
            await asyncio.sleep(self.config.poll_s)
            op = await self.api.call("GET", f"{self._zone(zone)}/operations/{op['name']}")
        if "error" in op:
            code = error_code(op)
            message = "; ".join(str(e.get("message", "")) for e in op["error"].get("errors", []))
            raise (LaunchRefused if code in REFUSALS else ProviderError)(f"Compute Engine: {code}: {message}")

    async def _instance(self, zone: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self.api.call("GET", f"{self._zone(zone)}/instances/{name}",
                                                           missing_ok=True)
        return found

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        self.config.spec(offer)
        op = await self.api.call("POST", f"{self._zone(offer.zone)}/instances",
                                 body=insert_body(self.config, node_id, offer))
        await self._operation(offer.zone, op)
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            instance = await self._instance(offer.zone, node_id)
            if instance is None:
                raise LaunchRefused(f"Compute Engine: {node_id} was gone as it started")
            node = provided(instance, set())
            if node.state == "running":
                return node
            if node.state in ("terminated", "failed"):
                raise LaunchRefused(f"Compute Engine: {node_id} is {instance.get('status')} as it starts")
            await asyncio.sleep(self.config.poll_s)
        raise ProviderError(f"Compute Engine: {node_id} did not run within {self.config.timeout_s:.0f}s")

    async def terminate(self, node_id: str) -> None:
        for node in await self.nodes():
            if node.id == node_id and node.state != "terminated":
                op = await self.api.call("DELETE", f"{self._zone(node.zone)}/instances/{node_id}", missing_ok=True)
                if op is not None:
                    await self._operation(node.zone, op)

    async def nodes(self) -> list[ProvidedNode]:
        out: list[ProvidedNode] = []
        for zone in sorted({t.zone for t in self.config.types}):
            listed = await self.api.call("GET", f"{self._zone(zone)}/instances",
                                         params={"filter": f"labels.{CLUSTER_TAG}={label(self.config.cluster)}"})
            ops = await self.api.call("GET", f"{self._zone(zone)}/operations",
                                      params={"filter": 'operationType="compute.instances.preempted"'})
            preempted = {str(o.get("targetLink", "")).rsplit("/", 1)[-1] for o in ops.get("items", [])}
            found = [provided(i, preempted) for i in listed.get("items", [])]
            # a preempted spot instance is deleted (instanceTerminationAction): its operation remains
            gone = preempted - {n.id for n in found}
            out += found + [ProvidedNode(id=n, instance_type="", zone=zone, spot=True, state="terminated",
                                         reason=PREEMPTED, interrupted=True) for n in sorted(gone)]
        return out
