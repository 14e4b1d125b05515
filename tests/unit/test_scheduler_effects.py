"""The scheduler's node commands survive a bus that refuses them for a while (a NATS cluster
electing a stream leader again): sent again under the same message id, never dropped."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ferry.common import wire
from ferry.common.bus import BusError
from ferry.common.models import Job
from ferry.scheduler import effects
from ferry.scheduler.effects import Effects


class FlakyBus:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.sent: list[tuple[str, str | None]] = []

    async def publish(self, subject: str, message: Any, *, msg_id: str | None = None) -> None:
        if self.failures:
            self.failures -= 1
            raise BusError("cannot publish: nats: no response from stream")
        self.sent.append((subject, msg_id))


class State:
    def __init__(self, bus: FlakyBus) -> None:
        self.bus = bus


def command() -> wire.NodeCommand:
    return wire.NodeCommand(kind="restore", op="op-1", job=Job(id="j1", name="r3", argv=["true"], node="n1"),
                            incarnation=2, checkpoint="ck-1")


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(effects, "SEND_RETRY_WAIT_S", 0.01)


def test_a_refused_node_command_is_sent_again_with_the_same_id() -> None:
    bus, cmd = FlakyBus(failures=3), command()
    asyncio.run(Effects(State(bus)).send("migrator", cmd))  # type: ignore[arg-type]
    assert bus.sent == [(wire.node_cmd_subject("n1", "migrator"), effects.command_id(cmd))]


def test_a_bus_that_never_takes_it_fails_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(effects, "SEND_RETRY_S", 0.2)
    with pytest.raises(BusError):
        asyncio.run(Effects(State(FlakyBus(failures=10_000))).send("migrator", command()))  # type: ignore[arg-type]


async def test_a_node_only_late_with_its_heartbeat_gets_time_before_a_restore_is_refused() -> None:
    """After a full disk or a bus outage a node may beat late once; a user's restore waits for it
    (at most the heartbeat timeout) instead of failing, and any other reason refuses at once."""
    from ferry.common.config import Settings
    from ferry.common.errors import ConflictError
    from ferry.common.models import Job
    from ferry.scheduler.service import Scheduler

    sched = object.__new__(Scheduler)
    sched.settings = Settings(heartbeat_timeout_s=2.0)
    answers = [(None, "no usable node: node-1: node node-1 has not sent a heartbeat for 6s"), ("node-1", "")]

    async def pick(job: Job, wanted: str | None, exclude: str | None = None) -> tuple[str | None, str]:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    sched.pick_node = pick  # type: ignore[method-assign]
    reread: list[bool] = []

    class State:
        async def reread_nodes(self) -> None:
            reread.append(True)

    sched.state = State()  # type: ignore[assignment]
    job = Job(id="job-1", name="b", argv=["x"])
    assert await sched._target(job, None) == "node-1"
    assert reread, "the scheduler's copy of the nodes was not read again"
    answers[:] = [(None, "no usable node: node-1: node node-1 is draining")]
    with pytest.raises(ConflictError, match="is draining"):
        await sched._target(job, None)
