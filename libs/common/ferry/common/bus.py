"""The bus every service talks through: NATS JetStream streams for commands and events, KV buckets
for state, core NATS for progress and log reads.

    BusError(FerryError)            the bus cannot be reached or refused an operation
    └── CasConflict                 a KV update lost a race (re-read and retry)
"""

import asyncio
import contextlib
import datetime
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import nats
import nats.errors
import nats.js.errors
import tenacity
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue
from pydantic import BaseModel

from ferry.common import wire
from ferry.common.errors import ConfigError, FerryError, NotFoundError, UsageError, describe
from ferry.common.models import (
    AutoscalePolicy,
    CheckpointRecord,
    FleetNode,
    GangCheckpoint,
    Job,
    Node,
    Op,
    PriceRecord,
    ServiceBeat,
)
from ferry.common.natsauth import NatsCreds
from ferry.common.tracing import inject

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
_UNANSWERED = (TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
               nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)
"""What a KV request meets while a server is away or its cluster elects a leader: worth a retry."""
T = TypeVar("T")
REQUEST_TIMEOUT_S = 2.0  # one KV request (they take milliseconds); a node is lost after 5 s of silence
REQUEST_ATTEMPTS = 4
REQUEST_RETRY_WAIT_S = 0.2  # between attempts: a NATS cluster elects a leader in about a second
Handler = Callable[[Msg], Awaitable[None]]


async def _log_error(exc: Exception) -> None:
    """What the server reports without a request to fail: a permission refused is worth a line."""
    if "violation" in str(exc).lower():  # permissions or authorization
        log.error("NATS refused: %s", exc)
    else:
        log.debug("NATS: %s", exc)


class BusError(FerryError):
    """NATS cannot be reached or refused an operation."""


class CasConflict(BusError):
    """A compare-and-set update of a KV record lost a race."""


MAX_DELIVER = 20
"""How many times a command or report is delivered before it is dropped (about 2.5 minutes of
doubling delays, plus the handlers' own time): one that fails that often fails for a reason a retry
does not mend."""


def is_permanent(exc: BaseException) -> bool:
    """An error no redelivery can mend: bad input, an unknown job or node, a bad configuration."""
    return isinstance(exc, (UsageError, NotFoundError, ConfigError))


async def _finish_handlers(running: set["asyncio.Task[None]"], drain_s: float, durable: str) -> None:
    """Waits `drain_s` for the handlers still running, then cancels the rest (not acked: they go to
    the consumer's next subscriber)."""
    if not running:
        return
    _, late = await asyncio.wait(set(running), timeout=drain_s)
    for task in late:
        task.cancel()
    if late:
        log.warning("%s: cancelled %d handler(s) still running after %.0fs", durable, len(late), drain_s)
        await asyncio.gather(*late, return_exceptions=True)


async def _settle_failed(msg: Msg, exc: Exception) -> None:
    """A handler raised `exc` on `msg`: drop it (malformed, permanent, or delivered MAX_DELIVER
    times) or have it redelivered after a delay that doubles with each delivery (0.5 s to 10 s)."""
    delivered = _deliveries(msg)
    if isinstance(exc, wire.WireError):
        log.error("dropping malformed message on %s: %s", msg.subject, exc)
    elif is_permanent(exc) or delivered >= MAX_DELIVER:
        log.error("dropping the message on %s after %d deliveries: %s", msg.subject, delivered, exc)
    else:
        log.exception("handler failed on %s (delivery %d of %d); it will be redelivered", msg.subject, delivered,
                      MAX_DELIVER, exc_info=exc)
        with contextlib.suppress(Exception):
            await msg.nak(delay=min(10.0, 0.5 * 2.0 ** (delivered - 1)))
        return
    with contextlib.suppress(Exception):
        await msg.term()


def _deliveries(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered or 1)
    except Exception:
        return 1


class Reconnects:
    """Who wants to hear that the connection to NATS came back (a KV watch's consumer may not have)."""

    def __init__(self) -> None:
        self._events: set[asyncio.Event] = set()

    def listen(self, event: asyncio.Event) -> None:
        self._events.add(event)

    def forget(self, event: asyncio.Event) -> None:
        self._events.discard(event)

    def fire(self) -> None:
        for event in self._events:
            event.set()


