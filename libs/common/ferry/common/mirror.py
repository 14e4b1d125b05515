"""A local copy of one KV bucket, kept current by a watch: what the scheduler decides from.

The watch (a JetStream ordered consumer over the bucket, ``KeyValue.watchall``) delivers every
record once, then every write and delete as it happens. The owner of records (the scheduler for
jobs) writes through (``note``) so that its next decision sees its own last write at once; the
revision orders a written-through record and the watch's copy of the same write. When the
connection to NATS comes back, the watch starts again from the top (its consumer may have gone
with a restarted server, and then it would deliver nothing); as a safety net against a watch that
silently stopped otherwise, every ``resync_s`` the watch is quiet the mirror asks the bucket for
its newest revision, and reads the whole bucket again only when that is not the newest it has seen
(a write or delete it missed, or a server that lost writes). Reading every record each time, as it
did, made an idle cluster's CPU grow with its history: every service's job mirror read each job
that ever ran every 30 s.

Readers get copies (``values``, ``get``): a caller that changes a record changes only its copy
until it writes it. Readers that only read get the records themselves (``peek``, ``view``,
``live``, ``find``), which costs nothing per record: deep copies of every job made each of the
scheduler's decisions cost more the longer the cluster ran (600 ms at 10,000 jobs). Two indexes
keep the common questions from walking every record: ``live`` (the records a predicate selects,
such as the jobs that have not ended) and ``find`` (by a field that is unique, such as a job's
name). ``caught_up`` waits until the copy holds every write the bucket had when it was called,
for a reader that must see what another service has just written.

The watch's end-of-records marker is not trusted alone: nats-py sends it when a consumer's count
of pending messages reads 0, which happens while the server's last messages are still on their
way to the client (at the watch's setup, or when that count dips to 0 under concurrent writes;
nats.py #995). A restarted scheduler then began with too few jobs and answered "no job" for a
job it had not read yet. The first pass therefore also waits for the bucket's newest revision
as it was before the watch began (or, if that one is gone from the stream, for a quiet
``END_GRACE_S``).
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic

import nats.errors
from nats.js.kv import KeyValue

from ferry.common import wire
from ferry.common.bus import BusError, M, Table
from ferry.common.record import clone

log = logging.getLogger(__name__)

RESYNC_S = 30.0
CLOSE_RETRY_S = 0.5  # how long ``close`` waits for the watch to end before it cancels it again
END_GRACE_S = 2.0  # after the marker, how long to wait for the revision it should have come after
_DELETES = ("DEL", "PURGE")


class _Reconnected(Exception):
    pass


class Mirror(Generic[M]):
    def __init__(self, table: Table[M], *, resync_s: float = RESYNC_S, changed: asyncio.Event | None = None,
                 live: Callable[[M], bool] | None = None, unique: Callable[[M], str] | None = None,
                 tokens: Callable[[M], Iterable[str]] | None = None) -> None:
        self.table = table
        self.resync_s = resync_s
        self._records: dict[str, tuple[int, M]] = {}
        self._is_live = live
        self._live: set[str] = set()  # keys of the records ``live`` selects
        self._unique = unique
        self._by_unique: dict[str, str] = {}  # unique(record) -> key
        self._tokens = tokens
        self._holders: dict[str, set[str]] = {}  # token -> keys of the records that hold it
        self._seen = 0  # the highest revision the watch (or a read) has delivered
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
        """Stops the watch. The cancel is repeated until the task has ended: Python 3.11's
        ``asyncio.wait_for`` (inside nats-py's requests) drops a cancel that arrives as its answer
        does, and the watch then went on waiting (a test's close hung for minutes)."""
        if self._task is None:
            return
        while not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=CLOSE_RETRY_S)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            self._task.result()

    def listen(self, event: asyncio.Event | None = None) -> asyncio.Event:
        """One more event set on each change, for one more reader of the same mirror (each clears
        its own); ``event``: one the reader also has set by something else."""
        event = event or asyncio.Event()
        self._listeners.append(event)
        return event

    def unlisten(self, event: asyncio.Event) -> None:
        """The reader of ``listen``'s event is done with it."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(event)

    def _changed(self) -> None:
        self.changed.set()
        for event in self._listeners:
            event.set()

    # ---- reading -------------------------------------------------------------------------------

    def values(self) -> list[M]:
        return [clone(record) for _, (_, record) in sorted(self._records.items())]

    def get(self, key: str) -> M | None:
        found = self._records.get(key)
        return clone(found[1]) if found else None

    def peek(self, key: str) -> M | None:
        """The record itself, to read only."""
        found = self._records.get(key)
        return found[1] if found else None

    def view(self) -> list[M]:
        """Every record itself, to read only, in key order."""
        return [record for _, (_, record) in sorted(self._records.items())]

    def live(self) -> list[M]:
        """The records the ``live`` predicate selects, themselves, to read only, in key order."""
        return [self._records[k][1] for k in sorted(self._live)]

    def find(self, value: str) -> M | None:
        """The record whose ``unique`` field is ``value``, itself, to read only."""
        key = self._by_unique.get(value)
        return self.peek(key) if key is not None else None

    def holders(self, token: str) -> list[M]:
        """The records whose ``tokens`` include ``token``, themselves, to read only, in key order."""
        return [self._records[k][1] for k in sorted(self._holders.get(token, ()))]

    def held(self, token: str) -> bool:
        """Whether any record's ``tokens`` include ``token``."""
        return token in self._holders

    async def caught_up(self, timeout_s: float = 2.0) -> bool:
        """Waits until this copy holds every write the bucket had now; False if it did not within
        ``timeout_s`` (the reader then goes on with what it has)."""
        try:
            last = await self.table.last_revision()
        except BusError:
            return False
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._seen < last:
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    def _index(self, key: str, old: M | None, new: M | None) -> None:
        if self._is_live is not None:
            if new is not None and self._is_live(new):
                self._live.add(key)
            else:
                self._live.discard(key)
        if self._unique is not None:
            if old is not None and self._by_unique.get(self._unique(old)) == key:
                del self._by_unique[self._unique(old)]
            if new is not None:
                self._by_unique[self._unique(new)] = key
        if self._tokens is not None:
            for token in self._tokens(old) if old is not None else ():
                keys = self._holders.get(token)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._holders[token]
            for token in self._tokens(new) if new is not None else ():
                self._holders.setdefault(token, set()).add(key)

    # ---- writing -------------------------------------------------------------------------------

    def note(self, key: str, record: M, revision: int, *, owned: bool = False) -> None:
        """A write of the owner's (or a watched one): kept unless a later one is here already.
        The mirror keeps a copy of it, or ``record`` itself when it is ``owned`` (decoded for the
        mirror alone: a deep copy of every record the watch brings was a tenth of a node's CPU
        in a burst of submits)."""
        current = self._records.get(key)
        self._noted.add(key)
        self._seen = max(self._seen, revision)
        if current is None or revision >= current[0]:
            kept = record if owned else clone(record)
            self._records[key] = (revision, kept)
            self._index(key, current[1] if current else None, kept)

    def forget(self, key: str, revision: int) -> None:
        current = self._records.get(key)
        self._seen = max(self._seen, revision)
        if current is not None and revision >= current[0]:
            del self._records[key]
            self._index(key, current[1], None)

    def _drop(self, key: str) -> None:
        current = self._records.pop(key, None)
        if current is not None:
            self._index(key, current[1], None)

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
        newest = await self.table.last_revision()  # before the watch: the first pass delivers it (or a later one)
        watcher = await self.table.watch_all()
        try:
            initial: set[str] = set()  # what this watch delivered in its first pass
            first_pass, marked, delivered = True, False, 0
            while True:
                try:
                    # after the marker, a short wait for the rest of the first pass
                    entry = await self._next(watcher, reconnected,
                                             END_GRACE_S if first_pass and marked else self.resync_s)
                except nats.errors.TimeoutError:
                    if first_pass and marked:  # the newest revision is gone from the stream: nothing more comes
                        entry = None
                        delivered = newest
                    else:
                        await self.check()
                        continue
                except _Reconnected:  # the watch's consumer may be gone with the server: a new watch
                    log.info("NATS came back: watching %s again", self.table.bucket)
                    return
                if entry is not None:
                    delivered = max(delivered, entry.revision or 0)
                    if first_pass:
                        initial.add(entry.key)
                    self._apply(entry)
                else:
                    marked = True
                if first_pass and marked and delivered >= newest:  # every record has been delivered once
                    for key in set(self._records) - initial:
                        self._drop(key)  # deleted while nobody watched
                    first_pass = False
                    self.synced.set()
        finally:
            self.table.reconnects.forget(reconnected)
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _apply(self, entry: Any) -> None:
        """One write or delete the watch delivered."""
        if entry.operation in _DELETES or entry.value is None:
            self.forget(entry.key, entry.revision or 0)
            self._changed()
            return
        try:
            record = wire.decode(self.table.model, entry.value)
        except wire.WireError as exc:
            log.warning("ignoring %s in %s: %s", entry.key, self.table.bucket, exc)
            return
        self.note(entry.key, record, entry.revision or 0, owned=True)
        self._changed()

    async def _next(self, watcher: KeyValue.KeyWatcher, reconnected: asyncio.Event, timeout: float) -> Any:
        """The watch's next entry; nats' TimeoutError after `timeout` seconds; _Reconnected when the
        connection came back meanwhile."""
        update = asyncio.ensure_future(watcher.updates(timeout=timeout))  # type: ignore[no-untyped-call]
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

    async def check(self) -> None:
        """The watch was quiet for ``resync_s``: reads every record again if the bucket's newest
        revision is not the newest this copy has seen."""
        last = await self.table.last_revision()  # a BusError: the bus is away, the watch starts again
        if last != self._seen:
            log.info("the copy of %s is at revision %d, the bucket at %d: reading it again",
                     self.table.bucket, self._seen, last)
            await self.resync(last)

    async def resync(self, last: int | None = None) -> None:
        """Reads every record again; ``last``: the bucket's newest revision, read just before (the
        copy is then at least that new, even where the server lost writes it had seen)."""
        if last is not None:
            self._seen = last
        self._noted.clear()
        keys = await self.table.keys()
        found = await asyncio.gather(*(self.table.get_rev(k) for k in keys))
        present = set()
        for key, got in zip(keys, found, strict=True):
            if got is not None:
                present.add(key)
                self.note(key, got[0], got[1])
        for key in set(self._records) - present - self._noted:
            self._drop(key)
