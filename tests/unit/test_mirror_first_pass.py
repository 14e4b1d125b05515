"""A mirror's first pass ends when every record the bucket had is here, not at the watch's
end-of-records marker alone: nats-py can send that marker before the last records arrive
(nats.py #995), and a restarted scheduler then answered "no job" for a job it had not read yet."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import nats.errors
import pytest
from pydantic import BaseModel

from ferry.common import mirror
from ferry.common.bus import Reconnects
from ferry.common.mirror import Mirror


class Rec(BaseModel):
    n: int


class FakeWatcher:
    """What nats-py's KeyWatcher gives the mirror: entries (None: the marker) as they are put."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def updates(self, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None

    async def stop(self) -> None:
        pass


class FakeTable:
    bucket, model = "recs", Rec

    def __init__(self, newest: int) -> None:
        self.newest = newest
        self.watcher = FakeWatcher()
        self.reconnects = Reconnects()

    async def last_revision(self) -> int:
        return self.newest

    async def watch_all(self) -> FakeWatcher:
        return self.watcher


def entry(key: str, n: int, revision: int) -> SimpleNamespace:
    return SimpleNamespace(key=key, value=Rec(n=n).model_dump_json().encode(), revision=revision, operation=None)


async def deliver_late(table: FakeTable, entries: list[SimpleNamespace], delay: float) -> None:
    await asyncio.sleep(delay)
    for e in entries:
        table.watcher.queue.put_nowait(e)


async def test_a_marker_sent_before_the_last_records_does_not_end_the_first_pass() -> None:
    table = FakeTable(newest=3)
    table.watcher.queue.put_nowait(entry("a", 1, 1))
    table.watcher.queue.put_nowait(None)  # early: two records are still on their way
    late = asyncio.create_task(deliver_late(table, [entry("b", 2, 2), entry("c", 3, 3)], 0.2))
    m: Mirror[Rec] = Mirror(cast(Any, table))
    await m.start()
    assert sorted(r.n for r in m.view()) == [1, 2, 3]
    await late
    await m.close()


async def test_a_newest_revision_gone_from_the_stream_ends_the_first_pass_after_a_quiet_grace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror, "END_GRACE_S", 0.3)
    table = FakeTable(newest=9)  # revision 9 was removed (an expired marker, say): it never comes
    for e in (entry("a", 1, 1), entry("b", 2, 2), None):
        table.watcher.queue.put_nowait(e)
    m: Mirror[Rec] = Mirror(cast(Any, table))
    t0 = time.monotonic()
    await m.start()
    assert 0.25 <= time.monotonic() - t0 < 5
    assert sorted(r.n for r in m.view()) == [1, 2]
    await m.close()


async def test_an_empty_bucket_is_synced_at_its_marker() -> None:
    table = FakeTable(newest=0)
    table.watcher.queue.put_nowait(None)
    m: Mirror[Rec] = Mirror(cast(Any, table))
    await asyncio.wait_for(m.start(), 1.0)
    assert m.view() == []
    await m.close()
