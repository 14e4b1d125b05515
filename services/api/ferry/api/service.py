"""The gRPC admin API. Reads come straight from KV; actions become scheduler commands whose op the
API then watches (streaming progress for checkpoints, restores and moves) until it ends."""

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import tenacity
from google.protobuf.json_format import MessageToDict
from nats.aio.msg import Msg
from opentelemetry import trace

from ferry.api import convert
from ferry.api.auth import AuthInterceptor, caller, note, notes
from ferry.api.errors import ErrorInterceptor, status_of
from ferry.api.listen import Listener
from ferry.common import guardrails, wire
from ferry.common.bus import Bus, BusError
from ferry.common.config import Settings
from ferry.common.errors import FerryError, LimitExceeded, NotFoundError, UsageError, from_kind
from ferry.common.jobspec import check_request
from ferry.common.mirror import Mirror
from ferry.common.models import (
    TERMINAL_STATES,
    AuditEntry,
    AutoscalePolicy,
    Event,
    Job,
    JobState,
    NodeState,
    Op,
    OpKind,
    new_id,
)
from ferry.common.sealing import read_key, seal_env
from ferry.common.service import Service, service_main
from ferry.common.tenancy import Tenants, Usage
from ferry.common.tracing import extract, tracer
from ferry.policy import admission, gangs, plans, signals
from ferry.policy.views import effective_price
from ferry.sim import chaos
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
TENANT_CACHE_MAX = 100_000  # jobs whose tenant the event watch remembers
_tracer = tracer("api")
DRAIN_SETTLED = frozenset({JobState.PREEMPTED, JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED})
AUDIT_LIMIT_MAX = 10_000
AUTOSCALE_KEY = "policy"  # the one record of ferry_autoscale (the autoscaler reads it)
OP_RECHECK_S = 2.0  # an op whose writes the watch missed (the bus reconnected) is read again after this
Ctx = Any  # grpc.aio.ServicerContext; grpc ships no type information

