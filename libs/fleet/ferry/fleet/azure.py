"""The ``azure`` provider: virtual machines through Azure Resource Manager's REST API
(Microsoft.Compute/virtualMachines, api-version 2024-07-01).

- A launch PUTs the VM ``<node>`` in ``provider_group`` of subscription ``provider_project``: size
  the offer's name, zone the offer's zone's last part (``eastus-2`` is zone 2 of eastus), a spot
  offer as ``priority: Spot`` with ``evictionPolicy: Delete`` and no price cap, its NIC created with
  it in ``provider_network`` (a subnet's id), tags ``ferry-cluster``, ``ferry-node``,
  ``ferry-offer``, ``provider_user_data`` as its customData; then follows the VM until its
  provisioningState is Succeeded (or Failed: the launch is refused, and the VM deleted).
- Azure's refusals (the size not offered in the zone, no capacity, a quota) are ``LaunchRefused``.
- ``nodes()`` lists this cluster's VMs by tag. Evictions are not in that list (an evicted spot VM
  is deleted): the node's own agent sees them first through Scheduled Events (``ferry.node``'s
  notice watcher), and its jobs fail over from there.

The token is an Azure AD access token for management.azure.com (``provider_token_file``); the
endpoint can be set (a local double in the tests, since no cloud is reachable from CI).
"""

import asyncio
import base64
import time
from typing import Any

from ferry.fleet.cloud import CLUSTER_TAG, NODE_TAG, CloudConfig, require
from ferry.fleet.provider import InstanceType, LaunchRefused, NodeState, ProvidedNode, ProviderError
from ferry.fleet.rest import Rest

ENDPOINT = "https://management.azure.com"
API_VERSION = "2024-07-01"
REFUSALS = frozenset({"SkuNotAvailable", "AllocationFailed", "ZonalAllocationFailed",
                      "OverconstrainedAllocationRequest", "OverconstrainedZonalAllocationRequest",
                      "OperationNotAllowed", "QuotaExceeded", "InvalidParameter",
                      "SpotMaxPriceIsLowerThanCurrentPrice"})
STATES: dict[str, NodeState] = {"Creating": "launching", "Updating": "launching", "Succeeded": "running",
                                "Failed": "failed", "Deleting": "terminating", "Canceled": "failed"}


def error_code(doc: Any) -> str:
    err = doc.get("error", {}) if isinstance(doc, dict) else {}
    return str(err.get("code", "")) if isinstance(err, dict) else ""


def zone_parts(zone: str, region: str) -> tuple[str, str]:
    """(location, zone number) of a Ferry zone name: ``eastus-2`` is zone 2 of eastus."""
    location, sep, number = zone.rpartition("-")
    if not sep or not number.isdigit():
        return region or zone, ""
    return region or location, number


def vm_body(config: CloudConfig, node_id: str, offer: InstanceType) -> dict[str, Any]:
    """The virtual machine of one node of ``offer`` (a pure function: the tests read it)."""
    location, number = zone_parts(offer.zone, config.region)
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": offer.name},
        "storageProfile": {"imageReference": {"id": require(config.image, "provider_image", "azure")},
                           "osDisk": {"createOption": "FromImage", "deleteOption": "Delete"}},
        "osProfile": {"computerName": node_id, "adminUsername": "ferry",
                      "linuxConfiguration": {"disablePasswordAuthentication": True}},
        "networkProfile": {"networkApiVersion": "2022-11-01", "networkInterfaceConfigurations": [{
            "name": f"{node_id}-nic", "properties": {"primary": True, "deleteOption": "Delete", "ipConfigurations": [{
                "name": "ipconfig1",
                "properties": {"subnet": {"id": require(config.network, "provider_network", "azure")}}}]}}]},
        "priority": "Spot" if offer.spot else "Regular",
    }
    if offer.spot:
        properties.update(evictionPolicy="Delete", billingProfile={"maxPrice": -1})
    if script := config.boot_script(node_id):
        properties["osProfile"]["customData"] = base64.b64encode(script.encode()).decode()
    body: dict[str, Any] = {"location": location, "tags": config.tags(node_id, offer), "properties": properties}
    if number:
        body["zones"] = [number]
    return body


def provided(vm: dict[str, Any]) -> ProvidedNode:
    props = vm.get("properties", {})
    location = str(vm.get("location", ""))
    zones = vm.get("zones") or []
    return ProvidedNode(id=str(vm.get("tags", {}).get(NODE_TAG, vm.get("name", ""))),
                        instance_type=str(props.get("hardwareProfile", {}).get("vmSize", "")),
                        zone=f"{location}-{zones[0]}" if zones else location, spot=props.get("priority") == "Spot",
                        state=STATES.get(str(props.get("provisioningState", "")), "failed"))


class AzureProvider:
    name = "azure"

    def __init__(self, config: CloudConfig) -> None:
        self.config = config
        subscription = require(config.project, "provider_project", "azure")
        group = require(config.group, "provider_group", "azure")
        self.vms = (f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/"
                    "virtualMachines")
        self.api = Rest(config.endpoint or ENDPOINT, config.token, "Azure", REFUSALS, error_code)
        self.version = {"api-version": API_VERSION}

    async def instance_types(self) -> list[InstanceType]:
        return self.config.offers()

    async def _vm(self, node_id: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self.api.call("GET", f"{self.vms}/{node_id}", self.version,
                                                           missing_ok=True)
        return found

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        self.config.spec(offer)
        await self.api.call("PUT", f"{self.vms}/{node_id}", self.version, body=vm_body(self.config, node_id, offer))
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            vm = await self._vm(node_id)
            if vm is None:
                raise LaunchRefused(f"Azure: {node_id} was gone as it started")
            node = provided(vm)
            if node.state == "running":
                return node
            if node.state == "failed":
                await self.terminate(node_id)
                status = vm.get("properties", {}).get("instanceView", {}).get("statuses", [{}])
                raise LaunchRefused(f"Azure: {node_id} failed to provision: "
                                    f"{status[0].get('message', status[0].get('code', 'no reason given'))}")
            await asyncio.sleep(self.config.poll_s)
        raise ProviderError(f"Azure: {node_id} was not provisioned within {self.config.timeout_s:.0f}s")

    async def terminate(self, node_id: str) -> None:
        await self.api.call("DELETE", f"{self.vms}/{node_id}", self.version, missing_ok=True)
        deadline = time.monotonic() + self.config.timeout_s
        while await self._vm(node_id) is not None:
            if time.monotonic() > deadline:
                raise ProviderError(f"Azure: {node_id} was not deleted within {self.config.timeout_s:.0f}s")
            await asyncio.sleep(self.config.poll_s)

    async def nodes(self) -> list[ProvidedNode]:
        out: list[ProvidedNode] = []
        page: dict[str, Any] | None = await self.api.call("GET", self.vms, self.version)
        while page is not None:
            out += [provided(vm) for vm in page.get("value", [])
                    if vm.get("tags", {}).get(CLUSTER_TAG) == self.config.cluster]
            link = str(page.get("nextLink", ""))
            page = await self.api.call("GET", link.removeprefix(self.api.base)) if link else None
        return out
