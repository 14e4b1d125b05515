"""The gcp, azure and kubernetes providers against local doubles of their APIs over HTTP
(tests/clouddouble.py): the requests they make have the documented shapes, a launch runs a node,
a refusal leaves nothing behind, a preempted node is seen as interrupted, a termination ends the
node asked for and no other, and bad configuration is a clear error."""

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferry.common.cluster import InstanceTypeSpec
from ferry.common.config import load_settings
from ferry.common.errors import ConfigError
from ferry.fleet.azure import AzureProvider
from ferry.fleet.cloud import CloudConfig
from ferry.fleet.gcp import GcpProvider, provided
from ferry.fleet.kube import KubeProvider
from ferry.fleet.provider import InstanceType, LaunchRefused, ProviderError
from ferry.fleet.providers import make_provider
from tests.clouddouble import TOKEN, CloudDouble

GCP_TYPES = (InstanceTypeSpec(name="n2-standard-4", zone="us-central1-a", spot=True, cpus=4, price_per_hour=0.05),
             InstanceTypeSpec(name="n2-standard-4", zone="us-central1-b", cpus=4, price_per_hour=0.19))
AZ_TYPES = (InstanceTypeSpec(name="Standard_D4s_v5", zone="eastus-1", spot=True, cpus=4, price_per_hour=0.04),
            InstanceTypeSpec(name="Standard_D4s_v5", zone="eastus-2", cpus=4, price_per_hour=0.19))



@pytest.fixture
async def double() -> AsyncIterator[CloudDouble]:
    cloud = CloudDouble({("n2-standard-4", "us-central1-a"): 1, ("n2-standard-4", "us-central1-b"): 0,
                         ("Standard_D4s_v5", "eastus-1"): 1, ("Standard_D4s_v5", "eastus-2"): 0})
    await cloud.start()
    yield cloud
    await cloud.stop()


def config(tmp_path: Path, double: CloudDouble, types: tuple[InstanceTypeSpec, ...]) -> CloudConfig:
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "boot.sh").write_text("#!/bin/sh\nferry-node --id {node_id}\n")
    return CloudConfig(cluster="c1", types=types, project="proj", group="rg", endpoint=double.url, image="img-1",
                       network="/subnets/s1", user_data=tmp_path / "boot.sh", token_file=tmp_path / "token",
                       poll_s=0.01, timeout_s=5)


async def test_gcp_launches_a_spot_instance_and_sees_it_preempted(tmp_path: Path, double: CloudDouble) -> None:
    gcp = GcpProvider(config(tmp_path, double, GCP_TYPES))
    node = await gcp.launch("auto-1", InstanceType.of(GCP_TYPES[0]))
    assert (node.id, node.state, node.spot, node.zone) == ("auto-1", "running", True, "us-central1-a")
    method, path, body = double.requests[0]
    assert (method, path) == ("POST", "/compute/v1/projects/proj/zones/us-central1-a/instances")
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n2-standard-4"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["labels"] == {"ferry-cluster": "c1", "ferry-node": "auto-1",
                              "ferry-offer": "n2-standard-4_us-central1-a_spot"}
    assert body["metadata"]["items"] == [{"key": "startup-script", "value": "#!/bin/sh\nferry-node --id auto-1\n"}]
    assert [(n.id, n.state, n.interrupted) for n in await gcp.nodes()] == [("auto-1", "running", False)]
    double.gcp_preempt("auto-1")
    assert [(n.id, n.state, n.interrupted) for n in await gcp.nodes()] == [("auto-1", "terminated", True)]
    # listed still (its deletion under way) while its preemption's operation is already there
    still = provided({"name": "auto-2", "status": "STOPPING", "labels": {"ferry-node": "auto-2"}}, {"auto-2"})
    assert (still.interrupted, still.reason) == (True, "preempted by Compute Engine")
    told = provided({"name": "auto-3", "status": "STOPPING", "statusMessage": "Instance was preempted."}, {"auto-3"})
    assert told.reason == "Instance was preempted."
    assert provided({"name": "auto-4", "status": "RUNNING"}, set()).reason == ""


