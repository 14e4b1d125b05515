"""The ``aws`` provider: EC2 instances through boto3 (the documented RunInstances,
TerminateInstances, DescribeInstances and DescribeSpotPriceHistory calls).

- A launch is one RunInstances of the offer's type in its zone (``Placement.AvailabilityZone``);
  a spot offer asks for a one-time spot instance that terminates when reclaimed
  (``InstanceMarketOptions``). The instance carries the tags ``ferry-cluster``, ``ferry-node`` and
  ``ferry-offer`` and boots with ``provider_user_data``. It is running when DescribeInstances says so.
- EC2's refusals (no capacity in the zone, a spot price or count limit, a quota, an unknown type)
  are ``LaunchRefused``: nothing runs, the autoscaler tries another offer.
- ``nodes()`` lists this cluster's instances by tag; a spot instance EC2 terminated with
  ``Server.SpotInstanceTermination`` is marked interrupted.
- Spot offers take the newest price of DescribeSpotPriceHistory (Linux/UNIX) when EC2 has one.

Credentials come from boto3's own chain (environment, profile, the instance's role); the
endpoint can be set (``provider_endpoint``: a VPC endpoint, or a local double of EC2 such as
moto's server, which the tests use: no cloud is reachable from CI).
"""

import asyncio
import time
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from ferry.fleet.cloud import CLUSTER_TAG, NODE_TAG, CloudConfig, require
from ferry.fleet.provider import InstanceType, LaunchRefused, NodeState, ProvidedNode, ProviderError

# EC2's error codes that mean "not now, not here": the launch is refused, nothing started
REFUSALS = frozenset({
    "InsufficientInstanceCapacity", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow", "Unsupported", "InvalidParameterValue", "InvalidParameterCombination",
    "VcpuLimitExceeded", "InsufficientCapacity", "InvalidAMIID.NotFound", "InvalidAMIID.Malformed",
    "InvalidInstanceType.NotFound",
})
STATES: dict[str, NodeState] = {"pending": "launching", "running": "running", "shutting-down": "terminating",
                                 "stopping": "terminating", "stopped": "terminated", "terminated": "terminated"}
SPOT_RECLAIMED = "Server.SpotInstanceTermination"


def _tag(instance: dict[str, Any], key: str) -> str:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), "")


def provided(instance: dict[str, Any]) -> ProvidedNode:
    """Ferry's view of one DescribeInstances instance."""
    reason = instance.get("StateReason", {})
    market = instance.get("InstanceLifecycle", "")
    return ProvidedNode(id=_tag(instance, NODE_TAG), instance_type=instance.get("InstanceType", ""),
                        zone=instance.get("Placement", {}).get("AvailabilityZone", ""), spot=market == "spot",
                        state=STATES.get(instance.get("State", {}).get("Name", ""), "failed"),
                        reason=reason.get("Message", ""), interrupted=reason.get("Code") == SPOT_RECLAIMED)


def run_request(config: CloudConfig, node_id: str, offer: InstanceType) -> dict[str, Any]:
    """RunInstances' parameters for one node of ``offer`` (a pure function: the tests read it)."""
    tags = [{"Key": k, "Value": v} for k, v in config.tags(node_id, offer).items()]
    request: dict[str, Any] = {
        "ImageId": require(config.image, "provider_image", "aws"),
        "InstanceType": offer.name, "MinCount": 1, "MaxCount": 1,
        "Placement": {"AvailabilityZone": offer.zone},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        "ClientToken": f"{config.cluster}-{node_id}",  # a retried call launches no second instance
    }
    if offer.spot:
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    if config.network:
        request["SubnetId"] = config.network
    if script := config.boot_script(node_id):
        request["UserData"] = script  # boto3 encodes it (base64), as RunInstances wants
    return request


class AwsProvider:
    name = "aws"

    def __init__(self, config: CloudConfig) -> None:
        self.config = config
        self.client = boto3.client(
            "ec2", region_name=require(config.region, "provider_region", "aws"),
            endpoint_url=config.endpoint or None,
            config=Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=10, read_timeout=30))

    async def _call(self, what: str, **params: Any) -> dict[str, Any]:
        try:
            out: dict[str, Any] = await asyncio.to_thread(getattr(self.client, what), **params)
            return out
        except ClientError as exc:
            err = exc.response.get("Error", {})
            message = f"EC2 {what}: {err.get('Code', '?')}: {err.get('Message', '')}"
            raise (LaunchRefused if err.get("Code") in REFUSALS else ProviderError)(message) from exc
        except BotoCoreError as exc:
            raise ProviderError(f"EC2 {what}: {exc}") from exc

    async def instance_types(self) -> list[InstanceType]:
        offers = self.config.offers()
        spot = [o for o in offers if o.spot]
        if not spot:
            return offers
        history = await self._call("describe_spot_price_history", StartTime=time.time() - 3600,
                                   InstanceTypes=sorted({o.name for o in spot}),
                                   ProductDescriptions=["Linux/UNIX"])
        newest: dict[tuple[str, str], tuple[Any, float]] = {}
        for p in history.get("SpotPriceHistory", []):
            key = (p["InstanceType"], p["AvailabilityZone"])
            if key not in newest or p["Timestamp"] > newest[key][0]:
                newest[key] = (p["Timestamp"], float(p["SpotPrice"]))
        return [o.model_copy(update={"price_per_hour": newest[(o.name, o.zone)][1]})
                if o.spot and (o.name, o.zone) in newest else o for o in offers]

    async def _find(self, node_id: str = "") -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.config.cluster]}]
        if node_id:
            filters.append({"Name": f"tag:{NODE_TAG}", "Values": [node_id]})
        out = await self._call("describe_instances", Filters=filters)
        return [i for r in out.get("Reservations", []) for i in r.get("Instances", [])]

    async def _until(self, node_id: str, done: set[str]) -> ProvidedNode:
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            found = [provided(i) for i in await self._find(node_id)]
            live = [n for n in found if n.state != "terminated"] or found
            if live and live[0].state in done:
                return live[0]
            if not live and "terminated" in done:
                return ProvidedNode(id=node_id, instance_type="", zone="", spot=False, state="terminated")
            await asyncio.sleep(self.config.poll_s)
        raise ProviderError(f"EC2: node {node_id} was not {' or '.join(sorted(done))} within "
                            f"{self.config.timeout_s:.0f}s")

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        self.config.spec(offer)
        await self._call("run_instances", **run_request(self.config, node_id, offer))
        node = await self._until(node_id, {"running", "terminated"})
        if node.state != "running":
            raise LaunchRefused(f"EC2 ended {node_id} as it started: {node.reason or 'no reason given'}")
        return node

    async def terminate(self, node_id: str) -> None:
        ids = [i["InstanceId"] for i in await self._find(node_id) if STATES.get(i["State"]["Name"]) != "terminated"]
        if ids:
            await self._call("terminate_instances", InstanceIds=ids)
        await self._until(node_id, {"terminated"})

    async def nodes(self) -> list[ProvidedNode]:
        return [n for n in map(provided, await self._find()) if n.id]
