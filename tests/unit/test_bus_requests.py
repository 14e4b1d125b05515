"""A KV request (``Table._call``): the first attempt goes straight through; one that goes
unanswered is tried again, up to REQUEST_ATTEMPTS in all, then fails as a BusError."""

import asyncio
from typing import Any, cast

import nats.errors
import pytest

from ferry.common import bus
from ferry.common.bus import REQUEST_ATTEMPTS, BusError, Table
from ferry.common.models import Node


class Entry:
    def __init__(self, value: bytes, revision: int) -> None:
        self.value, self.revision = value, revision


class FlakyKv:
    """A bucket whose first `fails` reads go unanswered (one of them by hanging past the timeout)."""

    def __init__(self, fails: int) -> None:
        self.fails, self.calls = fails, 0

    async def get(self, key: str) -> Entry:
        self.calls += 1
        if self.calls <= self.fails:
            if self.calls == 1:
                await asyncio.sleep(60)  # cut short by the request's timeout
            raise nats.errors.NoRespondersError
        return Entry(Node(id=key).model_dump_json().encode(), 7)


def table(kv: FlakyKv) -> Table[Node]:
    return Table(cast(Any, None), cast(Any, kv), "ferry_nodes", Node)


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus, "REQUEST_TIMEOUT_S", 0.05)
    monkeypatch.setattr(bus, "REQUEST_RETRY_WAIT_S", 0.01)


def test_a_request_answered_at_once_is_made_once() -> None:
    kv = FlakyKv(fails=0)
    node, rev = asyncio.run(table(kv).get_rev("n1")) or (None, 0)
    assert node is not None and node.id == "n1" and rev == 7 and kv.calls == 1


def test_an_unanswered_request_is_tried_again_until_it_is_answered() -> None:
    kv = FlakyKv(fails=REQUEST_ATTEMPTS - 1)  # a timeout, then refusals: the last attempt is answered
    found = asyncio.run(table(kv).get_rev("n1"))
    assert found is not None and found[0].id == "n1" and kv.calls == REQUEST_ATTEMPTS


def test_a_request_never_answered_fails_as_a_bus_error_after_every_attempt() -> None:
    kv = FlakyKv(fails=REQUEST_ATTEMPTS)
    with pytest.raises(BusError, match="cannot read n1 in ferry_nodes"):
        asyncio.run(table(kv).get_rev("n1"))
    assert kv.calls == REQUEST_ATTEMPTS
