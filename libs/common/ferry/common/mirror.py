"""A local copy of one KV bucket, kept current by a watch: what the scheduler decides from.

The watch (a JetStream ordered consumer over the bucket, ``KeyValue.watchall``) delivers every
record once, then every write and delete as it happens. The owner of records (the scheduler for
jobs) writes through (``note``) so that its next decision sees its own last write at once; the
revision orders a written-through record and the watch's copy of the same write. When the
connection to NATS comes back, the watch starts again from the top (its consumer may have gone
with a restarted server, and then it would deliver nothing); as a safety net against a watch that
silently stopped otherwise, the whole bucket is read again every ``resync_s`` the watch is quiet.

Readers get copies: a caller that changes a record changes only its copy until it writes it.
"""

import asyncio
import contextlib
import logging
from typing import Any, Generic

import nats.errors
from nats.js.kv import KeyValue

from ferry.common import wire
from ferry.common.bus import BusError, M, Table

log = logging.getLogger(__name__)

RESYNC_S = 30.0
_DELETES = ("DEL", "PURGE")


class _Reconnected(Exception):
    pass


class Mirror(Generic[M]):
    def __init__(self, table: Table[M], *, resync_s: float = RESYNC_S, changed: asyncio.Event | None = None) -> None:
        self.table = table
        self.resync_s = resync_s
        self._records: dict[str, tuple[int, M]] = {}
        self._noted: set[str] = set()  # keys written since the last resync began
        self._task: asyncio.Task[None] | None = None
        self.synced = asyncio.Event()  # every record has been read at least once
        self.changed = changed or asyncio.Event()  # set on each change the watch delivers (the reader clears it)
        self._listeners: list[asyncio.Event] = []

    async def start(self) -> None:
        """Reads the bucket and starts following it; returns once every record is here."""
        self._task = asyncio.create_task(self._follow())
        waiter = asyncio.create_task(self.synced.wait())
        done, _ = await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            waiter.cancel()
            self._task.result()  # raises what stopped it
            raise BusError(f"the watch of {self.table.bucket} ended before it read the bucket")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def listen(self) -> asyncio.Event:
        """One more event set on each change, for one more reader of the same mirror (each clears its own)."""
        event = asyncio.Event()
        self._listeners.append(event)
        return event

    def _changed(self) -> None:
        self.changed.set()
        for event in self._listeners:
            event.set()

    # ---- reading -------------------------------------------------------------------------------

    def values(self) -> list[M]:
        return [record.model_copy(deep=True) for _, (_, record) in sorted(self._records.items())]

    def get(self, key: str) -> M | None:
        found = self._records.get(key)
        return found[1].model_copy(deep=True) if found else None

    # ---- writing -------------------------------------------------------------------------------

    def note(self, key: str, record: M, revision: int) -> None:
        """A write of the owner's (or a watched one): kept unless a later one is here already."""
        current = self._records.get(key)
        self._noted.add(key)
        if current is None or revision >= current[0]:
            self._records[key] = (revision, record.model_copy(deep=True))

    def forget(self, key: str, revision: int) -> None:
        current = self._records.get(key)
        if current is not None and revision >= current[0]:
            del self._records[key]

    # ---- following -----------------------------------------------------------------------------

    async def _follow(self) -> None:
        while True:
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except (BusError, nats.errors.Error, OSError) as exc:  # the bus is away: read it all again
                log.warning("the watch of %s stopped (%s); starting it again", self.table.bucket, exc)
                await asyncio.sleep(1.0)

    async def _watch(self) -> None:
        reconnected = asyncio.Event()
        self.table.reconnects.listen(reconnected)
        watcher = await self.table.watch_all()
        try:
            initial: set[str] = set()  # what this watch delivered before its end-of-records marker
            first_pass = True
            while True:
                try:
                    entry = await self._next(watcher, reconnected)
                except nats.errors.TimeoutError:
                    await self.resync()
                    continue
                except _Reconnected:  # the watch's consumer may be gone with the server: a new watch
                    log.info("NATS came back: watching %s again", self.table.bucket)
                    return
                if entry is None:  # every record has been delivered once
                    if first_pass:
                        for key in set(self._records) - initial:
                            self._records.pop(key, None)  # deleted while nobody watched
                        first_pass = False
                    self.synced.set()
                    continue
                if entry.operation in _DELETES or entry.value is None:
                    self.forget(entry.key, entry.revision or 0)
                    self._changed()
                    continue
                try:
                    record = wire.decode(self.table.model, entry.value)
                except wire.WireError as exc:
                    log.warning("ignoring %s in %s: %s", entry.key, self.table.bucket, exc)
                    continue
                if first_pass:
                    initial.add(entry.key)
                self.note(entry.key, record, entry.revision or 0)
                self._changed()
        finally:
            self.table.reconnects.forget(reconnected)
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _next(self, watcher: KeyValue.KeyWatcher, reconnected: asyncio.Event) -> Any:
        """The watch's next entry; nats' TimeoutError after ``resync_s``; _Reconnected when the
        connection came back meanwhile."""
        update = asyncio.ensure_future(watcher.updates(timeout=self.resync_s))  # type: ignore[no-untyped-call]
        came_back = asyncio.ensure_future(reconnected.wait())
        try:
            await asyncio.wait({update, came_back}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            came_back.cancel()
        if update.done():
            return update.result()
        update.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await update
        raise _Reconnected

    async def resync(self) -> None:
        """Reads every record again (the watch was quiet for ``resync_s``)."""
        self._noted.clear()
        keys = await self.table.keys()
        found = await asyncio.gather(*(self.table.get_rev(k) for k in keys))
        present = set()
        for key, got in zip(keys, found, strict=True):
            if got is not None:
                present.add(key)
                self.note(key, got[0], got[1])
        for key in set(self._records) - present - self._noted:
            self._records.pop(key, None)