async def test_gcp_refusals_leave_nothing_and_termination_deletes(tmp_path: Path, double: CloudDouble) -> None:
    gcp = GcpProvider(config(tmp_path, double, GCP_TYPES))
    with pytest.raises(LaunchRefused, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await gcp.launch("auto-2", InstanceType.of(GCP_TYPES[1]))
    asked = len(double.requests)
    with pytest.raises(LaunchRefused, match="offers no e2-micro/us-central1-a/on-demand"):
        await gcp.launch("auto-3", InstanceType(name="e2-micro", zone="us-central1-a"))
    assert len(double.requests) == asked  # refused before asking
    assert double.gcp == {}
    await gcp.launch("auto-4", InstanceType.of(GCP_TYPES[0]))
    await gcp.terminate("auto-4")
    assert double.gcp == {} and await gcp.nodes() == []
    (tmp_path / "token").write_text("expired")
    with pytest.raises(ProviderError, match="401"):
        await gcp.nodes()


async def test_azure_launches_spot_vms_and_refuses_what_azure_cannot_place(tmp_path: Path,
                                                                           double: CloudDouble) -> None:
    azure = AzureProvider(config(tmp_path, double, AZ_TYPES))
    node = await azure.launch("auto-1", InstanceType.of(AZ_TYPES[0]))
    assert (node.id, node.state, node.spot, node.zone) == ("auto-1", "running", True, "eastus-1")
    method, path, body = double.requests[0]
    assert (method, path) == ("PUT", "/subscriptions/proj/resourceGroups/rg/providers/Microsoft.Compute/"
                                     "virtualMachines/auto-1")
    props = body["properties"]
    assert (body["location"], body["zones"], props["priority"], props["evictionPolicy"]) == (
        "eastus", ["1"], "Spot", "Delete")
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == "#!/bin/sh\nferry-node --id auto-1\n"
    # no capacity left in zone 2: the VM fails to provision, is deleted, the launch is refused
    with pytest.raises(LaunchRefused, match="Allocation failed"):
        await azure.launch("auto-2", InstanceType.of(AZ_TYPES[1]))
    assert set(double.azure) == {"auto-1"}
    other = AZ_TYPES[0].model_copy(update={"zone": "westus-1"})
    with pytest.raises(LaunchRefused, match="SkuNotAvailable"):
        await AzureProvider(config(tmp_path, double, (other,))).launch("auto-3", InstanceType.of(other))
    assert [(n.id, n.state) for n in await azure.nodes()] == [("auto-1", "running")]
    await azure.terminate("auto-1")
    assert double.azure == {} and await azure.nodes() == []


async def test_kubernetes_scales_a_node_group_and_removes_the_node_asked_for(tmp_path: Path,
                                                                             double: CloudDouble) -> None:
    spec = InstanceTypeSpec(name="m5.xlarge", zone="us-east-1a", cpus=4, price_per_hour=0.19, group="workers")
    double.node_group("workers", replicas=1)
    kube = KubeProvider(config(tmp_path, double, (spec,)))
    first = await kube.launch("auto-1", InstanceType.of(spec))
    second = await kube.launch("auto-2", InstanceType.of(spec))
    # Kubernetes names its nodes: the launch says which name the node joins under
    assert first.id.startswith("ip-workers-") and second.id != first.id and first.state == "running"
    assert double.deployments["workers"]["spec"]["replicas"] == 3
    assert len(await kube.nodes()) == 3
    await kube.terminate(first.id)
    assert double.deployments["workers"]["spec"]["replicas"] == 2
    assert first.id not in {n.id for n in await kube.nodes()} and second.id in {n.id for n in await kube.nodes()}
    double.failing.add("workers")
    with pytest.raises(LaunchRefused, match="InsufficientInstanceCapacity"):
        await kube.launch("auto-3", InstanceType.of(spec))
    assert double.deployments["workers"]["spec"]["replicas"] == 2 and len(double.machines) == 2


def test_the_settings_choose_a_provider_with_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_INSTANCE_TYPES", '[{"name": "n2-standard-4", "zone": "us-central1-a", "spot": true}]')
    gcp = make_provider(load_settings(provider="gcp", provider_project="p"))
    assert isinstance(gcp, GcpProvider) and gcp.config.types[0].spot
    with pytest.raises(ProviderError, match="needs provider_project"):
        make_provider(load_settings(provider="gcp"))
    with pytest.raises(ProviderError, match="needs provider_group"):
        make_provider(load_settings(provider="azure", provider_project="sub"))
    monkeypatch.delenv("FERRY_INSTANCE_TYPES")
    with pytest.raises(ConfigError, match="launches only the instance_types"):
        make_provider(load_settings(provider="aws"))
    with pytest.raises(ConfigError, match="invalid setting provider"):
        load_settings(provider="openstack")
    assert make_provider(load_settings()) is None
