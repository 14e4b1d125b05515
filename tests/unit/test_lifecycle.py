"""The service lifecycle's bounds: failed messages are redelivered with growing delays up to
MAX_DELIVER and dropped at once when no retry can mend them; background tasks and handlers get the
drain timeout, then are cancelled; a service adds its own flags through a hook."""

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from ferry.common import bus
from ferry.common.bus import MAX_DELIVER, BusError, is_permanent
from ferry.common.config import Settings
from ferry.common.errors import ConfigError, ConflictError, NotFoundError, UsageError
from ferry.common.service import Service
from ferry.common.wire import WireError


@dataclass
class Meta:
    num_delivered: int


@dataclass
class FakeMsg:
    delivered: int
    subject: str = "ferry.cmd.node.n1.migrator"
    naks: list[float] = field(default_factory=list)
    terms: int = 0

    @property
    def metadata(self) -> Meta:
        return Meta(self.delivered)

    async def nak(self, delay: float = 0) -> None:
        self.naks.append(delay)

    async def term(self) -> None:
        self.terms += 1


def settle(exc: Exception, delivered: int) -> FakeMsg:
    msg = FakeMsg(delivered)
    asyncio.run(bus._settle_failed(msg, exc))  # type: ignore[arg-type]
    return msg


def test_temporary_errors_come_back_later_each_time_up_to_the_bound() -> None:
    delays = [settle(BusError("nats down"), n).naks for n in range(1, 8)]
    assert delays == [[0.5], [1.0], [2.0], [4.0], [8.0], [10.0], [10.0]]
    last = settle(RuntimeError("still"), MAX_DELIVER)
    assert last.naks == [] and last.terms == 1


@pytest.mark.parametrize("exc", [UsageError("bad"), NotFoundError("gone"), ConfigError("cfg"), WireError("junk")])
def test_permanent_errors_and_malformed_messages_are_dropped_at_once(exc: Exception) -> None:
    msg = settle(exc, 1)
    assert msg.naks == [] and msg.terms == 1


def test_what_is_permanent() -> None:
    assert is_permanent(NotFoundError("x")) and not is_permanent(ConflictError("busy"))
    assert not is_permanent(BusError("x")) and not is_permanent(OSError("disk"))


class Quick(Service):
    name = "quick"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--flag")

    async def start(self) -> None:
        self.done: list[str] = []

    async def run(self) -> None:
        async def finishes() -> None:
            await asyncio.sleep(0.05)
            self.done.append("finished")

        async def hangs() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.done.append("cancelled")
                raise

        self.spawn(finishes())
        self.spawn(hangs())
        self.stopping.set()

    async def close(self) -> None:
        pass


def test_background_tasks_get_the_drain_timeout_then_are_cancelled() -> None:
    svc = Quick(Settings(drain_timeout_s=0.5))

    async def go() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await svc.serve()
        return loop.time() - t0

    took = asyncio.run(go())
    assert sorted(svc.done) == ["cancelled", "finished"] and not svc.tasks
    assert 0.4 < took < 3


async def hangs(seen: list[str]) -> None:
    """Waits a minute unless cancelled first, which it notes in `seen`."""
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise


def test_handlers_still_running_at_the_drain_are_cancelled() -> None:
    seen: list[str] = []

    async def go() -> None:
        async def quick() -> None:
            seen.append("quick")

        tasks: set[asyncio.Task[Any]] = {asyncio.create_task(hangs(seen)), asyncio.create_task(quick())}
        await bus._finish_handlers(tasks, 0.2, "test")

    asyncio.run(go())
    assert sorted(seen) == ["cancelled", "quick"]


def test_a_service_adds_its_own_flags() -> None:
    parser = argparse.ArgumentParser()
    Quick.add_arguments(parser)
    Service.add_arguments(parser)  # the base adds none
    assert parser.parse_args(["--flag", "x"]).flag == "x"


def test_a_loop_step_that_hangs_is_cut_short_the_drain_timeout_after_a_sigterm() -> None:
    """The autoscaler's step may wait on a cloud API's 30 s timeout: a SIGTERM still ends it within
    the drain timeout, and a step's own error still reaches the loop."""
    svc = Quick(Settings(drain_timeout_s=0.3))
    seen: list[str] = []

    async def fails() -> None:
        raise ConflictError("busy")

    async def go() -> float:
        loop = asyncio.get_running_loop()
        await svc.step_bounded(asyncio.sleep(0.01))  # a step that ends is awaited, nothing more
        with pytest.raises(ConflictError):
            await svc.step_bounded(fails())
        loop.call_later(0.1, svc.stopping.set)
        t0 = loop.time()
        await svc.step_bounded(hangs(seen))
        return loop.time() - t0

    took = asyncio.run(go())
    assert seen == ["cancelled"]
    assert 0.35 < took < 2
