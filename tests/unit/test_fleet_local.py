"""The local provider and `ferry up`'s side of it, through their shared folder (no cluster)."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ferry.cli.upfleet import LocalFleet
from ferry.common.cluster import InstanceTypeSpec, NodeSpec, parse_cluster
from ferry.common.errors import UsageError
from ferry.fleet.local import LocalProvider
from ferry.fleet.provider import InstanceType, LaunchRefused, ProviderError

SMALL = InstanceTypeSpec(name="small", zone="z-a", cpus=2, price_per_hour=0.1, available=1)


async def serve_until(fleet: LocalFleet, running: dict[str, NodeSpec], work: "asyncio.Task[Any]") -> None:
    """`ferry up`'s loop: serves requests until the provider's call ends."""
    def add(spec: NodeSpec) -> None:
        running[spec.id] = spec

    def remove(node: str) -> None:
        running.pop(node)

    while not work.done():
        fleet.serve(running, add, remove)
        await asyncio.sleep(0.05)


async def test_launch_and_terminate_through_the_folder(tmp_path: Path) -> None:
    fleet = LocalFleet(tmp_path / "fleet", [SMALL])
    first = NodeSpec(id="n1", instance_type="small", zone="z-a")
    fleet.start([first])
    running = {"n1": first}
    provider = LocalProvider(tmp_path / "fleet", timeout_s=10)
    assert [t.key for t in await provider.instance_types()] == ["small/z-a/on-demand"]
    assert [(n.id, n.state) for n in await provider.nodes()] == [("n1", "running")]
    # n1 is a small one already and the provider has one: a second is refused, nothing starts
    work = asyncio.create_task(provider.launch("auto-1", InstanceType.of(SMALL)))
    await serve_until(fleet, running, work)
    with pytest.raises(LaunchRefused, match="insufficient capacity: all 1 small/z-a/on-demand"):
        work.result()
    assert set(running) == {"n1"}
    ended = asyncio.create_task(provider.terminate("n1"))
    await serve_until(fleet, running, ended)
    ended.result()
    assert running == {}
    work = asyncio.create_task(provider.launch("auto-1", InstanceType.of(SMALL)))
    await serve_until(fleet, running, work)
    assert work.result().state == "running"
    assert running["auto-1"].cpus == 2 and running["auto-1"].price_per_hour == 0.1
    assert {n.id: n.state for n in await provider.nodes()} == {"n1": "terminated", "auto-1": "running"}


async def test_an_offer_the_provider_does_not_have_is_refused_before_asking(tmp_path: Path) -> None:
    LocalFleet(tmp_path / "fleet", [SMALL]).start([])
    provider = LocalProvider(tmp_path / "fleet", timeout_s=1)
    with pytest.raises(LaunchRefused, match="offers no big/z-a/on-demand"):
        await provider.launch("x", InstanceType(name="big", zone="z-a"))
    with pytest.raises(ProviderError, match="no local fleet"):
        await LocalProvider(tmp_path / "nowhere").instance_types()


def test_the_cluster_file_lists_instance_types_with_clear_errors() -> None:
    spec = parse_cluster("nodes: [{id: n1}]\ninstance_types:\n  - {name: m5.large, memory: 8GiB, available: 2}\n",
                         "c.yaml")
    assert spec.instance_types[0].memory == 8 * 2**30
    assert spec.instance_types[0].node("auto-1").instance_type == "m5.large"
    with pytest.raises(UsageError, match=r"c.yaml: instance_types\[0\].available"):
        parse_cluster("nodes: [{id: n1}]\ninstance_types: [{name: a, available: -1}]\n", "c.yaml")
    with pytest.raises(UsageError, match="appears twice"):
        parse_cluster("nodes: [{id: n1}]\ninstance_types: [{name: a}, {name: a}]\n", "c.yaml")


def test_up_with_a_provider_but_no_instance_types_is_refused_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: [{id: n1}]\n")
    done = subprocess.run([sys.executable, "-m", "ferry.cli.main", "up", "--provider", "local", "--cluster",
                           str(cluster), "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("ferry: --provider local needs a --cluster file that lists instance_types: the "
                                   "kinds of node the provider may launch (see `ferry up --help`)")
    assert not (tmp_path / "d" / "fleet").exists()
