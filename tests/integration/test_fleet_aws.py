"""The aws provider against a real EC2 endpoint on this machine: moto's server (no cloud is
reachable from CI), through boto3's real HTTP requests. A spot launch runs one tagged instance in
the offer's zone, spot prices come from DescribeSpotPriceHistory, a type EC2 does not have is a
refusal that leaves nothing running, and a termination ends the node asked for and no other."""

import base64
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from ferry.common.cluster import InstanceTypeSpec
from ferry.fleet.aws import AwsProvider
from ferry.fleet.cloud import CloudConfig
from ferry.fleet.provider import InstanceType, LaunchRefused
from tests.s3server import MotoServer

SPOT = InstanceTypeSpec(name="m5.large", zone="us-east-1b", spot=True, cpus=2, price_per_hour=0.03)
ON_DEMAND = InstanceTypeSpec(name="m5.large", zone="us-east-1a", cpus=2, price_per_hour=0.096)
BOGUS = InstanceTypeSpec(name="zz.huge", zone="us-east-1a", cpus=2, price_per_hour=1.0)
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def ec2() -> Iterator[str]:
    server = MotoServer()
    server.start(env={"MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION": "true"})
    yield f"http://{server.endpoint}"
    server.stop()



async def test_ec2_launches_spot_and_on_demand_and_terminates_the_one_asked(
        ec2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDS.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("ec2", region_name="us-east-1", endpoint_url=ec2)
    ami = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    (tmp_path / "boot.sh").write_text("#!/bin/sh\nferry-node --id {node_id}\n")
    aws = AwsProvider(CloudConfig(cluster="c1", types=(SPOT, ON_DEMAND, BOGUS), region="us-east-1", endpoint=ec2,
                                  image=ami, user_data=tmp_path / "boot.sh", poll_s=0.05, timeout_s=20))
    # the spot offer's price is EC2's (moto's history), the on-demand one the configuration's
    prices = {o.key: o.price_per_hour for o in await aws.instance_types()}
    history = client.describe_spot_price_history(InstanceTypes=["m5.large"], ProductDescriptions=["Linux/UNIX"])
    assert prices[SPOT.key] == float(next(p["SpotPrice"] for p in history["SpotPriceHistory"]
                                          if p["AvailabilityZone"] == "us-east-1b"))
    assert prices[ON_DEMAND.key] == 0.096

    spot = await aws.launch("auto-1", InstanceType.of(SPOT))
    plain = await aws.launch("auto-2", InstanceType.of(ON_DEMAND))
    assert (spot.id, spot.state, spot.spot, spot.zone) == ("auto-1", "running", True, "us-east-1b")
    assert (plain.spot, plain.zone) == (False, "us-east-1a")
    described = {next(t["Value"] for t in i["Tags"] if t["Key"] == "ferry-node"): i
                 for r in client.describe_instances()["Reservations"] for i in r["Instances"]}
    assert described["auto-1"]["InstanceLifecycle"] == "spot"
    assert described["auto-1"]["InstanceType"] == "m5.large"
    data = client.describe_instance_attribute(InstanceId=described["auto-1"]["InstanceId"], Attribute="userData")
    assert base64.b64decode(data["UserData"]["Value"]).decode() == "#!/bin/sh\nferry-node --id auto-1\n"

    with pytest.raises(LaunchRefused, match=r"zz\.huge"):
        await aws.launch("auto-3", InstanceType.of(BOGUS))
    assert {n.id for n in await aws.nodes() if n.state == "running"} == {"auto-1", "auto-2"}

    await aws.terminate("auto-1")
    assert {n.id: n.state for n in await aws.nodes()} == {"auto-1": "terminated", "auto-2": "running"}