class Table(Generic[M]):
    """A JetStream KV bucket holding JSON records of one pydantic model."""

    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str, model: type[M],
                 nc: Client | None = None, reconnects: Reconnects | None = None) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self._model = model
        self._nc = nc
        self.reconnects = reconnects or Reconnects()

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def model(self) -> type[M]:
        return self._model

    async def watch_all(self) -> KeyValue.KeyWatcher:
        """Every record once, then every write and delete (``ferry.common.mirror`` follows it)."""
        try:
            return await self._call("watch", lambda: self._kv.watchall())
        except nats.errors.Error as exc:
            raise BusError(f"cannot watch {self._bucket}: {describe(exc)}") from exc

    @contextlib.asynccontextmanager
    async def watching(self, key: str, changed: asyncio.Event | None = None,
                       latest: dict[str, M] | None = None) -> AsyncIterator[asyncio.Event]:
        """An event that is set each time `key` (">": any key) is written or deleted, for as long as
        the block runs.

        A core subscription to the key's KV subject (every write to a KV key is a message on
        ``$KV.<bucket>.<key>``): no consumer to create, and NATS re-subscribes it after a
        reconnect. The caller clears the event and reads the record; a write made before the
        subscription is not signalled, so read once after entering. `changed`: an event of the
        caller's to set (one it also sets for other wake-ups), else a new one. `latest`: where the
        record each write carries is kept by key, newest last (a delete or an undecodable one
        removes it), so that the caller can take it instead of reading it back; a write missed
        while the connection was away is not there, so a caller still reads now and then."""
        changed = changed if changed is not None else asyncio.Event()
        if self._nc is None:
            raise BusError(f"cannot watch {key} in {self._bucket}: no connection")
        prefix = f"$KV.{self._bucket}."

        async def on_write(msg: Msg) -> None:
            if latest is not None:
                written = msg.subject.removeprefix(prefix)
                record = self._carried(msg)
                if record is None:
                    latest.pop(written, None)
                else:
                    latest[written] = record
            changed.set()

        try:
            subject = f"{prefix}{'>' if key == '>' else wire.token(key)}"
            sub = await self._nc.subscribe(subject, cb=on_write)
        except nats.errors.Error as exc:
            raise BusError(f"cannot watch {key} in {self._bucket}: {describe(exc)}") from exc
        try:
            yield changed
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _carried(self, msg: Msg) -> M | None:
        """The record a KV subject's message carries; None for a delete or purge (or bad data)."""
        if not msg.data or (msg.headers or {}).get("KV-Operation"):
            return None
        try:
            return wire.decode(self._model, msg.data)
        except wire.WireError:
            return None

    async def get(self, key: str) -> M | None:
        found = await self.get_rev(key)
        return found[0] if found else None

    async def _call(self, what: str, request: Callable[[], Awaitable[T]]) -> T:
        """One KV request, bounded: a request sent to a server that then died would wait out the
        whole JetStream timeout, while the client is already connected to another server of the
        cluster. Retried a few times (every KV request here is idempotent, or a CAS whose conflict
        the caller handles), then a BusError.

        The first attempt goes without tenacity, whose machinery cost ten times the request's own
        CPU in the client (a service makes several of these per submitted job); only a request
        that went unanswered pays for it."""

        async def attempt() -> T:  # tenacity awaits what an async function returns, not a lambda's
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                return await request()

        try:
            return await attempt()
        except _UNANSWERED:
            await asyncio.sleep(REQUEST_RETRY_WAIT_S)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(REQUEST_ATTEMPTS - 1), wait=tenacity.wait_fixed(REQUEST_RETRY_WAIT_S),
            reraise=True, retry=tenacity.retry_if_exception_type(_UNANSWERED))
        try:
            return await retrying(attempt)
        except _UNANSWERED as exc:
            raise BusError(f"cannot {what} in {self._bucket}: {describe(exc)}") from exc

    async def get_rev(self, key: str) -> tuple[M, int] | None:
        try:
            entry = await self._call(f"read {key}", lambda: self._kv.get(key))
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.errors.Error as exc:
            raise BusError(f"cannot read {key} from {self._bucket}: {describe(exc)}") from exc
        if entry.value is None or entry.revision is None:
            return None
        return wire.decode(self._model, entry.value), entry.revision

    async def put(self, key: str, value: M) -> int:
        try:
            return int(await self._call(f"write {key}", lambda: self._kv.put(key, wire.encode(value))))
        except nats.errors.Error as exc:
            raise BusError(f"cannot write {key} to {self._bucket}: {describe(exc)}") from exc

    async def create(self, key: str, value: M) -> int:
        try:
            return int(await self._call(f"create {key}", lambda: self._kv.create(key, wire.encode(value))))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise CasConflict(f"{key} exists already") from exc

    async def update(self, key: str, value: M, revision: int) -> int:
        try:
            return int(await self._call(f"update {key}",
                                        lambda: self._kv.update(key, wire.encode(value), last=revision)))
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise CasConflict(f"{key} changed meanwhile") from exc

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self._call(f"delete {key}", lambda: self._kv.delete(key))

    async def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with `prefix`, read from the bucket's stream state.

        Not KeyValue.keys(): it walks a watcher that can end early while keys are being written,
        and it filters by substring, not by prefix.
        """
        base = f"$KV.{self._bucket}."
        try:
            info = await self._call("list keys", lambda: self._js.stream_info(f"KV_{self._bucket}",
                                                                               subjects_filter=f"{base}{prefix}>"))
        except nats.errors.Error as exc:
            raise BusError(f"cannot list {self._bucket}: {describe(exc)}") from exc
        subjects = info.state.subjects or {}
        return sorted(s[len(base):] for s in subjects if s.startswith(base + prefix))

    async def values(self, prefix: str = "") -> list[M]:
        found = await asyncio.gather(*(self.get(k) for k in await self.keys(prefix)))
        return [v for v in found if v is not None]

    async def last_revision(self) -> int:
        """The revision of the bucket's newest write or delete (0 when it has none)."""
        try:
            info = await self._call("read the state", lambda: self._js.stream_info(f"KV_{self._bucket}"))
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the state of {self._bucket}: {describe(exc)}") from exc
        return int(info.state.last_seq or 0)


