"""A node's heartbeat against a real nats-server: the record it writes carries the time it was
written, not the time it was built. The read before the write retries for seconds while a NATS
cluster elects a leader; a beat stamped before that arrived already old, and health read it as
silence (CI, stop 44: a node declared lost 5 s after one of three servers was killed)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from ferry.checkpointer.hold import JobHolds, Lease
from ferry.checkpointer.service import Checkpointer
from ferry.common.bus import Bus
from ferry.common.cluster import NodeSpec
from ferry.common.config import Settings
from ferry.common.models import Node
from ferry.criu.runner import CriuStatus
from ferry.gpu.models import GpuReport
from ferry.node.usage import UsageSampler

SLOW_READ_S = 1.5


class Idle:
    """Stands for the GPU monitor of a node without GPUs."""

    def sample(self) -> GpuReport:
        return GpuReport()


async def test_a_beat_whose_read_was_slow_is_stamped_when_it_is_written(nats_url: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, "test-beat")
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, node_id="n1")
    ck = Checkpointer(settings)
    # what start() sets, without CRIU's check, GPUs or the job network
    ck.bus, ck.node_id, ck.net_error, ck.lazy_pages_problem, ck.notice_deadline = bus, "n1", None, None, None
    ck.criu_status = CriuStatus(ok=True, version="4.2", error=None, lazy_pages=True, mem_dirty_track=False)
    ck.spec, ck.usage, ck.gpu_report = NodeSpec(id="n1", cpus=2, memory=1 << 30), UsageSampler(), GpuReport()
    ck.gpu_monitor = Idle()  # type: ignore[assignment]
    ck.work_dir = settings.node_work_dir().resolve()
    ck.holds = JobHolds(ck.work_dir, Lease(settings.heartbeat_timeout_s, settings.heartbeat_interval_s))
    await bus.nodes.put("n1", Node(id="n1", heartbeat=time.time() - 60))
    read = bus.nodes.get_rev

    async def slow_read(key: str) -> Any:  # as while the bucket's stream has no leader
        await asyncio.sleep(SLOW_READ_S)
        return await read(key)

    bus.nodes.get_rev = slow_read  # type: ignore[method-assign]
    try:
        t0 = time.time()
        await ck.beat({})
        bus.nodes.get_rev = read  # type: ignore[method-assign]
        got = await bus.nodes.get("n1")
        assert got is not None
        assert got.heartbeat >= t0 + SLOW_READ_S, f"stamped {got.heartbeat - t0:.2f} s into a {SLOW_READ_S} s read"
        assert got.heartbeat <= time.time()
    finally:
        await bus.close()
