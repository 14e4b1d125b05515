"""One checkpoint is one trace: API -> scheduler -> checkpointer (CRIU dump, store upload) -> scheduler,
with the context carried in gRPC metadata and NATS headers. Services run in this process so that an
in-memory exporter sees every span; they talk through a real nats-server and dump with real CRIU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc.aio
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ferry.api.service import Api
from ferry.checkpointer.service import Checkpointer
from ferry.common.config import Settings
from ferry.common.ports import free_port
from ferry.common.service import Service
from ferry.common.tracing import setup_tracing
from ferry.scheduler.service import Scheduler
from ferry.v1 import ferry_pb2 as pb
from tests.conftest import async_stub, make_secrets

pytestmark = pytest.mark.criu


async def test_checkpoint_is_one_connected_trace(nats_url: str, tmp_path: Path, criu_bin: str) -> None:
    exporter = InMemorySpanExporter()
    make_secrets(tmp_path)
    base = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", heartbeat_interval_s=0.3,
                    scratch_dir=str(tmp_path / "scratch"))  # not /dev/shm: nothing outlives the test
    setup_tracing("test", base, SimpleSpanProcessor(exporter))
    services: list[Service] = [Scheduler(base), Api(base), Checkpointer(base.model_copy(update={"node_id": "node-t"}))]
    tasks = [asyncio.create_task(s.serve()) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 30)
        async with grpc.aio.insecure_channel(base.addr) as channel:
            stub = async_stub(channel)
            for _ in range(50):  # the node's first heartbeat
                if (await stub.ListNodes(pb.ListNodesRequest())).nodes:
                    break
                await asyncio.sleep(0.1)
            job = await stub.SubmitJob(pb.SubmitJobRequest(name="traced", argv=["sleep", "600"], cwd="/",
                                                           node="node-t"))
            assert job.state == "running"
            exporter.clear()
            updates = [u async for u in stub.Checkpoint(pb.CheckpointRequest(job="traced"))]
            assert updates[-1].done and not updates[-1].error, updates[-1].error
            await stub.KillJob(pb.KillJobRequest(job="traced", grace_s=0))
    finally:
        for s in services:
            s.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    spans = exporter.get_finished_spans()
    api_span = next(s for s in spans if s.name == "api.Checkpoint")
    trace_id = api_span.context.trace_id
    in_trace = {s.name: s for s in spans if s.context.trace_id == trace_id}
    for name in ("api.Checkpoint", "scheduler.checkpoint", "checkpointer.checkpoint", "criu.dump", "store.upload",
                 "scheduler.on_checkpoint_committed"):
        assert name in in_trace, f"{name} is missing from the checkpoint's trace: {sorted(in_trace)}"
    by_id = {s.context.span_id: s for s in in_trace.values()}

    def parent_name(name: str) -> str:
        parent = in_trace[name].parent
        assert parent is not None, f"{name} has no parent"
        return by_id[parent.span_id].name

    assert parent_name("scheduler.checkpoint") == "api.Checkpoint"
    assert parent_name("checkpointer.checkpoint") == "scheduler.checkpoint"
    assert parent_name("criu.dump") == "checkpointer.checkpoint"
    assert parent_name("store.upload") == "checkpointer.checkpoint"
    assert parent_name("scheduler.on_checkpoint_committed") == "checkpointer.checkpoint"
