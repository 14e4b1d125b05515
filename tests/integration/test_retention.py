"""The retention policy: with FERRY_KEEP_CHECKPOINTS=2 only a job's two newest checkpoints stay,
in the store and in `ferry checkpoints`, and chunks no kept checkpoint uses are collected."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ferry.api.service import Api
from ferry.checkpointer.service import Checkpointer
from ferry.common.config import Settings
from ferry.common.ports import free_port
from ferry.common.service import Service
from ferry.scheduler.service import Scheduler
from ferry.store.store import CheckpointStore
from ferry.store.url import open_store
from ferry.v1 import ferry_pb2 as pb
from tests.conftest import PY, make_secrets, serving

pytestmark = pytest.mark.criu

# rewrites a different quarter of its 16 MiB with fresh random bytes every 0.1 s, and prints how many
# quarters it rewrote: each checkpoint has chunks of its own
CHURN = ("import os, time\nbuf = bytearray(16 << 20)\ni = 0\nwhile True:\n"
         "    o = (i % 4) << 22\n    buf[o:o + (4 << 20)] = os.urandom(4 << 20)\n"
         "    i += 1\n    print(i, flush=True)\n    time.sleep(0.1)\n")
# After a checkpoint, the quarter being written while it froze is finished, then all four are rewritten
# whole: only then is nothing of the last checkpoint's own chunks still in memory. Waiting on that, not
# on a clock, keeps the test's pack counts the same on a loaded machine, where the loop runs slower.
FULL_TURN = 5


async def rewritten(stub: Any) -> int:
    """How many quarters the churning job has rewritten: the last line of its output, read with `ferry logs`'s call."""
    out = b"".join([c.data async for c in stub.ReadLogs(pb.ReadLogsRequest(job="churn"))])
    lines = out.split()
    return int(lines[-1]) if lines else 0


async def wait_rewritten(stub: Any, at_least: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (done := await rewritten(stub)) < at_least:
        assert time.monotonic() < deadline, f"the churning job rewrote {done} quarters, not {at_least}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def one_node(nats_url: str, tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Any, CheckpointStore]]:
    """A scheduler, the API and node n1's checkpointer in this process; yields the API's stub, once
    n1 has joined, and the store."""
    make_secrets(tmp_path)
    base = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", heartbeat_interval_s=0.3,
                    scratch_dir=str(tmp_path / "scratch"), **settings)
    services: list[Service] = [Scheduler(base), Api(base), Checkpointer(base.model_copy(update={"node_id": "n1"}))]
    async with serving(services, base.addr) as stub:
        for _ in range(50):
            if (await stub.ListNodes(pb.ListNodesRequest())).nodes:
                break
            await asyncio.sleep(0.1)
        yield stub, open_store(base.resolved_store_url(), base.resolved_store_key_file())


async def test_only_the_newest_checkpoints_stay(nats_url: str, tmp_path: Path, criu_bin: str) -> None:
    async with one_node(nats_url, tmp_path, keep_checkpoints=2) as (stub, store):
        job = await stub.SubmitJob(pb.SubmitJobRequest(name="churn", argv=[PY, "-c", CHURN], cwd="/", node="n1"))
        taken = []
        chunks_after = []
        for _ in range(4):
            await wait_rewritten(stub, await rewritten(stub) + FULL_TURN)
            updates = [u async for u in stub.Checkpoint(pb.CheckpointRequest(job="churn"))]
            assert not updates[-1].error, updates[-1].error
            taken.append(updates[-1].checkpoint.id)
            chunks_after.append(sum(1 for _ in store.backend.list("packs/")))
        listed = [c.id for c in (await stub.ListCheckpoints(pb.JobRef(job="churn"))).checkpoints]
        assert listed == taken[-2:]
        assert sorted(store.list_checkpoints(job.id)) == sorted(taken[-2:])
        assert (await stub.GetJob(pb.JobRef(job="churn"))).last_checkpoint == taken[-1]
        # from the third checkpoint on, collection keeps the pack count from growing without bound
        assert chunks_after[3] < chunks_after[1] + (chunks_after[1] - chunks_after[0]) * 2
        referenced = set().union(*(store.read_manifest(job.id, c).packs() for c in taken[-2:]))
        assert {k.removeprefix("packs/") for k in store.backend.list("packs/")} == referenced
        assert list(store.backend.list("chunks/")) == []  # every chunk in a pack
        await stub.KillJob(pb.KillJobRequest(job="churn", grace_s=0))


async def test_the_checkpoints_of_an_ended_job_expire_and_a_parked_jobs_stay(nats_url: str, tmp_path: Path,
                                                                             criu_bin: str) -> None:
    count = [PY, "-c", "import time, itertools\nfor i in itertools.count():\n    print(i, flush=True)\n"
                       "    time.sleep(0.1)\n"]
    async with one_node(nats_url, tmp_path, keep_ended_s=2.0) as (stub, store):
        ended = await stub.SubmitJob(pb.SubmitJobRequest(name="ended", argv=count, cwd="/", node="n1"))
        parked = await stub.SubmitJob(pb.SubmitJobRequest(name="parked", argv=count, cwd="/", node="n1"))
        for name, stop in (("ended", False), ("ended", False), ("parked", True)):
            updates = [u async for u in stub.Checkpoint(pb.CheckpointRequest(job=name, stop=stop))]
            assert not updates[-1].error, updates[-1].error
        assert len(store.list_checkpoints(ended.id)) == 2
        await stub.KillJob(pb.KillJobRequest(job="ended", grace_s=0))
        for _ in range(100):  # 2 s after it ended, then the node's delete and the scheduler's write
            job = await stub.GetJob(pb.JobRef(job="ended"))
            if not job.last_checkpoint:
                break
            await asyncio.sleep(0.1)
        assert job.state == "killed" and not job.last_checkpoint and job.checkpoints == 0
        assert store.list_checkpoints(ended.id) == []
        assert not (await stub.ListCheckpoints(pb.JobRef(job="ended"))).checkpoints
        # a parked job has not ended: it may be restored any time
        assert len(store.list_checkpoints(parked.id)) == 1
        assert (await stub.GetJob(pb.JobRef(job="parked"))).last_checkpoint
        # nothing of the ended job's is left in the store: its chunks went too
        kept = store.read_manifest(parked.id, store.list_checkpoints(parked.id)[0]).packs()
        assert {k.removeprefix("packs/") for k in store.backend.list("packs/")} == kept