class AdminServicer(pb_grpc.FerryAdminServicer):
    def __init__(self, bus: Bus, settings: Settings, jobs: Mirror[Job], tenants: Tenants | None = None) -> None:
        self.bus = bus
        # a watch-fed copy of the jobs (the service's): a submit's quota check, `ferry ps` and a
        # lookup by name read it instead of every job's record from KV, which made each call's
        # cost grow with the cluster's history
        self.jobs = jobs
        self.settings = settings
        self.tenants = tenants or Tenants(settings.tokens_file, settings.token)
        self._job_tenants: dict[str, str] = {}
        self.timeout_s = settings.api_timeout_s
        self.data_dir = settings.data_dir
        self._env_key: bytes | None = None
        self._pending: dict[tuple[str, str, str], int] = {}  # an agent's allowed actions not yet audited

    def env_public_key(self) -> bytes:
        """The nodes' public key that job environments are sealed to (read once)."""
        if self._env_key is None:
            self._env_key = read_key(self.settings.resolved_env_key_file(public=True), private=False)
        return self._env_key

    # ---- helpers -----------------------------------------------------------------------------

    async def resolve(self, ref: str) -> Job:
        """The job named or numbered ``ref`` among those the caller may see (another tenant's job
        is as unknown as one that does not exist)."""
        if not ref:
            raise UsageError("no job given: name it by name or id")
        me = caller()
        if wire.is_token(ref):
            job = await self.bus.jobs.get(ref)
            if job is not None and me.may_see(job):
                return job
        named = self.jobs.find(ref)
        if named is None:
            current = await self.jobs.caught_up()
            named = self.jobs.find(ref)  # written a moment ago
            if named is None and not current:  # the copy could not catch up: every record from KV
                named = next((j for j in await self.bus.jobs.values() if j.name == ref), None)
        found = await self.bus.jobs.get(named.id) if named is not None else None  # its newest record
        if found is not None and found.name == ref and me.may_see(found):
            return found
        raise NotFoundError(f"no job {ref!r}: `ferry ps -a` lists jobs")

    async def all_jobs(self) -> list[Job]:
        """Every job as it is now, to read only: the watch-fed copy once it holds every write made
        so far."""
        await self.jobs.caught_up()
        return self.jobs.view()

    async def live_jobs(self) -> list[Job]:
        """The jobs that have not ended, to read only (as ``all_jobs``, without the history)."""
        await self.jobs.caught_up()
        return self.jobs.live()

    async def tenant_of(self, job_id: str) -> str | None:
        """The tenant of a job (remembered: a job never changes tenant), None if it is gone."""
        if job_id not in self._job_tenants:
            job = await self.bus.jobs.get(job_id) if wire.is_token(job_id) else None
            if job is None:
                return None
            if len(self._job_tenants) >= TENANT_CACHE_MAX:  # bounded: forget the oldest half
                for old in list(self._job_tenants)[: TENANT_CACHE_MAX // 2]:
                    del self._job_tenants[old]
            self._job_tenants[job_id] = job.tenant
        return self._job_tenants[job_id]

    async def write_audit(self, entry: AuditEntry) -> None:
        """Adds one entry to the audit stream; a failure is logged, never the caller's."""
        try:
            await self.bus.publish(wire.audit_subject(entry.tenant), entry)
        except BusError as exc:
            log.error("audit: could not record %s %s by %s (%s): %s", entry.method, entry.target, entry.who,
                      entry.outcome, exc)

    async def require_node(self, node_id: str) -> None:
        if not wire.is_token(node_id) or await self.bus.nodes.get(node_id) is None:
            raise NotFoundError(f"no node {node_id!r}: `ferry nodes` lists them")

    async def run_op(self, cmd: wire.SchedulerCommand) -> AsyncIterator[pb.OpUpdate]:
        """Sends `cmd`, then yields progress and, last, the op's outcome."""
        op = Op(id=cmd.op, kind=cmd.kind, job=cmd.job)
        await self.bus.ops.put(op.id, op)
        updates: asyncio.Queue[wire.Progress] = asyncio.Queue()
        wake = asyncio.Event()  # progress arrived, or the op was written

        async def on_progress(msg: Msg) -> None:
            with contextlib.suppress(wire.WireError):
                await updates.put(wire.decode(wire.Progress, msg.data))
                wake.set()

        sub = await self.bus.subscribe(wire.progress_subject(op.id), on_progress)
        written: dict[str, Op] = {}  # the op as its last write carried it (not read back)
        try:
            deadline = time.monotonic() + self.timeout_s
            async with self.bus.ops.watching(op.id, wake, latest=written):
                # a bus that lost a server answers again within seconds: retry (the msg id dedups)
                await self._until(deadline, lambda: self.bus.publish(wire.SCHEDULER_CMD, cmd, msg_id=op.id))
                while True:
                    wake.clear()
                    while not updates.empty():
                        p = updates.get_nowait()
                        yield pb.OpUpdate(op=op.id, phase=p.phase, done_bytes=p.done, total_bytes=p.total)
                    try:  # read only when no write was heard (the first look, or one missed)
                        current = written.pop(op.id, None) or await self.bus.ops.get(op.id)
                        final = await self.final_update(current) if current is not None and current.finished else None
                    except BusError as exc:
                        log.warning("reading op %s: %s; trying again", op.id, exc)
                        final = None
                    if final is not None:
                        yield final
                        return
                    if time.monotonic() > deadline:
                        yield pb.OpUpdate(op=op.id, done=True, error_code=1, error=(
                            f"no outcome after {self.timeout_s:.0f}s; op {op.id} goes on: `ferry status` shows "
                            "the job"))
                        return
                    # the op's next write or progress; a write missed while the bus reconnected is
                    # still seen after OP_RECHECK_S
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), OP_RECHECK_S)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    @staticmethod
    async def _until(deadline: float, attempt: Callable[[], Awaitable[None]]) -> None:
        """`attempt()` until it stops raising BusError, or the last BusError after `deadline`."""

        async def once() -> None:
            await attempt()

        await tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(BusError), wait=tenacity.wait_fixed(0.3), reraise=True,
            stop=lambda _: time.monotonic() > deadline)(once)

    async def final_update(self, op: Op) -> pb.OpUpdate:
        """The op's last update. The scheduler writes the job and the checkpoint as they ended
        into the op; only an op that ended without them (an old record) costs more reads."""
        update = convert.op_to_update(op)
        record = op.checkpoint_record
        if record is None and op.checkpoint and op.job:
            record = await self.bus.checkpoints.get(wire.ckpt_key(op.job, op.checkpoint))
        if record is not None:
            update.checkpoint.CopyFrom(convert.checkpoint_to_pb(record))
        job = op.job_record
        if job is None and op.job:
            job = await self.bus.jobs.get(op.job)
        if job is not None:
            update.job.CopyFrom(convert.job_to_pb(job))
        return update

    async def op_result(self, cmd: wire.SchedulerCommand) -> pb.OpUpdate:
        final = pb.OpUpdate()
        async for update in self.run_op(cmd):
            final = update
        return final

    async def unary_op(self, name: str, context: Ctx, build: Callable[[], Awaitable[wire.SchedulerCommand]]
                       ) -> pb.OpUpdate:
        """Builds a command (its checks may refuse it), runs the op to its end and returns the last
        update; every failure ends the call with the matching gRPC status."""
        with self.span(name, context), self.held():
            try:
                update = await self.op_result(await build())
            except FerryError as exc:
                await self.fail(context, exc)
                raise AssertionError("unreachable") from exc
            if update.error:
                await self.fail_op(context, update)
            return update

    @staticmethod
    async def fail(context: Ctx, exc: FerryError) -> None:
        await context.abort(status_of(exc), str(exc))

    @staticmethod
    async def fail_op(context: Ctx, update: pb.OpUpdate) -> None:
        """Ends the call as the error that ended the op would have, raised here (its kind crossed
        the bus); an op that failed without one (a node's failure) is FAILED_PRECONDITION."""
        if update.error_kind:
            await context.abort(status_of(from_kind(update.error_kind, update.error)), update.error)
        code = grpc.StatusCode.INVALID_ARGUMENT if update.error_code == 2 else grpc.StatusCode.FAILED_PRECONDITION
        await context.abort(code, update.error)

    def span(self, name: str, context: Ctx) -> Any:
        return _tracer.start_as_current_span(f"api.{name}", context=extract(dict(context.invocation_metadata() or ())))

    # ---- RPCs --------------------------------------------------------------------------------

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Ctx) -> pb.Job:
        async def build() -> wire.SchedulerCommand:
            checked = check_request(MessageToDict(request, preserving_proto_field_name=True))
            if checked.node:
                await self.require_node(checked.node)
            me = caller()
            if self.tenants.quota(me.tenant).limited:  # an unlimited tenant's jobs are not counted
                mine = [j for j in await self.live_jobs() if j.tenant == me.tenant]  # quotas count live jobs only
                self.tenants.check_quota(me.tenant, Usage.of(mine), cpus=checked.cpus,
                                         memory=checked.memory_bytes, gpus=checked.gpus)
            spec = checked.to_spec(checked.name or f"job-{new_id('x')[2:8]}", time.time(),
                                   seal_env(checked.env, self.env_public_key(), me.tenant), tenant=me.tenant)
            return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.SUBMIT, spec=spec)

        return (await self.unary_op("SubmitJob", context, build)).job

    async def ListJobs(self, request: pb.ListJobsRequest, context: Ctx) -> pb.ListJobsResponse:
        me = caller()
        found = await self.all_jobs() if request.all else await self.live_jobs()  # live: not ended
        jobs = sorted((j for j in found if me.may_see(j)), key=lambda j: j.created)
        return pb.ListJobsResponse(jobs=[convert.job_to_pb(j) for j in jobs])

    async def GetJob(self, request: pb.JobRef, context: Ctx) -> pb.Job:
        try:
            job = await self.resolve(request.job)
            node = await self.bus.nodes.get(job.node) if job.node else None
            used = node.usage.get(job.id) if node is not None else None
            return convert.job_to_pb(job, rss_bytes=used.rss_bytes if used is not None else 0)
        except FerryError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc

    async def KillJob(self, request: pb.KillJobRequest, context: Ctx) -> pb.Job:
        async def build() -> wire.SchedulerCommand:
            return (await self.kill_cmd(request))[0]

        return (await self.unary_op("KillJob", context, build)).job

    async def WaitJob(self, request: pb.WaitJobRequest, context: Ctx) -> pb.Job:
        try:
            job = await self.resolve(request.job)
        except FerryError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc
        deadline = time.monotonic() + request.timeout_s if request.timeout_s > 0 else None
        async with self.bus.jobs.watching(job.id) as changed:
            job = await self.bus.jobs.get(job.id) or job  # a write before the watch began
            while job.state not in TERMINAL_STATES:
                left = deadline - time.monotonic() if deadline is not None else OP_RECHECK_S
                if left <= 0:
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                        f"job {job.name} is still {job.state} after {request.timeout_s:.0f}s")
                with contextlib.suppress(TimeoutError):  # a write missed while the bus reconnected
                    await asyncio.wait_for(changed.wait(), min(left, OP_RECHECK_S))
                changed.clear()
                job = await self.bus.jobs.get(job.id) or job
        return convert.job_to_pb(job)

    async def _stream_op(self, name: str, context: Ctx, build: Any) -> AsyncIterator[pb.OpUpdate]:
        with self.span(name, context) as span, self.held():
            try:
                cmd = await build()
            except FerryError as exc:
                await self.fail(context, exc)
                return
            span.set_attribute("ferry.op", cmd.op)
            span.set_attribute("ferry.job", cmd.job)
            async for update in self.run_op(cmd):
                if update.done and update.error:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, update.error))
                yield update

    # ---- the mutating calls' checks: shared by the calls and their dry runs (Plan) --------------

    async def gang(self, name: str, job: str) -> list[Job]:
        """The members of gang `name` the caller may see (checked as the scheduler checks them)."""
        if job:
            raise UsageError("name a job or --gang, not both")
        if not wire.is_token(name):
            raise UsageError(f"bad gang name {name!r}: use letters, digits, '-' and '_'")
        me = caller()
        members = gangs.gang_members((j.clone() for j in await self.all_jobs()
                                      if j.gang == name and me.may_see(j)), name)
        if not members:
            raise NotFoundError(f"no gang {name!r}: `ferry ps` shows each job's gang")
        return members

    async def checkpoint_cmd(self, request: pb.CheckpointRequest) -> tuple[wire.SchedulerCommand, Job]:
        if request.gang:
            members = await self.gang(request.gang, request.job)
            gangs.gang_checkpointable(request.gang, members)
            return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.CHECKPOINT, gang=request.gang,
                                         stop=request.stop), members[0]
        job = await self.resolve(request.job)
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.CHECKPOINT, job=job.id, stop=request.stop), job

    async def restore_cmd(self, request: pb.RestoreRequest) -> tuple[wire.SchedulerCommand, Job]:
        if request.gang:
            return await self.gang_restore_cmd(request)
        if request.nodes or request.allow_colocate:
            raise UsageError("--nodes and --allow-colocate go with --gang")
        job = await self.resolve(request.job)
        if request.node:
            await self.require_node(request.node)
        if request.checkpoint:
            found = wire.is_token(request.checkpoint) and await self.bus.checkpoints.get(
                wire.ckpt_key(job.id, request.checkpoint))
            if not found:
                raise NotFoundError(f"job {job.name} has no checkpoint {request.checkpoint!r}: "
                                    f"`ferry checkpoints {job.name}` lists them")
        if request.here and not request.node:
            raise UsageError("--here: say which node this is with --node NODE (or FERRY_NODE)")
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.RESTORE, job=job.id, node=request.node or None,
                                     checkpoint=request.checkpoint or None, here=request.here), job

    async def gang_restore_cmd(self, request: pb.RestoreRequest) -> tuple[wire.SchedulerCommand, Job]:
        members = await self.gang(request.gang, request.job)
        if request.checkpoint or request.here or request.node:
            raise UsageError("a gang restores from its newest group checkpoint, where --nodes says: drop "
                             "--checkpoint, --node and --here")
        for node in request.nodes:
            await self.require_node(node)
        gangs.assign_nodes(members, list(request.nodes), allow_colocate=request.allow_colocate)
        groups = await self.bus.gangs.values(prefix=f"{request.gang}.")
        gangs.gang_restorable(request.gang, members, gangs.newest_group(groups, members))
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.RESTORE, gang=request.gang,
                                     nodes=list(request.nodes), allow_colocate=request.allow_colocate), members[0]

    async def migrate_cmd(self, request: pb.MigrateRequest) -> tuple[wire.SchedulerCommand, Job]:
        job = await self.resolve(request.job)
        if not request.to:
            raise UsageError("say where to: `ferry migrate JOB --to NODE`")
        if request.tcp_established and not request.live:
            raise UsageError("--tcp-established goes with --live (a cold move closes connections)")
        await self.require_node(request.to)
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.MIGRATE, job=job.id, node=request.to,
                                     live=request.live, tcp_established=request.tcp_established), job

    async def kill_cmd(self, request: pb.KillJobRequest) -> tuple[wire.SchedulerCommand, Job]:
        job = await self.resolve(request.job)
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.KILL, job=job.id,
                                     grace_s=request.grace_s or 5.0), job

    async def drain_cmd(self, request: pb.DrainNodeRequest) -> wire.SchedulerCommand:
        me = caller()
        if not (me.admin or me.agent):
            me.require_admin("draining a node")
        await self.require_node(request.node)
        return wire.SchedulerCommand(op=new_id("op"), kind=OpKind.DRAIN, node=request.node, stop=request.undo)

    async def snapshot(self, job: Job | None = None) -> signals.Snapshot:
        """The records the signals and plans read, as the caller may see them (another tenant's jobs
        are left out; nodes and prices are everyone's)."""
        me = caller()
        jobs = [j.clone() for j in await self.all_jobs() if me.may_see(j)]
        prefix = f"{job.id}." if job is not None else ""
        seen = {j.id for j in jobs}
        checkpoints = [c for c in await self.bus.checkpoints.values(prefix=prefix) if c.job in seen]
        return signals.Snapshot(jobs=jobs, nodes=await self.bus.nodes.values(), prices=await self.bus.prices.values(),
                                checkpoints=checkpoints, now=time.time(),
                                heartbeat_timeout_s=self.settings.heartbeat_timeout_s)

    async def guard(self, method: str, cost_per_hour: float = 0.0, *, undo: bool = False,
                    dry_run: bool = False) -> None:
        """Refuses an agent's action over its tenant's hourly limits (counted from the audit trail,
        plus what this API allowed that is not recorded yet: `held` counts it until the call ends)."""
        me = caller()
        note("cost_per_hour", cost_per_hour)
        action = guardrails.action_of(method, undo=undo)
        if not me.agent or action is guardrails.Action.OTHER:
            return
        try:
            bodies = await self.bus.read_since(wire.AUDIT_STREAM, wire.audit_subject(me.tenant),
                                               time.time() - guardrails.HOUR_S, AUDIT_LIMIT_MAX)
        except BusError as exc:
            raise LimitExceeded(f"cannot read the audit trail to check this agent's limits ({exc}): try again") \
                from exc
        entries = []
        for body in bodies:
            with contextlib.suppress(wire.WireError):
                entries.append(wire.decode(AuditEntry, body))
        key = (me.tenant, me.who, action.value)
        why = guardrails.refusal(self.tenants.agent_limits(me.tenant),
                                 guardrails.spent(entries, me.who, me.tenant, time.time()), action, cost_per_hour,
                                 pending=self._pending.get(key, 0))
        if why:
            raise LimitExceeded(why)
        if not dry_run:
            self._pending[key] = self._pending.get(key, 0) + 1
            note("pending", key)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Around a mutating call: what `guard` counted as pending is released when it ends (its
        audit entry counts from then on)."""
        try:
            yield
        finally:
            key = notes().get("pending")
            if key is not None:
                self._pending[key] -= 1
                if self._pending[key] <= 0:
                    del self._pending[key]

    async def move_cost(self, node: str | None) -> float:
        """The hourly price of the node a move or restore sends work to (0 when the scheduler picks)."""
        found = await self.bus.nodes.get(node) if node and wire.is_token(node) else None
        if found is None:
            return 0.0
        return effective_price(found, await self.bus.prices.values())

    async def Checkpoint(self, request: pb.CheckpointRequest, context: Ctx) -> AsyncIterator[pb.OpUpdate]:
        async def build() -> wire.SchedulerCommand:
            return (await self.checkpoint_cmd(request))[0]

        async for update in self._stream_op("Checkpoint", context, build):
            yield update

    async def Restore(self, request: pb.RestoreRequest, context: Ctx) -> AsyncIterator[pb.OpUpdate]:
        async def build() -> wire.SchedulerCommand:
            cmd, _ = await self.restore_cmd(request)
            await self.guard("Restore", await self.move_cost(cmd.node))
            return cmd

        async for update in self._stream_op("Restore", context, build):
            yield update

    async def Migrate(self, request: pb.MigrateRequest, context: Ctx) -> AsyncIterator[pb.OpUpdate]:
        async def build() -> wire.SchedulerCommand:
            cmd, _ = await self.migrate_cmd(request)
            await self.guard("Migrate", await self.move_cost(cmd.node))
            return cmd

        async for update in self._stream_op("Migrate", context, build):
            yield update

    async def ListCheckpoints(self, request: pb.JobRef, context: Ctx) -> pb.ListCheckpointsResponse:
        try:
            job = await self.resolve(request.job)
        except FerryError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc
        records = sorted(await self.bus.checkpoints.values(prefix=f"{job.id}."), key=lambda c: c.created)
        return pb.ListCheckpointsResponse(checkpoints=[convert.checkpoint_to_pb(c) for c in records])

    async def ListNodes(self, request: pb.ListNodesRequest, context: Ctx) -> pb.ListNodesResponse:
        nodes = sorted(await self.bus.nodes.values(), key=lambda n: n.id)
        return pb.ListNodesResponse(nodes=[convert.node_to_pb(n) for n in nodes])

    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Ctx) -> AsyncIterator[pb.Event]:
        job_id = ""
        if request.job:
            try:
                job_id = (await self.resolve(request.job)).id
            except FerryError as exc:
                await self.fail(context, exc)
                return
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10_000)

        async def on_event(msg: Msg) -> None:
            if wire.is_user_event(msg.subject):
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(msg.data)

        me = caller()
        sub = await self.bus.subscribe(wire.EVT_SUBJECTS, on_event)
        try:
            while True:
                data = await queue.get()
                with contextlib.suppress(wire.WireError):
                    event = wire.decode(Event, data)
                    if job_id and event.job != job_id:
                        continue
                    if event.job and not me.admin and await self.tenant_of(event.job) != me.tenant:
                        continue  # another tenant's job; cluster events (nodes, prices) are everyone's
                    yield convert.event_to_pb(event)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def ReadLogs(self, request: pb.ReadLogsRequest, context: Ctx) -> AsyncIterator[pb.LogChunk]:
        try:
            job = await self.resolve(request.job)
            if request.stream not in ("", "stdout", "stderr"):
                raise UsageError(f"bad stream {request.stream!r}: use stdout or stderr")
        except FerryError as exc:
            await self.fail(context, exc)
            return
        offset = max(0, request.offset)
        stream = request.stream or "stdout"
        while True:
            job = await self.bus.jobs.get(job.id) or job
            data = b""
            reader, stored = await self.log_reader(job)
            if reader:
                try:
                    data = await self.read_log_chunk(reader, wire.LogRequest(job=job.id, stream=stream,
                                                                             offset=offset, stored=stored))
                except (BusError, wire.WireError) as exc:
                    if not request.follow:
                        await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot read logs of {job.name}: {exc}")
            if data:
                yield pb.LogChunk(data=data, offset=offset)
                offset += len(data)
                continue
            if not request.follow or job.state in TERMINAL_STATES:
                return
            await asyncio.sleep(0.3)


    async def DrainNode(self, request: pb.DrainNodeRequest, context: Ctx) -> pb.Node:
        async def build() -> wire.SchedulerCommand:
            cmd = await self.drain_cmd(request)
            await self.guard("DrainNode", undo=request.undo)
            return cmd

        waits = request.wait_s > 0 and not request.undo
        moving = {j.id for j in await self.all_jobs()
                  if j.node == request.node and j.state not in DRAIN_SETTLED} if waits else set()
        await self.unary_op("DrainNode", context, build)
        if waits:
            left = await self._drained(request.node, moving, request.wait_s)
            if left:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, (
                    f"{request.node}: {len(left)} job(s) not yet moved after {request.wait_s:.0f}s: "
                    + ", ".join(f"{j.name} ({j.state})" for j in left)))
        node = await self.bus.nodes.get(request.node)
        assert node is not None
        return convert.node_to_pb(node)

    async def _drained(self, node: str, moving: set[str], wait_s: float) -> list[Job]:
        """Waits, on a watch of every job's record, until no job runs on `node` any more and each of
        `moving` runs elsewhere, is parked or has ended; the jobs left at `wait_s`."""
        deadline = time.monotonic() + wait_s
        async with self.bus.jobs.watching(">") as changed:
            while True:
                changed.clear()
                left = [j for j in await self.all_jobs()
                        if (j.node == node and j.state not in DRAIN_SETTLED)
                        or (j.id in moving and j.state not in DRAIN_SETTLED | {JobState.RUNNING})]
                remaining = deadline - time.monotonic()
                if not left or remaining <= 0:
                    return left
                with contextlib.suppress(TimeoutError):  # a write missed across a reconnect
                    await asyncio.wait_for(changed.wait(), min(remaining, OP_RECHECK_S))

    async def ListPrices(self, request: pb.ListPricesRequest, context: Ctx) -> pb.ListPricesResponse:
        records = sorted(await self.bus.prices.values(), key=lambda p: (p.zone, p.instance_type, p.market))
        return pb.ListPricesResponse(prices=[convert.price_to_pb(p) for p in records])

    async def SetAutoscale(self, request: pb.AutoscalePolicy, context: Ctx) -> pb.AutoscaleStatus:
        """The autoscaler's bounds, checked as `ferry autoscale` checks them (admins only)."""
        with self.span("SetAutoscale", context):
            try:
                caller().require_admin("setting the autoscaler's bounds")
                policy = convert.autoscale_from_pb(request)
                await self.bus.autoscale.put(AUTOSCALE_KEY, policy)
            except FerryError as exc:
                await self.fail(context, exc)
            return await self.autoscale_status()

    async def GetAutoscale(self, request: pb.GetAutoscaleRequest, context: Ctx) -> pb.AutoscaleStatus:
        return await self.autoscale_status()

    async def autoscale_status(self) -> pb.AutoscaleStatus:
        policy = await self.bus.autoscale.get(AUTOSCALE_KEY)
        fleet = sorted(await self.bus.fleet.values(), key=lambda r: (r.since, r.id))
        return pb.AutoscaleStatus(set=policy is not None, policy=convert.autoscale_to_pb(policy or AutoscalePolicy()),
                                  fleet=[convert.fleet_to_pb(r) for r in fleet])

    async def Chaos(self, request: pb.ChaosRequest, context: Ctx) -> pb.ChaosResponse:
        with self.span("Chaos", context):
            try:
                caller().require_admin("chaos")
                if not request.kind.startswith("fail-live-"):
                    await self.require_node(request.node)
                deadline, message = await chaos.inject(self.data_dir, request.kind, request.node, request.in_s)
            except FerryError as exc:
                await self.fail(context, exc)
                raise AssertionError("unreachable") from exc
            return pb.ChaosResponse(node=request.node, deadline=deadline, message=message)

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Ctx) -> pb.WhoAmIResponse:
        me = caller()
        quota = self.tenants.quota(me.tenant)
        used = Usage.of([j for j in await self.live_jobs() if j.tenant == me.tenant])
        return pb.WhoAmIResponse(
            tenant=me.tenant, role=me.role.value, who=me.who, open=self.tenants.open,
            quota=pb.Quota(cpus=quota.cpus or 0, memory_bytes=int(quota.memory or 0), gpus=quota.gpus or 0,
                           jobs=quota.jobs or 0),
            used=pb.Quota(cpus=used.cpus, memory_bytes=used.memory, gpus=used.gpus, jobs=used.jobs))

    async def ListAudit(self, request: pb.ListAuditRequest, context: Ctx) -> pb.ListAuditResponse:
        me = caller()
        if not 0 <= request.since_s <= wire.AUDIT_MAX_AGE_S:  # NaN fails too
            await self.fail(context, UsageError(f"bad --since: between 0 and {wire.AUDIT_MAX_AGE_S // 86400} days "
                                                "(what the audit stream keeps)"))
        if not 0 <= request.limit <= AUDIT_LIMIT_MAX:
            await self.fail(context, UsageError(f"bad --limit {request.limit}: from 1 to {AUDIT_LIMIT_MAX}"))
        subject = wire.AUDIT_SUBJECTS if me.admin else wire.audit_subject(me.tenant)
        since = time.time() - (request.since_s or 86400.0)
        try:
            bodies = await self.bus.read_since(wire.AUDIT_STREAM, subject, since, request.limit or 100)
        except BusError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc
        entries = []
        for body in bodies:
            with contextlib.suppress(wire.WireError):
                entries.append(convert.audit_to_pb(wire.decode(AuditEntry, body)))
        return pb.ListAuditResponse(entries=entries)

    async def GetSignal(self, request: pb.SignalRequest, context: Ctx) -> pb.SignalReply:
        try:
            if request.name == "explain":
                job = await self.resolve(request.job)
                answer: Any = signals.explain(await self.snapshot(job), job)
            elif request.name in signals.SIGNALS:
                answer = signals.SIGNALS[request.name](await self.snapshot())
            else:
                raise UsageError(f"no signal {request.name!r}: use one of "
                                 + ", ".join([*signals.SIGNALS, "explain"]))
        except FerryError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc
        return pb.SignalReply(name=request.name, json=signals.to_json(answer))

    async def Plan(self, request: pb.PlanRequest, context: Ctx) -> pb.PlanReply:
        """The dry run of a mutating call: the call's own checks, its limits, then a description."""
        try:
            plan = await self._plan(request)
        except FerryError as exc:
            await self.fail(context, exc)
            raise AssertionError("unreachable") from exc
        return pb.PlanReply(action=plan.action, summary=plan.summary, json=plan.model_dump_json())

    async def _plan(self, request: pb.PlanRequest) -> plans.Plan:
        which = request.WhichOneof("action")
        if (which == "checkpoint" and request.checkpoint.gang) or (which == "restore" and request.restore.gang):
            raise UsageError("dry runs of a gang's checkpoint or restore are not built yet: drop --dry-run")
        if which == "checkpoint":
            _, job = await self.checkpoint_cmd(request.checkpoint)
            admission.checkpointable(job)
            return plans.checkpoint(await self.snapshot(job), job, request.checkpoint.stop)
        if which == "kill":
            _, job = await self.kill_cmd(request.kill)
            return plans.kill(await self.snapshot(job), job, request.kill.grace_s or 5.0)
        if which == "migrate":
            _, job = await self.migrate_cmd(request.migrate)
            admission.migratable(job)
            admission.not_there(job, request.migrate.to)
            if request.migrate.live:
                admission.live_movable(job)
            plan = plans.migrate(await self.snapshot(), job, request.migrate.to, request.migrate.live)
            await self.guard("Migrate", plan.cost_per_hour, dry_run=True)
            return plan
        if which == "restore":
            _, job = await self.restore_cmd(request.restore)
            admission.restorable(job, request.restore.checkpoint or None)
            plan = plans.restore(await self.snapshot(), job, request.restore.node or None,
                                 request.restore.checkpoint or None)
            await self.guard("Restore", plan.cost_per_hour, dry_run=True)
            return plan
        if which == "drain":
            await self.drain_cmd(request.drain)
            await self.guard("DrainNode", undo=request.drain.undo, dry_run=True)
            return plans.drain(await self.snapshot(), request.drain.node, request.drain.undo)
        raise UsageError("say which call to plan: checkpoint, restore, migrate, drain or kill")

    async def log_reader(self, job: Job) -> tuple[str | None, bool]:
        """Which node serves `job`'s output: its own; for a job that ended on a node that is gone
        (retired by the autoscaler), any ready node, from what the store kept (``stored``)."""
        if not job.node:
            return None, False
        if job.state not in TERMINAL_STATES or await self.bus.nodes.get(job.node) is not None:
            return job.node, False
        ready = [n for n in await self.bus.nodes.values() if n.state == NodeState.READY]
        return (max(ready, key=lambda n: n.heartbeat).id, True) if ready else (None, False)

    async def read_log_chunk(self, node: str, req: wire.LogRequest, patience_s: float = 10.0) -> bytes:
        """One chunk of a job's log from its node; waits out a node service that is restarting."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                reply = wire.decode(wire.LogReply, await self.bus.request(wire.logs_subject(node), req))
            except BusError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            if reply.error:
                raise BusError(reply.error)
            return reply.data


class Api(Service):
    """Serves the gRPC admin API."""

    name = "api"
    jobs: Mirror[Job] | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--grpc", dest="addr", help="HOST:PORT to serve the admin API on (FERRY_ADDR)")
        parser.add_argument("--tls-cert", help="serve TLS with this certificate (PEM; FERRY_TLS_CERT)")
        parser.add_argument("--tls-key", help="and this key (FERRY_TLS_KEY)")
        parser.add_argument("--tls-ca", help="mutual TLS: clients must present a certificate of this CA "
                            "(FERRY_TLS_CA)")
        parser.add_argument("--tokens-file", help="API tokens, tenants and quotas (FERRY_TOKENS_FILE)")

    async def start(self) -> None:
        tenants = Tenants(self.settings.tokens_file, self.settings.token)
        listener = Listener.from_settings(self.settings)
        listener.refuse_if_open(tenants.open)
        bus = await self.connect()
        self.jobs = Mirror(bus.jobs, unique=lambda j: j.name, live=lambda j: not j.terminal)
        await self.jobs.start()
        servicer = AdminServicer(bus, self.settings, self.jobs, tenants)
        self.server = grpc.aio.server(interceptors=[AuthInterceptor(tenants, servicer.write_audit), ErrorInterceptor()])
        pb_grpc.add_FerryAdminServicer_to_server(servicer, self.server)
        if listener.bind(self.server) == 0:
            raise UsageError(f"cannot listen on {self.settings.addr}: is another Ferry API running there?")
        await self.server.start()
        log.info("admin API on %s (%s; %s)", self.settings.addr, listener.describe(),
                 "no tokens: anyone who reaches it is an admin" if tenants.open else "tokens required")

    async def run(self) -> None:
        await self.stopping.wait()

    async def drain(self) -> None:
        await self.server.stop(grace=2)

    async def close(self) -> None:
        if self.jobs is not None:
            await self.jobs.close()
        await super().close()


def main() -> None:
    service_main(Api)


if __name__ == "__main__":
    main()
