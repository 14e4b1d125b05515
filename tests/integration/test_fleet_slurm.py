"""The slurm provider against a real SLURM (munged, slurmctld, slurmds from Debian) with power
saving: two of its three nodes are powered down (State=CLOUD); ResumeProgram starts a node's slurmd,
SuspendProgram stops it. Ferry powers them up and down with scontrol, learns the names SLURM gives
its nodes, and is refused when none is left. Fails, never skips, when SLURM is missing."""

from collections.abc import Iterator

import pytest

from ferry.common.cluster import InstanceTypeSpec
from ferry.common.scontrol import Scontrol
from ferry.fleet.cloud import CloudConfig
from ferry.fleet.provider import InstanceType, LaunchRefused
from ferry.fleet.slurm import SlurmProvider
from tests.slurm import Slurm, require_slurm, start_slurm, stop_slurm

CPU = InstanceTypeSpec(name="cpu", zone="rack-1", cpus=2, price_per_hour=0.1, group="node-[2-3]")


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    require_slurm()
    cluster = start_slurm("127.0.0.1:1", ["node-1", "node-2", "node-3"], powered=["node-2", "node-3"])
    yield cluster
    stop_slurm(cluster)


async def test_ferry_powers_slurm_nodes_up_and_down(slurm: Slurm) -> None:
    provider = SlurmProvider(CloudConfig(types=(CPU,), poll_s=0.3, timeout_s=60), Scontrol(slurm.env))
    offer = InstanceType.of(CPU)
    assert {n.id: n.state for n in await provider.nodes()} == {"node-2": "terminated", "node-3": "terminated"}
    first = await provider.launch("auto-1", offer)
    second = await provider.launch("auto-2", offer)
    # SLURM names the nodes: each launch says which one came up
    assert {first.id, second.id} == {"node-2", "node-3"} and first.state == second.state == "running"
    assert slurm.node(first.id)["State"].startswith("IDLE") and "POWER" not in slurm.node(first.id)["State"]
    with pytest.raises(LaunchRefused, match=r"none of the 2 nodes of node-\[2-3\] is powered down"):
        await provider.launch("auto-3", offer)
    # a job SLURM places there runs: the node is a working SLURM node
    job = slurm.sbatch("-w", first.id, "--wrap", "hostname")
    assert slurm.wait_job(job, {"COMPLETED"}, 60)["NodeList"] == first.id
    await provider.terminate(first.id)
    assert {n.id: n.state for n in await provider.nodes()} == {first.id: "terminated", second.id: "running"}
    assert "POWERED_DOWN" in slurm.node(first.id)["State"]
    log = (slurm.root / "power.log").read_text().splitlines()
    assert log.count(f"suspend {first.id}") == 1 and f"resume {second.id}" in log