class Bus:
    """One connection to NATS with Ferry's streams and KV buckets."""

    def __init__(self, nc: Client, js: JetStreamContext, replicas: int = 1) -> None:
        self.nc = nc
        self.js = js
        self.replicas = replicas
        self.jobs: Table[Job]
        self.nodes: Table[Node]
        self.checkpoints: Table[CheckpointRecord]
        self.ops: Table[Op]
        self.services: Table[ServiceBeat]
        self.prices: Table[PriceRecord]
        self.gangs: Table[GangCheckpoint]
        self.autoscale: Table[AutoscalePolicy]
        self.fleet: Table[FleetNode]
        self._subs: list[Any] = []
        self._create = True
        self.reconnects = Reconnects()

    @classmethod
    async def connect(cls, url: str, name: str, *, connect_timeout: float = 10.0, replicas: int = 1,
                      creds: NatsCreds | None = None, tls: ssl.SSLContext | None = None,
                      create: bool = True) -> "Bus":
        """Connects (retrying until `connect_timeout`) and makes sure streams and buckets exist.

        `url` may list several servers of one NATS cluster, comma-separated; streams and buckets
        are created with `replicas` copies (3 on a three-server cluster: any one may die). With
        `creds`, the connection authenticates as that user (ferry.common.natsauth); without
        `create`, the streams and buckets are waited for (only the scheduler's user may create
        them)."""
        servers = [u.strip() for u in url.split(",") if u.strip()]
        deadline = asyncio.get_running_loop().time() + connect_timeout
        auth: dict[str, Any] = {"user": creds.user, "password": creds.password} if creds else {}
        if tls is not None:
            auth["tls"] = tls
        seen: list[str] = []

        async def on_error(exc: Exception) -> None:
            seen.append(str(exc))
            await _log_error(exc)

        reconnects = Reconnects()

        async def on_reconnect() -> None:
            log.info("reconnected to NATS")
            reconnects.fire()

        try:  # nats-py retries the first connection forever: bounded here
            nc = await asyncio.wait_for(nats.connect(
                servers, name=name, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                allow_reconnect=True, error_cb=on_error, reconnected_cb=on_reconnect, **auth,
            ), timeout=max(connect_timeout, 1.0))
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            if any("authorization violation" in e.lower() for e in seen):
                raise BusError(f"NATS at {url} refused the credentials of {creds.user if creds else 'nobody'}: "
                               "check FERRY_NATS_CREDS") from exc
            last = seen[-1] if seen else (str(exc) or type(exc).__name__)
            raise BusError(f"cannot reach NATS at {url}: {last}") from exc
        bus = cls(nc, nc.jetstream(timeout=10), replicas)
        bus.reconnects = reconnects
        bus._create = create
        while True:  # a JetStream cluster answers "unavailable" until it has elected a leader
            try:
                await bus._ensure()
                return bus
            except BusError:
                if asyncio.get_running_loop().time() > deadline + 30:
                    await nc.close()
                    raise
                await asyncio.sleep(0.5)

    async def _ensure(self) -> None:
        try:
            await self._ensure_stream(
                api.StreamConfig(
                    name=wire.CMD_STREAM,
                    subjects=[wire.CMD_SUBJECTS],
                    retention=api.RetentionPolicy.WORK_QUEUE,
                    storage=api.StorageType.FILE,
                    num_replicas=self.replicas,
                    duplicate_window=120,
                )
            )
            await self._ensure_stream(
                api.StreamConfig(
                    name=wire.EVT_STREAM,
                    subjects=[wire.EVT_SUBJECTS],
                    retention=api.RetentionPolicy.LIMITS,
                    storage=api.StorageType.FILE,
                    max_age=7 * 86400,
                    max_msgs=1_000_000,
                    num_replicas=self.replicas,
                    duplicate_window=120,
                )
            )
            await self._ensure_stream(
                api.StreamConfig(
                    name=wire.AUDIT_STREAM,
                    subjects=[wire.AUDIT_SUBJECTS],
                    retention=api.RetentionPolicy.LIMITS,
                    storage=api.StorageType.FILE,
                    max_age=wire.AUDIT_MAX_AGE_S,
                    num_replicas=self.replicas,
                    deny_delete=True,
                    deny_purge=True,
                )
            )
            self.jobs = await self._table(wire.KV_JOBS, Job)
            self.nodes = await self._table(wire.KV_NODES, Node)
            self.checkpoints = await self._table(wire.KV_CHECKPOINTS, CheckpointRecord)
            self.ops = await self._table(wire.KV_OPS, Op)
            self.services = await self._table(wire.KV_SERVICES, ServiceBeat)
            self.prices = await self._table(wire.KV_PRICES, PriceRecord)
            self.gangs = await self._table(wire.KV_GANGS, GangCheckpoint)
            self.autoscale = await self._table(wire.KV_AUTOSCALE, AutoscalePolicy)
            self.fleet = await self._table(wire.KV_FLEET, FleetNode)
        except nats.errors.Error as exc:
            raise BusError(f"cannot set up JetStream streams and buckets: {describe(exc)}") from exc

    async def _ensure_stream(self, config: api.StreamConfig) -> None:
        try:
            await self.js.stream_info(config.name or "")
        except nats.js.errors.NotFoundError as exc:
            if not self._create:
                raise BusError(f"stream {config.name} does not exist yet (the scheduler creates it)") from exc
            with contextlib.suppress(nats.js.errors.BadRequestError):  # created by a peer meanwhile
                await self.js.add_stream(config)

    async def _table(self, name: str, model: type[M]) -> Table[M]:
        try:
            kv = await self.js.key_value(name)
        except nats.js.errors.BucketNotFoundError as exc:
            if not self._create:
                raise BusError(f"bucket {name} does not exist yet (the scheduler creates it)") from exc
            config = api.KeyValueConfig(bucket=name, history=5, storage=api.StorageType.FILE, replicas=self.replicas)
            kv = await self.js.create_key_value(config)
        return Table(self.js, kv, name, model, self.nc, self.reconnects)

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        """Publishes to JetStream with the current trace context; `msg_id` dedups retries."""
        headers = inject()
        if msg_id:
            headers[wire.MSG_ID_HEADER] = msg_id
        try:
            await self.js.publish(subject, wire.encode(message), headers=headers)
        except (TimeoutError, nats.errors.Error) as exc:
            raise BusError(f"cannot publish to {subject}: {describe(exc)}") from exc

    async def read_since(self, stream: str, subject: str, since: float, limit: int) -> list[bytes]:
        """The bodies of the messages of ``subject`` in ``stream`` stored from ``since`` (epoch
        seconds) on, oldest first, at most the newest ``limit``: one ephemeral consumer, read to its
        end and deleted."""
        start = datetime.datetime.fromtimestamp(since, datetime.UTC)
        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start,
                                    ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0)
        try:
            sub = await self.js.pull_subscribe(subject, stream=stream, config=config)
        except (TimeoutError, nats.errors.Error) as exc:
            raise BusError(f"cannot read {stream}: {describe(exc)}") from exc
        bodies: list[bytes] = []
        try:
            while True:
                try:
                    batch = await sub.fetch(256, timeout=0.5)
                except (TimeoutError, nats.errors.TimeoutError):
                    break
                bodies.extend(m.data for m in batch)
                bodies = bodies[-limit:]
                if all(m.metadata.num_pending == 0 for m in batch[-1:]):
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return bodies

    async def publish_core(self, subject: str, message: BaseModel) -> None:
        with contextlib.suppress(nats.errors.Error):
            await self.nc.publish(subject, wire.encode(message), headers=inject())

    async def request(self, subject: str, message: BaseModel, timeout: float = 5.0) -> bytes:
        try:
            reply = await self.nc.request(subject, wire.encode(message), timeout=timeout, headers=inject())
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            raise BusError(f"no answer on {subject}: is the node's service running?") from exc
        return bytes(reply.data)

    async def subscribe(self, subject: str, handler: Callable[[Msg], Awaitable[None]]) -> Any:
        """Core NATS: events as they pass, progress, and requests to answer (log reads)."""
        sub = await self.nc.subscribe(subject, cb=handler)
        self._subs.append(sub)
        return sub

    async def consume(
        self,
        *,
        stream: str,
        durable: str,
        subject: str,
        handler: Handler,
        concurrency: int = 1,
        ack_wait: float = 30.0,
        stop: asyncio.Event,
        drain_s: float = 20.0,
    ) -> None:
        """Runs `handler` on each message of a durable pull consumer until `stop` is set.

        A message is acked after its handler returns. A handler that raises a temporary error gets
        it redelivered, after a delay that doubles with each delivery (0.5 s to 10 s), at most
        MAX_DELIVER times in all; a permanent one (``is_permanent``: input that will never be
        valid) and a malformed message (WireError) are dropped at once. With concurrency > 1, up to
        that many handlers run at once; once `stop` is set they get `drain_s` to finish, then are
        cancelled (their messages, not acked, go to the successor).
        """
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_ack_pending=max(concurrency * 4, 16),
            filter_subject=subject,
            max_deliver=MAX_DELIVER,
        )
        sub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        slots = asyncio.Semaphore(concurrency)
        running: set[asyncio.Task[None]] = set()

        async def run_one(msg: Msg) -> None:
            try:
                await handler(msg)
            except Exception as exc:
                await _settle_failed(msg, exc)
            else:
                with contextlib.suppress(Exception):
                    await msg.ack()
            finally:
                slots.release()

        while not stop.is_set():
            await slots.acquire()
            if stop.is_set():
                slots.release()
                break
            try:
                msgs = await sub.fetch(1, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                slots.release()
                continue
            except nats.errors.Error as exc:
                slots.release()
                if stop.is_set() or self.nc.is_closed:
                    break
                log.warning("fetch on %s failed: %s", durable, exc)
                await asyncio.sleep(0.5)
                continue
            for i, msg in enumerate(msgs):
                if i:
                    await slots.acquire()
                task = asyncio.create_task(run_one(msg))
                running.add(task)
                task.add_done_callback(running.discard)
        await _finish_handlers(running, drain_s, durable)

    async def close(self) -> None:
        # Not nc.drain(): it waits out its 30 s timeout on pull subscriptions. Whatever a closing
        # service had not acked is redelivered to its successor, so flushing what we sent is enough.
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        with contextlib.suppress(Exception):
            await self.nc.close()


async def keep_alive(msg: Msg, every: float = 10.0) -> None:
    """Tells JetStream a long handler is still working on `msg` (cancel when done)."""
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):
            await msg.in_progress()
