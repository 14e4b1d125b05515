"""The ``kubernetes`` provider: node groups of a Kubernetes cluster as Cluster API manages them.

Each instance type of the configuration names its node group (``group``): a Cluster API
``MachineDeployment`` in ``provider_group``'s namespace, which turns its replicas into machines,
and those into nodes, of one instance type in one zone. Ferry scales the group as the cluster
autoscaler's Cluster API provider does:

- A launch raises the group's ``spec.replicas`` by one (a JSON merge patch) and waits for the new
  Machine to run with a node; it returns the node's name (Kubernetes names its nodes), under which
  the node's Ferry agent joins. A Machine that fails (``status.phase: Failed``) is refused; it is
  marked for deletion and the replicas go back down.
- A termination marks the node's Machine (annotation ``cluster.x-k8s.io/delete-machine``) and
  lowers the replicas by one, so that Cluster API removes that machine and no other.
- ``nodes()`` lists the groups' Machines (label ``cluster.x-k8s.io/deployment-name``).

It speaks to the kube-apiserver's REST API with the bearer token of ``provider_token_file`` (in a
pod: its service account's token and CA). No kube-apiserver can be installed where the suite runs:
the tests run it against a double of these paths (``tests/clouddouble.py``).
"""

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ferry.fleet.cloud import CloudConfig
from ferry.fleet.provider import InstanceType, LaunchRefused, NodeState, ProvidedNode, ProviderError
from ferry.fleet.rest import Rest

CAPI = "/apis/cluster.x-k8s.io/v1beta1"
GROUP_LABEL = "cluster.x-k8s.io/deployment-name"
DELETE_MARK = "cluster.x-k8s.io/delete-machine"
MERGE = "application/merge-patch+json"
IN_CLUSTER = "https://kubernetes.default.svc"
SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PHASES: dict[str, NodeState] = {"Pending": "launching", "Provisioning": "launching", "Provisioned": "launching",
                                "Running": "running", "Deleting": "terminating", "Deleted": "terminated",
                                "Failed": "failed"}


def error_code(doc: Any) -> str:
    return str(doc.get("reason", "")) if isinstance(doc, dict) else ""


def machine_node(machine: dict[str, Any]) -> ProvidedNode:
    status = machine.get("status", {})
    return ProvidedNode(id=str(status.get("nodeRef", {}).get("name") or machine["metadata"]["name"]),
                        instance_type=machine["metadata"].get("labels", {}).get(GROUP_LABEL, ""), zone="",
                        spot=False, state=PHASES.get(str(status.get("phase", "")), "launching"),
                        reason=str(status.get("failureMessage", "")))


class KubeProvider:
    name = "kubernetes"

    def __init__(self, config: CloudConfig) -> None:
        self.config = replace(config, token_file=config.token_file or SA / "token")
        self.namespace = config.group or "default"
        verify: str | bool = str(SA / "ca.crt") if (SA / "ca.crt").is_file() and not config.endpoint else True
        self.api = Rest(config.endpoint or IN_CLUSTER, self.config.token, "Kubernetes", {"Invalid", "Forbidden"},
                        error_code, verify=verify)
        self.locks: dict[str, asyncio.Lock] = {}  # one launch at a time per group: the new machine is told apart

    def _md(self, group: str) -> str:
        return f"{CAPI}/namespaces/{self.namespace}/machinedeployments/{group}"

    async def instance_types(self) -> list[InstanceType]:
        return self.config.offers()

    async def _machines(self, group: str = "") -> list[dict[str, Any]]:
        selector = f"{GROUP_LABEL}={group}" if group else GROUP_LABEL
        listed = await self.api.call("GET", f"{CAPI}/namespaces/{self.namespace}/machines",
                                     {"labelSelector": selector})
        return list(listed.get("items", []))

    async def _scale(self, group: str, by: int) -> None:
        md = await self.api.call("GET", self._md(group))
        replicas = int(md.get("spec", {}).get("replicas", 0)) + by
        await self.api.call("PATCH", self._md(group), body={"spec": {"replicas": max(0, replicas)}},
                            content_type=MERGE)

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        spec = self.config.spec(offer)
        if not spec.group:
            raise ProviderError(f"instance type {offer.key} names no node group: set its group (a MachineDeployment)")
        async with self.locks.setdefault(spec.group, asyncio.Lock()):
            before = {m["metadata"]["name"] for m in await self._machines(spec.group)}
            await self._scale(spec.group, +1)
            deadline = time.monotonic() + self.config.timeout_s
            while time.monotonic() < deadline:
                await asyncio.sleep(self.config.poll_s)
                new = [m for m in await self._machines(spec.group) if m["metadata"]["name"] not in before]
                if not new:
                    continue
                node = machine_node(new[0])
                if node.state == "running" and new[0].get("status", {}).get("nodeRef"):
                    return node.model_copy(update={"instance_type": offer.name, "zone": offer.zone,
                                                   "spot": offer.spot})
                if node.state == "failed":
                    await self._remove(spec.group, new[0]["metadata"]["name"])
                    raise LaunchRefused(f"Kubernetes: machine {new[0]['metadata']['name']} of {spec.group} failed: "
                                        f"{node.reason or 'no reason given'}")
            raise LaunchRefused(f"Kubernetes: {spec.group} gave no running node within {self.config.timeout_s:.0f}s")

    async def _remove(self, group: str, machine: str) -> None:
        await self.api.call("PATCH", f"{CAPI}/namespaces/{self.namespace}/machines/{machine}",
                            body={"metadata": {"annotations": {DELETE_MARK: "true"}}}, content_type=MERGE)
        await self._scale(group, -1)

    async def terminate(self, node_id: str) -> None:
        found = [m for m in await self._machines() if machine_node(m).id == node_id]
        if not found:
            return
        machine = found[0]["metadata"]["name"]
        await self._remove(found[0]["metadata"]["labels"][GROUP_LABEL], machine)
        deadline = time.monotonic() + self.config.timeout_s
        while any(m["metadata"]["name"] == machine for m in await self._machines()):
            if time.monotonic() > deadline:
                raise ProviderError(f"Kubernetes: machine {machine} of {node_id} was not removed in time")
            await asyncio.sleep(self.config.poll_s)

    async def nodes(self) -> list[ProvidedNode]:
        groups = {t.group: t for t in self.config.types if t.group}
        out = []
        for machine in await self._machines():
            node = machine_node(machine)
            spec = groups.get(node.instance_type)
            if spec is not None:
                out.append(node.model_copy(update={"instance_type": spec.name, "zone": spec.zone, "spot": spec.spot}))
        return out
