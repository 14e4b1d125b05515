"""A restore onto mismatched GPUs is refused before anything is fetched or touched: the migrator
compares the checkpoint's GPUs (model, count, driver) with the GPUs assigned on its node."""

import asyncio
from pathlib import Path

from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.config import Settings
from ferry.common.models import Job, Node
from ferry.gpu.models import GpuInfo, GpuSnapshot
from ferry.migrator.service import Migrator
from ferry.store.url import open_store
from tests.conftest import make_secrets

A100 = GpuInfo(index=0, uuid="GPU-a100-0", model="NVIDIA A100-SXM4-40GB", memory_total=40 << 30)


async def test_mismatched_gpus_refuse_the_restore_untouched(nats_url: str, tmp_path: Path) -> None:
    make_secrets(tmp_path)
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, node_id="gpu-b", heartbeat_interval_s=0.3,
                        scratch_dir=str(tmp_path / "scratch"))  # not /dev/shm: nothing outlives the test
    store = open_store(settings.resolved_store_url(), settings.resolved_store_key_file())
    images = tmp_path / "images"
    images.mkdir()
    (images / "core-1.img").write_bytes(b"x" * 4096)
    snapshot = GpuSnapshot(model="NVIDIA H100 80GB HBM3", count=2, driver_version="570.86.10", uuids=["a", "b"])
    await asyncio.to_thread(store.write_checkpoint, job="job-g", checkpoint="ck-g", parent=None, src_dir=images,
                            meta={"gpu": snapshot.model_dump()})
    migrator = Migrator(settings)
    task = asyncio.create_task(migrator.serve())
    bus = await Bus.connect(nats_url, "test")
    events: asyncio.Queue[wire.NodeEvent] = asyncio.Queue()

    async def on_event(msg: object) -> None:
        await events.put(wire.decode(wire.NodeEvent, msg.data))  # type: ignore[attr-defined]

    try:
        await asyncio.wait_for(migrator.ready.wait(), 30)
        await bus.nodes.put("gpu-b", Node(id="gpu-b", criu_ok=True, gpus=1, gpu_list=[A100.model_dump()],
                                          gpu_driver="570.86.10"))
        await bus.subscribe(wire.node_event_subject("gpu-b", "restore_failed"), on_event)
        job = Job(id="job-g", name="g", argv=["x"], node="gpu-b", gpus=2, gpu_uuids=[A100.uuid], incarnation=2)
        await bus.publish(wire.node_cmd_subject("gpu-b", "migrator"),
                          wire.NodeCommand(kind="restore", op="op-g", job=job, incarnation=2, checkpoint="ck-g"))
        event = await asyncio.wait_for(events.get(), 30)
        assert event.kind == "restore_failed" and event.job == "job-g"
        assert event.error is not None
        assert "GPU model differs" in event.error and "fewer GPUs" in event.error
        work = settings.node_work_dir()
        assert not (work / "jobs" / "job-g").exists(), "nothing may be touched before the refusal"
        assert not any(migrator.scratch_dir.glob("restore-job-g-*")), "nothing may be fetched before the refusal"
    finally:
        await bus.close()
        migrator.stopping.set()
        await task
