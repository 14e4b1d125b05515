"""A node service's report (``NodeService.report``): published once when NATS takes it; tried again,
with the same message id (JetStream drops a duplicate), until it does; given up only while the
service drains, after the waits reached their longest."""

import asyncio
from typing import Any, cast

import pytest
from pydantic import BaseModel

from ferry.common import wire
from ferry.common.bus import BusError
from ferry.common.config import Settings
from ferry.node import base
from ferry.node.base import NodeService


class Node(NodeService):
    name = "test-node"

    async def run(self) -> None:  # not run here
        raise NotImplementedError


class Bus:
    def __init__(self, fails: int) -> None:
        self.fails, self.sent = fails, []  # type: ignore[var-annotated]

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        self.sent.append((subject, msg_id))
        if len(self.sent) <= self.fails:
            raise BusError("nats: no response from stream")


def node(fails: int) -> tuple[Node, Bus]:
    svc = Node(Settings(node_id="n1"))
    svc.node_id = "n1"
    fake = Bus(fails)
    svc.bus = cast(Any, fake)
    return svc, fake


EVENT = wire.NodeEvent(kind="exited", node="n1", job="job-1", incarnation=1, exit_code=0, id="exit-job-1-1")


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "REPORT_FIRST_WAIT_S", 0.001)


def test_a_report_nats_takes_is_published_once() -> None:
    svc, fake = node(fails=0)
    asyncio.run(svc.report(EVENT))
    assert fake.sent == [(wire.node_event_subject("n1", "exited"), "exit-job-1-1")]


def test_a_report_nats_refuses_is_published_again_with_the_same_id_until_taken() -> None:
    svc, fake = node(fails=3)
    asyncio.run(svc.report(EVENT))
    assert len(fake.sent) == 4 and {msg_id for _, msg_id in fake.sent} == {"exit-job-1-1"}


def test_a_draining_service_gives_up_after_seven_tries() -> None:
    svc, fake = node(fails=100)
    svc.stopping.set()
    with pytest.raises(BusError):
        asyncio.run(svc.report(EVENT))
    assert len(fake.sent) == 7  # as before the first try left tenacity
