"""The autoscaler service (real NATS) with providers that are not ``ferry up``'s: it grows the
cluster to ``--min`` through a Kubernetes node group (the double of tests/clouddouble.py) and
records the node under the name Kubernetes gave it, not the one it asked for; and a spot
instance Compute Engine preempts ends its fleet record with a ``node_interrupted`` event; an
autoscaler killed or paused in the middle of a launch launches once and records it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
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


@pytest.mark.parametrize("how", ["killed", "paused"])
async def test_an_autoscaler_killed_or_paused_mid_launch_launches_once_and_records_it(
        nats_url: str, tmp_path: Path, double: CloudDouble, how: str) -> None:
    """The autoscaler process is killed (SIGKILL) or paused (SIGSTOP) while Compute Engine still
    provisions the instance it asked for. Killed: the next autoscaler follows that launch to its
    end instead of writing it off (the instance would run unaccounted for) or launching again.
    Paused: it carries on when continued. Either way, one instance, recorded as running."""
    (tmp_path / "token").write_text(TOKEN)
    spec = InstanceTypeSpec(name="n2-standard-4", zone="us-central1-a", cpus=4, price_per_hour=0.19)
    env = {**os.environ, "FERRY_NATS_URL": nats_url, "FERRY_DATA_DIR": str(tmp_path), "FERRY_PROVIDER": "gcp",
           "FERRY_INSTANCE_TYPES": json.dumps([spec.model_dump()]), "FERRY_PROVIDER_PROJECT": "p",
           "FERRY_PROVIDER_IMAGE": "img", "FERRY_PROVIDER_ENDPOINT": double.url,
           "FERRY_PROVIDER_TOKEN_FILE": str(tmp_path / "token"), "FERRY_AUTOSCALE_EVERY_S": "0.3"}

    def start() -> subprocess.Popen[bytes]:
        with open(tmp_path / "autoscaler.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "ferry.autoscaler"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=log)

    bus = await Bus.connect(nats_url, "test")
    events: list[Event] = []

    async def on_event(msg: object) -> None:
        events.append(wire.decode(Event, msg.data))  # type: ignore[attr-defined]

    async def until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not check():
            log = (tmp_path / "autoscaler.log").read_text(errors="replace")[-2000:]
            assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}: {events}\n{log}"
            await asyncio.sleep(0.1)

    await bus.subscribe("ferry.evt.cluster.>", on_event)
    double.gcp_hold = True
    first = start()
    second: subprocess.Popen[bytes] | None = None
    try:
        await bus.autoscale.put(POLICY_KEY, AutoscalePolicy(min_nodes=1, max_nodes=2, scale_up_after_s=0))
        await until("the launch to be under way", lambda: len(double.gcp) == 1)
        name = next(iter(double.gcp))
        record = await bus.fleet.get(name)
        assert record is not None and record.state == "launching"
        if how == "killed":
            first.kill()
            await asyncio.to_thread(first.wait, 10)
            second = start()
            await asyncio.sleep(2)  # the new one reads the record and follows the launch; nothing more
        else:
            os.kill(first.pid, signal.SIGSTOP)
            await asyncio.sleep(2)
            os.kill(first.pid, signal.SIGCONT)
        assert list(double.gcp) == [name], "a second instance was launched"
        double.gcp_hold = False
        await until("the node's launch to be recorded", lambda: any(e.kind == "node_launched" for e in events))
        record = await bus.fleet.get(name)
        assert record is not None and record.state == "running", record
        await asyncio.sleep(1.5)  # a few more steps: min 1 is met, nothing else is launched
        assert list(double.gcp) == [name]
        assert [e.node for e in events if e.kind == "node_launched"] == [name]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()  # and the double answers its last calls meanwhile (on this loop)
                assert await asyncio.to_thread(proc.wait, 30) == 0, "the autoscaler did not stop cleanly"
        await bus.close()
