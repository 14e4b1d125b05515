"""Equal nodes take turns at short jobs: each ends before the next is submitted, so every node
holds the same number of jobs at every pick, and the real scheduler gives the next job to the node
it picked longest ago (``ferry.policy.decisions.spread_key``), not to the first by id. Real NATS
and CRIU; the services run in this process."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from ferry.api.service import Api
from ferry.checkpointer.service import Checkpointer
from ferry.common.config import Settings
from ferry.common.ports import free_port
from ferry.common.service import Service
from ferry.scheduler.service import Scheduler
from ferry.v1 import ferry_pb2 as pb
from tests.conftest import make_secrets, serving

pytestmark = [pytest.mark.criu, pytest.mark.timeout(120)]

NODES = ("na", "nb", "nc")


async def test_short_jobs_on_equal_nodes_go_round_the_nodes(nats_url: str, tmp_path: Path, criu_bin: str) -> None:
    make_secrets(tmp_path)
    base = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", heartbeat_interval_s=0.3,
                    heartbeat_timeout_s=5, scratch_dir=str(tmp_path / "scratch"))
    services: list[Service] = [Scheduler(base), Api(base)]
    services += [Checkpointer(base.model_copy(update={"node_id": node})) for node in NODES]
    async with serving(services, base.addr) as stub:
        for _ in range(100):
            nodes = (await stub.ListNodes(pb.ListNodesRequest())).nodes
            if len(nodes) == len(NODES) and all(n.state == "ready" for n in nodes):
                break
            await asyncio.sleep(0.1)
        assert sorted(n.id for n in nodes if n.state == "ready") == list(NODES)
        placed = []
        for i in range(3 * len(NODES)):
            job = await stub.SubmitJob(pb.SubmitJobRequest(name=f"short-{i}", argv=["true"], cwd="/"))
            placed.append(job.node)
            for _ in range(300):  # it ends before the next one is submitted
                if (await stub.GetJob(pb.JobRef(job=f"short-{i}"))).state == "succeeded":
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"short-{i} did not end")
        assert Counter(placed) == {node: 3 for node in NODES}, placed
        assert len(set(placed[:len(NODES)])) == len(NODES), placed  # each node once before any twice
