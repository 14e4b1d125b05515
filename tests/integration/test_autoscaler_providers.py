"""The autoscaler service (real NATS) with providers that are not ``ferry up``'s: it grows the
cluster to ``--min`` through a Kubernetes node group (the double of tests/clouddouble.py) and
records the node under the name Kubernetes gave it, not the one it asked for; and a spot
instance Compute Engine preempts ends its fleet record with a ``node_interrupted`` event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ferry.autoscaler.service import POLICY_KEY, Autoscaler
from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.cluster import InstanceTypeSpec
from ferry.common.config import Settings
from ferry.common.models import AutoscalePolicy, Event, FleetNode
from tests.clouddouble import TOKEN, CloudDouble


@pytest.fixture
async def double() -> AsyncIterator[CloudDouble]:
    cloud = CloudDouble({("n2-standard-4", "us-central1-a"): 2})
    await cloud.start()
    yield cloud
    await cloud.stop()


async def run_autoscaler(settings: Settings, nats_url: str, check: Callable[[list[Event], list[FleetNode]], bool],
                         ) -> tuple[list[Event], list[FleetNode]]:
    service = Autoscaler(settings)
    task = asyncio.create_task(service.serve())
    bus = await Bus.connect(nats_url, "test")
    events: list[Event] = []

    async def on_event(msg: object) -> None:
        events.append(wire.decode(Event, msg.data))  # type: ignore[attr-defined]

    await bus.subscribe("ferry.evt.cluster.>", on_event)
    records: list[FleetNode] = []
    try:
        await asyncio.wait_for(service.ready.wait(), 30)
        await bus.autoscale.put(POLICY_KEY, AutoscalePolicy(min_nodes=1, max_nodes=2, scale_up_after_s=0))

        async def settled() -> bool:
            records[:] = [r for k in await bus.fleet.keys() if (r := await bus.fleet.get(k)) is not None]
            return check(events, records)

        deadline = asyncio.get_running_loop().time() + 30
        while not await settled():
            assert asyncio.get_running_loop().time() < deadline, f"timed out: {events} {records}"
            await asyncio.sleep(0.2)
        return events, records
    finally:
        service.stopping.set()
        await asyncio.wait_for(task, 30)
        await bus.close()


async def test_a_node_group_node_is_recorded_under_the_name_kubernetes_gave_it(
        nats_url: str, tmp_path: Path, double: CloudDouble) -> None:
    (tmp_path / "token").write_text(TOKEN)
    double.node_group("workers")
    spec = InstanceTypeSpec(name="m5.xlarge", zone="us-east-1a", cpus=4, price_per_hour=0.19, group="workers")
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, provider="kubernetes", instance_types=[spec],
                        provider_endpoint=double.url, provider_token_file=tmp_path / "token", autoscale_every_s=0.5)
    events, records = await run_autoscaler(
        settings, nats_url, lambda ev, rec: any(e.kind == "node_launched" for e in ev) and len(rec) == 1)
    assert double.deployments["workers"]["spec"]["replicas"] == 1
    named = [e for e in events if e.kind == "node_named"]
    assert len(named) == 1 and named[0].node.startswith("ip-workers-")
    assert [(r.id, r.state, r.offer) for r in records] == [(named[0].node, "running", spec.key)]


async def test_a_preempted_spot_instance_ends_its_fleet_record(nats_url: str, tmp_path: Path,
                                                                double: CloudDouble) -> None:
    (tmp_path / "token").write_text(TOKEN)
    spec = InstanceTypeSpec(name="n2-standard-4", zone="us-central1-a", spot=True, cpus=4, price_per_hour=0.05)
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, provider="gcp", instance_types=[spec],
                        provider_project="p", provider_image="img", provider_endpoint=double.url,
                        provider_token_file=tmp_path / "token", autoscale_every_s=0.3)

    def preempted_once_up(events: list[Event], records: list[FleetNode]) -> bool:
        if any(e.kind == "node_launched" for e in events) and "auto" in "".join(double.gcp):
            for name in list(double.gcp):
                double.gcp_preempt(name)
        return any(e.kind == "node_interrupted" for e in events)

    events, records = await run_autoscaler(settings, nats_url, preempted_once_up)
    gone = next(e for e in events if e.kind == "node_interrupted")
    assert "preempted by Compute Engine" in gone.message
    assert any(r.id == gone.node and r.state == "terminated" for r in records)
