"""The checkpointer's job-network loop against a real nats-server: a pass that could not write the
routes is tried again by itself, not only at the next change of a job or node record (in a cluster
the other nodes' heartbeats are such changes; a node alone, or with peers that beat rarely, has few)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ferry.checkpointer.service import JOBNET_RETRY_S, Checkpointer
from ferry.common.bus import Bus
from ferry.common.config import Settings
from ferry.common.mirror import Mirror
from ferry.common.models import Job, JobState, Network, Node
from ferry.policy.netplan import NetState


class FailingNetwork:
    """Stands for ``NodeNetwork``: its first `failures` passes fail as a busy ``ip`` would."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[NetState] = []
        self.applied: NetState | None = None

    def apply(self, state: NetState) -> None:
        self.calls.append(state)
        if len(self.calls) <= self.failures:
            raise OSError("nft -f -: no answer within 30 s")
        self.applied = state


async def test_a_failed_pass_is_tried_again_without_a_change(nats_url: str, tmp_path: Path) -> None:
    bus = await Bus.connect(nats_url, "test-jobnet")
    ck = Checkpointer(Settings(nats_url=nats_url, data_dir=tmp_path, node_id="n1"))
    ck.bus, ck.net_error, ck.waiting, ck.node_id = bus, None, set(), "n1"  # what start() sets
    net = FailingNetwork(failures=2)
    ck.jobnet = net  # type: ignore[assignment]
    await bus.nodes.put("n2", Node(id="n2", net_ip="10.87.5.12"))
    moved = Job.model_validate({"id": "job-w", "name": "w", "argv": ["x"], "network": Network.BRIDGE,
                                "address": "10.88.0.7", "node": "n2", "state": JobState.RUNNING})
    await bus.jobs.put("job-w", moved)
    jobs = Mirror(bus.jobs, live=lambda j: not j.terminal)
    await jobs.start()
    loop = asyncio.create_task(ck.jobnet_loop(jobs))
    try:
        # no record changes after the first pass: the two failures and the success come by themselves
        # (0.5 s, then 1 s later), and then nothing more is written
        deadline = asyncio.get_running_loop().time() + 10
        while net.applied is None:
            assert asyncio.get_running_loop().time() < deadline, f"{len(net.calls)} passes, none succeeded"
            await asyncio.sleep(0.05)
        assert len(net.calls) == 3 and net.applied.routes == {"10.88.0.7": "10.87.5.12"}, net.calls
        await asyncio.sleep(JOBNET_RETRY_S[0] * 4)
        assert len(net.calls) == 3, "a pass that succeeded was repeated with nothing changed"
    finally:
        ck.stopping.set()
        for event in ck.waiting:
            event.set()
        await asyncio.wait_for(loop, 5)
        await jobs.close()
        await bus.close()
