"""The controller as a Ferry service (ferry.controller.service) on a real nats-server, against the
double of the Kubernetes API: ready, woken by a watch (not its 30 s timer) when a misconfigured
pod appears, its decision published as a cluster event, and drained and closed on stop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.config import Settings
from ferry.common.models import Event
from ferry.controller.service import ControllerService
from ferry.store.local import LocalBackend
from ferry.store.store import CheckpointStore
from tests.kubedouble import KubeDouble
from tests.unit.test_kube_reconcile import make_pod


async def test_the_controller_service_acts_on_a_watched_change_and_drains(nats_url: str, tmp_path: Path) -> None:
    api = KubeDouble()
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, drain_timeout_s=5)
    service = ControllerService(settings, api=api, store=CheckpointStore(LocalBackend(tmp_path / "store")))
    bus = await Bus.connect(nats_url, "test")
    events: list[Event] = []

    async def on_event(msg: object) -> None:
        events.append(wire.decode(Event, msg.data))  # type: ignore[attr-defined]

    await bus.subscribe("ferry.evt.cluster.>", on_event)
    task = asyncio.create_task(service.serve())
    try:
        await asyncio.wait_for(service.ready.wait(), 30)
        await asyncio.sleep(0.5)  # its first pass: nothing to do
        started = time.monotonic()
        api.put("pods", make_pod("late", runtime=None))
        while not api.events:
            assert time.monotonic() - started < 10, "the watch did not wake the controller"
            await asyncio.sleep(0.05)
        assert api.events[0]["reason"] == "FerryRuntimeClassMissing" and api.events[0]["name"] == "late"
        while not events:
            assert time.monotonic() - started < 10, "no cluster event for the decision"
            await asyncio.sleep(0.05)
        assert events[0].kind == "kube_warn" and "FerryRuntimeClassMissing" in events[0].message
    finally:
        service.stopping.set()
        await asyncio.wait_for(task, 4)  # drains and closes at once: nothing waits out the 5 s drain bound
        await bus.close()
    assert task.done() and task.exception() is None
