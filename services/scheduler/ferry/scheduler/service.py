"""The scheduler: owns every decision that starts, stops or moves a job. This module is the
shell: it loads the records, calls the operations' pure transitions (``ferry.scheduler.ops``) and
carries out what they return (``ferry.scheduler.effects``); ``ferry.scheduler.control`` holds
what is driven by state and time.

It consumes user commands (`ferry.cmd.scheduler`) and node reports (`ferry.evt.node.>`) from
durable JetStream consumers, one at a time under one lock, and writes jobs and ops to KV. Every
handler is idempotent: ids are derived from the op id and node commands are published with a
message id, so a redelivered message after a crash repeats nothing.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence

from nats.aio.msg import Msg
from opentelemetry import trace

from ferry.common import wire
from ferry.common.errors import AlreadyExistsError, ConflictError, FerryError, UsageError, kind_of
from ferry.common.jobnet import allocate
from ferry.common.models import CheckpointRecord, Event, Job, JobState, Network, Node, Op, OpKind, new_id, now
from ferry.common.opargs import (
    CheckpointArgs,
    ColdMove,
    GangCheckpointArgs,
    GangRestoreArgs,
    LiveMove,
    Plain,
    RestoreArgs,
)
from ferry.common.service import Service, service_main
from ferry.common.tracing import extract, tracer
from ferry.policy import admission, gangs
from ferry.policy import decisions as policy
from ferry.policy.netplan import published_conflict, with_job_network
from ferry.policy.placement import LATE_HEARTBEAT
from ferry.policy.views import ViewCache, gpu_assignments, job_view, wants_live
from ferry.scheduler.control import ControlLoop
from ferry.scheduler.effects import Effects
from ferry.scheduler.ops import checkpoint, gang, live_move, restore, run
from ferry.scheduler.ops.live_move import RESENDABLE, live_phase
from ferry.scheduler.ops.step import Placement, Step, derived_id, next_checkpoint_at, no_op
from ferry.scheduler.state import ClusterState
from ferry.sim.faults import take_live_fault

log = logging.getLogger(__name__)
_tracer = tracer("scheduler")
LATE_RETRY_S = 0.25


class Scheduler(Service):
    """Places jobs, checkpoints them on schedule, restores and moves them."""

    name = "scheduler"

    async def start(self) -> None:
        bus = await self.connect()
        self.state = ClusterState(bus)
        self.view_cache = ViewCache()  # node views between placements (ferry.policy.views)
        self.last_address: str | None = None  # the job-network address given last: the next is looked for after it
        # node id -> the number of the policy's last pick of it: equal nodes take turns (policy.spread_key)
        self.last_given: dict[str, int] = {}
        self.picks = itertools.count()
        self.effects = Effects(self.state)
        self.control = ControlLoop(self.state, self.settings, self)
        await self.state.start()
        self.lock = asyncio.Lock()
        async with self.lock:
            await self.resume_in_flight()

    async def close(self) -> None:
        if hasattr(self, "state"):
            await self.state.close()
        await super().close()

    async def resume_in_flight(self) -> None:
        """Sends again the node command of every op a previous scheduler left in flight: node
        commands are idempotent and deduplicated, so whatever had already arrived is not repeated."""
        gang_ops: set[str] = set()
        for job in await self.state.jobs():
            op = await self.state.op(job.op) if job.op else None
            if op is None or op.finished or not job.node:
                continue
            if isinstance(op.args, GangCheckpointArgs | GangRestoreArgs):
                if op.id not in gang_ops:
                    gang_ops.add(op.id)
                    log.info("resuming the %s of gang %s (phase %s)", op.kind, op.args.gang, op.phase or "-")
                    await self.effects.apply(gang.resend(self.gang_of(op), op))
                continue
            log.info("resuming %s of %s (phase %s)", op.kind, job.name, op.phase or "-")
            if live_phase(op) in RESENDABLE:
                await self.effects.apply(live_move.resend(job, op))
            elif op.phase == "restore":
                await self.effects.apply(restore.resend(job, op))
            elif op.phase == "checkpoint":
                await self.effects.apply(checkpoint.resend(job, op))
            elif op.kind == OpKind.SUBMIT and job.state == JobState.PENDING:
                await self.send_node(job, "checkpointer", wire.NodeCommand(kind="launch", op=job.op, job=job,
                                                                             incarnation=job.incarnation))

    async def run(self) -> None:
        assert self.bus is not None
        loops = [
            self.bus.consume(stream=wire.CMD_STREAM, durable="scheduler", subject=wire.SCHEDULER_CMD,
                             handler=self.on_command, stop=self.stopping,
                             drain_s=self.settings.drain_timeout_s),
            self.bus.consume(stream=wire.EVT_STREAM, durable="scheduler-node-events",
                             subject=wire.NODE_EVENTS, handler=self.on_node_event, stop=self.stopping,
                             drain_s=self.settings.drain_timeout_s),
            self.tick_loop(),
        ]
        await asyncio.gather(*loops)

    # ---- commands from the API -------------------------------------------------------------

    async def on_command(self, msg: Msg) -> None:
        try:
            cmd = wire.decode(wire.SchedulerCommand, msg.data)
        except wire.WireError as exc:
            # a requester waits on the op the command names: end it rather than leave it waiting
            op_id = wire.op_of(msg.data)
            log.warning("refused a malformed command%s: %s", f" (op {op_id})" if op_id else "", exc)
            if op_id is not None:
                async with self.lock:
                    await self.state.finish_op(op_id, error=str(exc), error_code=2, error_kind="UsageError")
            return
        with _tracer.start_as_current_span(f"scheduler.{cmd.kind}", context=extract(msg.headers)) as span:
            span.set_attribute("ferry.op", cmd.op)
            span.set_attribute("ferry.job", cmd.job)
            async with self.lock:
                op = await self.state.op(cmd.op) or Op(id=cmd.op, kind=cmd.kind, job=cmd.job)
                if op.finished:
                    return
                try:
                    await self.dispatch(cmd, op)
                except FerryError as exc:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                    await self.state.save_op(op)
                    await self.state.finish_op(op.id, error=str(exc), error_code=exc.exit_code,
                                               error_kind=kind_of(exc))

    async def dispatch(self, cmd: wire.SchedulerCommand, op: Op) -> None:
        if cmd.kind == OpKind.SUBMIT:
            await self.submit(cmd, op)
            return
        if cmd.kind == OpKind.DRAIN:
            await self.control.drain_node(cmd, op)
            return
        if cmd.gang and cmd.kind == OpKind.CHECKPOINT:
            await self.gang_checkpoint(cmd.gang, op, stop=cmd.stop)
            return
        if cmd.gang and cmd.kind == OpKind.RESTORE:
            await self.gang_restore(cmd.gang, op, nodes=cmd.nodes, allow_colocate=cmd.allow_colocate)
            return
        job = await self.state.job(cmd.job)
        resumed = job.op == op.id  # a redelivery of an op this scheduler already started
        if cmd.kind == OpKind.KILL:
            await self.kill(job, op, cmd.grace_s)
        elif cmd.kind == OpKind.CHECKPOINT:
            if isinstance(op.args, Plain):
                op.args = CheckpointArgs()
            await self.checkpoint(job, op, stop=cmd.stop, resumed=resumed)
        elif cmd.kind == OpKind.RESTORE:
            if isinstance(op.args, Plain):
                op.args = RestoreArgs()
            await self.restore(job, op, node_id=cmd.node, checkpoint_id=cmd.checkpoint, resumed=resumed,
                               here=cmd.here)
        elif cmd.kind == OpKind.MIGRATE:
            if isinstance(op.args, Plain):
                op.args = ColdMove(criu_args=["--tcp-established"] if cmd.tcp_established else [])
            await self.migrate(job, op, to=cmd.node, live=cmd.live, resumed=resumed)

    async def submit(self, cmd: wire.SchedulerCommand, op: Op) -> None:
        spec = cmd.spec
        if spec is None or not spec.argv:
            raise UsageError("empty command: give the program to run after `--`")
        job_id = derived_id("job", op.id)
        job = self.state.find_job(job_id)
        if job is None:
            other = self.state.job_named(spec.name)
            if other is not None:
                raise AlreadyExistsError(f"a job named {spec.name!r} exists already ({other.id}, "
                                         f"{other.state}); pick another name")
            if spec.gang and any(o.tenant != spec.tenant for o in self.state.gang_named(spec.gang)):
                raise AlreadyExistsError(f"the gang name {spec.gang!r} is taken; pick another")
            if spec.node:
                await self.state.node(spec.node)
            address = None
            if spec.network == Network.BRIDGE:
                # indexed lookups: a submit costs the same however many jobs ran before
                holders = self.state.publishers((m.proto, m.host) for m in spec.publish)
                problem = published_conflict(spec.publish, holders)
                if problem:
                    raise UsageError(problem)
                address = allocate(self.settings.job_network, self.state.taken_addresses(), after=self.last_address)
                self.last_address = address
            new = spec.to_job(job_id, op.id)
            new.address = address
            placement = await self.placement(new, wanted=new.requested_node)
            created = run.submit(new, op, placement=placement)
            await self.effects.apply(created)  # placed: recorded, accepted and launched in one step
            if placement.node is None:
                await self.effects.apply(run.place(created.job, created.op, placement, now()))
            return
        # a redelivered submit whose job is recorded already
        accepted = run.accept(job, op)
        await self.effects.apply(accepted)
        if job.state == JobState.PENDING:
            await self.place(job, accepted.op)

    async def place(self, job: Job, op: Op | None = None) -> bool:
        """Sends a pending job to a node; False (with the reason on the job) when none fits.
        `op`: the job's op in flight, when the caller holds it (read from the bucket otherwise)."""
        placement = await self.placement(job, wanted=job.requested_node)
        if op is None or op.id != job.op:
            op = await self.state.op(job.op) if job.op else None
        await self.effects.apply(run.place(job, op, placement, now()))
        return placement.node is not None

    async def pick_node(self, job: Job, wanted: str | None, exclude: str | None = None) -> tuple[str | None, str]:
        """The node `job` should go to now (the policy's pick, or `wanted` if it can take it),
        or None with the reason why none can. For a GPU job it also assigns the GPUs there."""
        t = now()
        others = [j for j in self.state.live_jobs() if j.id != job.id]
        nodes = self.state.node_records()
        views = self.view_cache.views(nodes, others, t, self.settings.heartbeat_timeout_s, await self.state.prices())
        if job.network == Network.BRIDGE:
            views = with_job_network(views, nodes)
        gpu_fit = gpu_assignments(job, nodes, others)
        jv = job_view(job, t)
        if wanted:
            view = next((v for v in views if v.id == wanted), None)
            if view is None:
                return None, f"node {wanted} has not joined the cluster"
            problem = view.reason if not view.usable else policy.fit_problem(jv, view)
            fit = gpu_fit.get(wanted, [])
            if not problem and isinstance(fit, str):
                problem = fit
            if problem:
                return None, f"{wanted}: {problem}"
            job.gpu_uuids = fit if isinstance(fit, list) else []
            return wanted, ""
        candidates = [v for v in views if v.usable and v.id != exclude and isinstance(gpu_fit.get(v.id, []), list)]
        best = policy.choose_node(jv, candidates, t, last_given=self.last_given) if candidates else None
        if best is None:
            pool = [v for v in views if v.id != exclude]
            gpu_why = sorted({f"{n}: {w}" for n, w in gpu_fit.items() if isinstance(w, str) and n != exclude})
            if job.gpus and gpu_why and not candidates:
                return None, "; ".join(gpu_why)
            return None, policy.unplaced_reason(jv, pool) if pool else "no other node has joined the cluster"
        fit = gpu_fit.get(best.id, [])
        job.gpu_uuids = fit if isinstance(fit, list) else []
        self.last_given[best.id] = next(self.picks)
        return best.id, ""

    # ---- gangs ---------------------------------------------------------------------------------

    def gang_of(self, op: Op) -> list[Job]:
        """The member jobs a gang op works on."""
        args = op.args
        ids = args.members if isinstance(args, GangCheckpointArgs) else \
            list(args.members) if isinstance(args, GangRestoreArgs) else []
        return [j for j in (self.state.find_job(i) for i in ids) if j is not None]

    async def gang_checkpoint(self, name: str, op: Op, *, stop: bool, periodic: bool = False,
                              reason: str | None = None, parked_by: str = "user") -> None:
        if isinstance(op.args, GangCheckpointArgs):  # a redelivery of one this scheduler began
            await self.effects.apply(gang.resend(self.gang_of(op), op))
            return
        members = gangs.gang_members(self.state.gang_jobs(name), name)
        gangs.gang_checkpointable(name, members)
        fault = take_live_fault(self.settings.data_dir, ("round",)) is not None
        await self.effects.apply(gang.begin_checkpoint(name, members, op, stop=stop, now=now(), periodic=periodic,
                                                       reason=reason, parked_by=parked_by, fault=fault))

    async def gang_restore(self, name: str, op: Op, *, nodes: list[str], allow_colocate: bool) -> None:
        if isinstance(op.args, GangRestoreArgs):
            await self.effects.apply(gang.resend(self.gang_of(op), op))
            return
        members = gangs.gang_members(self.state.gang_jobs(name), name)
        groups = await self.state.bus.gangs.values(prefix=f"{wire.token(name)}.") if members else []
        group = gangs.gang_restorable(name, members, gangs.newest_group(groups, members))
        for node_id in nodes:
            await self.state.node(node_id)  # NotFoundError for an unknown node
        targets: dict[str, str] | None = gangs.assign_nodes(members, nodes, allow_colocate=allow_colocate)
        if targets:  # the user's nodes: each checked as a restore there would be
            for job in members:
                await self._target(job.model_copy(update={"state": JobState.PREEMPTED}), targets[job.id])
        else:
            targets = await self.gang_targets(members, set(), colocate=allow_colocate)
            if targets is None:
                raise ConflictError(f"cannot place gang {name}: no node for each member"
                                    + ("" if allow_colocate else " (add --allow-colocate to let members share nodes)"))
        await self.effects.apply(gang.begin_restore(name, members, op, group, targets))

    async def gang_failover(self, name: str, lost: Node, why: str = "") -> None:
        """A member's node is lost: the whole gang back from its newest group checkpoint
        (``gang.failover``), on a node each (sharing nodes only when there are too few)."""
        # a member that failed meanwhile (it lost its peer on the lost node) comes back with the gang
        members = gangs.gang_members(self.state.gang_jobs(name), name)
        groups = await self.state.bus.gangs.values(prefix=f"{wire.token(name)}.")
        group = gangs.newest_group(groups, members)
        targets = await self.gang_targets(members, {lost.id}) if group is not None else None
        ops = {j.op for j in members if j.op}
        in_flight = [op for op in [await self.state.op(i) for i in ops] if op is not None and not op.finished]
        op = Op(id=new_id("op"), kind=OpKind.RESTORE)
        for extra in in_flight[1:]:
            await self.state.finish_op(extra.id, error=f"node {lost.id} was lost during the operation")
        step = gang.failover(name, members, in_flight[0] if in_flight else None, op, lost.id, group, targets, now())
        log.warning("gang %s: node %s lost%s; %s", name, lost.id, f" ({why})" if why else "",
                    f"restoring group {group.id}" if group and targets else "no group checkpoint or no room")
        await self.effects.apply(step)

    async def gang_resume(self, name: str) -> None:
        """A gang parked for capacity comes back whole once every member fits somewhere."""
        members = [j for j in self.state.gang_jobs(name) if not j.terminal]
        if not members or any(j.state != JobState.PREEMPTED or j.parked_by != "capacity" or j.op for j in members):
            return
        group = gangs.newest_group(await self.state.bus.gangs.values(prefix=f"{wire.token(name)}."), members)
        targets = await self.gang_targets(members, set()) if group is not None else None
        if group is None or targets is None:
            return
        op = Op(id=new_id("op"), kind=OpKind.RESTORE)
        await self.effects.apply(gang.begin_restore(name, members, op, group, targets))

    async def gang_targets(self, members: list[Job], exclude: set[str], *, colocate: bool = True
                           ) -> dict[str, str] | None:
        """A node for each member, each its own while there are enough (then, if `colocate`, shared);
        None when one fits nowhere."""
        targets: dict[str, str] = {}
        placed: list[Job] = []  # the members assigned so far, counted on their targets
        moving = {j.id for j in members}
        for job in members:
            probe = job.model_copy(update={"state": JobState.PREEMPTED, "node": None})
            target, _ = await self.pick_node_excluding(probe, exclude | set(targets.values()), placed=placed,
                                                       moving=moving)
            if target is None and colocate:
                target, _ = await self.pick_node_excluding(probe, exclude, placed=placed, moving=moving)
            if target is None:
                return None
            targets[job.id] = target
            placed.append(job.model_copy(update={"state": JobState.RUNNING, "node": target}))
        return targets

    async def pick_node_excluding(self, job: Job, exclude: set[str], *, placed: Sequence[Job] = (),
                                  moving: set[str] | None = None) -> tuple[str | None, str]:
        """`placed`: jobs counted where they are about to go (a gang's members already assigned);
        `moving`: jobs whose current place does not count (the gang's own members)."""
        t = now()
        others = [j for j in self.state.live_jobs() if j.id != job.id and j.id not in (moving or set())]
        others += placed
        nodes = self.state.node_records()
        views = self.view_cache.views(nodes, others, t, self.settings.heartbeat_timeout_s, await self.state.prices())
        if job.network == Network.BRIDGE:
            views = with_job_network(views, nodes)
        candidates = [v for v in views if v.usable and v.id not in exclude]
        jv = job_view(job, t)
        best = policy.choose_node(jv, candidates, t, last_given=self.last_given) if candidates else None
        if best is None:
            pool = [v for v in views if v.id not in exclude]
            return None, policy.unplaced_reason(jv, pool) if pool else "no other node is free for it"
        self.last_given[best.id] = next(self.picks)
        return best.id, ""

    async def on_gang_event(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(ev.op) if ev.op else None
        if op is None or not isinstance(op.args, GangCheckpointArgs | GangRestoreArgs):
            return
        members, t = self.gang_of(op), now()
        if ev.kind == "gang_locked":
            await self.effects.apply(gang.on_locked(members, op, job.id))
        elif ev.kind == "gang_lock_failed":
            await self.effects.apply(gang.on_member_failed(members, op, job.id, ev.error or "lock failed", t))
        elif ev.kind == "gang_released":
            await self.effects.apply(gang.on_released(members, op, job.id, t))

    async def kill(self, job: Job, op: Op, grace_s: float) -> None:
        await self.effects.apply(run.kill(job, op, grace_s, now()))

    async def checkpoint(self, job: Job, op: Op, *, stop: bool, resumed: bool = False) -> None:
        if not resumed:
            admission.checkpointable(job)
        await self.effects.apply(checkpoint.begin(job, op, stop=stop))

    async def restore(self, job: Job, op: Op, *, node_id: str | None, checkpoint_id: str | None,
                      resumed: bool = False, here: bool = False) -> None:
        if resumed:
            await self.send_restore(job, op)
            return
        ckpt_id = admission.restorable(job, checkpoint_id)
        await self.state.checkpoint(job, ckpt_id)
        target = await self._target(job, node_id)
        await self.effects.apply(restore.begin(job, op, target=target, checkpoint=ckpt_id,
                                               pinned=checkpoint_id is not None, here=here))

    async def send_restore(self, job: Job, op: Op) -> None:
        await self.effects.apply(restore.resend(job, op))

    async def apply(self, step: Step) -> None:
        await self.effects.apply(step)

    async def migrate(self, job: Job, op: Op, *, to: str | None, live: bool, resumed: bool) -> None:
        if resumed:
            if live_phase(op) in RESENDABLE:
                await self.effects.apply(live_move.resend(job, op))
            elif op.phase == "restore":
                await self.send_restore(job, op)
            elif live_phase(op) == "postcopy":
                return  # the target reports when its memory is all there
            else:
                await self.checkpoint(job, op, stop=True, resumed=True)
            return
        admission.migratable(job)
        if not to:
            raise UsageError("say where to: `ferry migrate JOB --to NODE`")
        target = await self._target(job, to)
        admission.not_there(job, target)
        if live:
            admission.live_movable(job)
            await self.start_live(job, op, target)
            return
        assert isinstance(op.args, ColdMove)
        op.args.target, op.args.source = target, job.node
        await self.checkpoint(job, op, stop=True, resumed=True)

    async def begin_move(self, job: Job, op: Op, source: Node, target: str) -> None:
        """A move the scheduler decided (drain, notice, rebalance): live when the policy wants it
        (``decisions.wants_live``), else cold."""
        dest = self.state.find_node(target)
        if dest is not None and wants_live(job, source, dest, now()):
            await self.start_live(job, op, target)
        else:
            await self.checkpoint(job, op, stop=True, resumed=True)

    async def start_live(self, job: Job, op: Op, target: str) -> None:
        """Starts a live move of running `job` to `target` (already checked to fit)."""
        assert job.node
        source, dest = await self.state.node(job.node), await self.state.node(target)
        why = live_move.why_not_postcopy(source, dest)
        if why is not None:
            log.info("live move of %s without post-copy (%s): pre-copy rounds, then the delta", job.name, why)
        fresh = await self._fresh_fallback(job) if why is None else None
        await self.effects.apply(live_move.start(job, op, source=source, target=dest, fresh=fresh,
                                                 fault=take_live_fault(self.settings.data_dir), now=now()))

    async def _fresh_fallback(self, job: Job) -> CheckpointRecord | str:
        """The job's last checkpoint if it can replace a post-copy move's pre-copy round, else why
        not (``live_move.fresh_fallback``)."""
        last = None
        if job.last_checkpoint and job.checkpoint_every_s > 0:  # without an interval it is never fresh
            last = await self.state.bus.checkpoints.get(wire.ckpt_key(job.id, job.last_checkpoint))
        return live_move.fresh_fallback(job, last, now())

    async def _target(self, job: Job, node_id: str | None, exclude: str | None = None) -> str:
        """The node a user's restore or move goes to. A node that is only late with its heartbeat
        (busy with a big checkpoint, or reconnecting to the bus) gets the time health gives it
        before it is refused: the user's request waits rather than fails on a node that is fine."""
        if node_id:
            await self.state.node(node_id)  # NotFoundError for an unknown node
        deadline = time.monotonic() + self.settings.heartbeat_timeout_s
        while True:
            target, why = await self.pick_node(job, node_id, exclude=exclude)
            if target is not None:
                return target
            if LATE_HEARTBEAT not in why or time.monotonic() >= deadline:
                raise ConflictError(f"cannot place job {job.name}: {why}")
            await asyncio.sleep(LATE_RETRY_S)
            with contextlib.suppress(FerryError):  # this copy of the nodes may be what is late
                await self.state.reread_nodes()

    async def send_node(self, job: Job, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        assert cmd.job.node == job.node
        await self.effects.send(service, cmd)

    async def placement(self, job: Job, exclude: str | None = None, wanted: str | None = None) -> Placement:
        """Where `job` could go now (``pick_node`` without touching `job`)."""
        probe = job.clone()
        target, why = await self.pick_node(probe, wanted, exclude=exclude)
        return Placement(target, why, tuple(probe.gpu_uuids) if target else ())

    # ---- reports from the nodes ------------------------------------------------------------

    async def on_node_event(self, msg: Msg) -> None:
        ev = wire.decode(wire.NodeEvent, msg.data)
        with _tracer.start_as_current_span(f"scheduler.on_{ev.kind}", context=extract(msg.headers)):
            async with self.lock:
                if ev.kind == "notice":
                    await self.control.on_notice(ev)
                    return
                job = self.state.find_job(ev.job)
                if job is None:
                    log.warning("event %s for unknown job %s", ev.kind, ev.job)
                    return
                if ev.checkpoint is not None and ev.kind.startswith("checkpoint"):
                    await self.on_checkpoint(job, ev)
                    return
                if ev.kind.startswith("gang_"):  # keyed by the op: a failover's survivors end as older incarnations
                    await self.on_gang_event(job, ev)
                    return
                if ev.incarnation != job.incarnation:
                    log.info("ignoring %s of %s from stale incarnation %s (now %s)", ev.kind, job.name,
                             ev.incarnation, job.incarnation)
                    return
                handler = {
                    "started": self.on_started,
                    "launch_failed": self.on_launch_failed,
                    "exited": self.on_exited,
                    "restored": self.on_restored,
                    "restore_failed": self.on_restore_failed,
                    "checkpoints_expired": self.on_checkpoints_expired,
                }.get(ev.kind)
                if handler is not None:
                    await handler(job, ev)
                elif ev.kind.startswith("live_"):
                    await self.on_live_event(job, ev)

    async def on_checkpoints_expired(self, job: Job, ev: wire.NodeEvent) -> None:
        """An ended job's checkpoints are gone from the store (keep_ended_s): so go their records."""
        for gone in ev.deleted_checkpoints:
            await self.state.bus.checkpoints.delete(wire.ckpt_key(job.id, gone))
        job.last_checkpoint, job.checkpoints = None, 0
        await self.state.save_job(job)
        await self.state.emit(Event(kind="checkpoints_expired", job=job.id, node=ev.node,
                                    message=f"{len(ev.deleted_checkpoints)} checkpoint(s) of the ended job deleted",
                                    data={"deleted": ev.deleted_checkpoints}))

    async def on_started(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        await self.effects.apply(run.on_started(job, op, ev, now()))

    async def on_launch_failed(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        await self.effects.apply(run.on_launch_failed(job, op, ev, now()))

    async def on_exited(self, job: Job, ev: wire.NodeEvent) -> None:
        if ev.by_checkpoint or job.terminal:
            return
        code = ev.exit_code if ev.exit_code is not None else 128 + (ev.signal or 0)
        op = await self.state.op(job.op) if job.op else None
        if live_phase(op) == "resume":
            return  # the source died while frozen: live_resume finds out and falls back to a checkpoint
        if op is not None and live_phase(op) in ("switch", "postcopy"):
            assert isinstance(op.args, LiveMove)
            step = live_move.on_target_exited(job, op, code, self.state.find_node(op.args.source),
                                              await self.placement(job), now())
            await self.effects.apply(step)
            if code != 0:
                return
        kill_op = await self.state.op(job.kill_op) if job.kill_op else None
        await self.effects.apply(run.on_exited(job, op, kill_op, ev, now()))

    async def on_checkpoint(self, job: Job, ev: wire.NodeEvent) -> None:
        record = ev.checkpoint
        assert record is not None
        record.job_name = job.name
        fresh = await self.state.save_checkpoint(record)
        op = await self.state.op(ev.op) if ev.op else None
        ours = job.op is not None and job.op == ev.op
        if ours and op is None:  # its record is gone: end the job's part of it all the same
            op = no_op(job, OpKind.CHECKPOINT)
        for gone in ev.deleted_checkpoints:  # the node's retention policy removed these from the store
            if gone != record.id:
                await self.state.bus.checkpoints.delete(wire.ckpt_key(job.id, gone))
        if ours and op is not None and isinstance(op.args, GangCheckpointArgs):
            if ev.kind == "checkpoint_committed" and fresh:
                job.checkpoints += 1
                await self.state.save_job(job)
            if ev.kind == "checkpoint_committed":
                step = gang.on_member_committed(self.gang_of(op), op, job.id, record, now())
            else:
                step = gang.on_member_failed(self.gang_of(op), op, job.id, record.error or "its dump failed", now())
            await self.effects.apply(step)
            return
        if ev.kind == "checkpoint_committed":
            if fresh:
                job.last_checkpoint = record.id
                job.checkpoints += 1
            await self.state.emit(Event(kind="checkpointed", job=job.id, node=ev.node,
                                        message=f"{record.id}: {record.bytes_uploaded} bytes uploaded",
                                        data={"checkpoint": record.id}))
            if not ours or op is None:
                await self.state.save_job(job)
            elif op.kind == OpKind.MIGRATE and live_phase(op) == "precopy":
                await self.effects.apply(live_move.on_round(job, op, record, now()))
            else:
                await self.effects.apply(checkpoint.on_committed(job, op, record, now()))
        elif not ours or op is None:
            job.next_checkpoint_at = next_checkpoint_at(job, now())
            await self.state.save_job(job)
        else:
            await self.effects.apply(checkpoint.on_failed(job, op, record, now()))

    async def on_restored(self, job: Job, ev: wire.NodeEvent) -> None:
        if job.state not in (JobState.RESTORING, JobState.MIGRATING):
            return
        op = await self._op_of(job, OpKind.RESTORE)
        if isinstance(op.args, GangRestoreArgs):
            await self.effects.apply(gang.on_member_restored(self.gang_of(op), op, ev, now()))
        elif live_phase(op) == "switch":
            await self.effects.apply(live_move.on_restored(job, op, ev))
        else:
            await self.effects.apply(restore.on_restored(job, op, ev, now()))

    async def on_restore_failed(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self._op_of(job, OpKind.RESTORE)
        if isinstance(op.args, GangRestoreArgs):
            await self.effects.apply(gang.on_member_restore_failed(self.gang_of(op), op, ev, now()))
            return
        if isinstance(op.args, LiveMove) and op.phase == "switch":
            await self.effects.apply(live_move.on_target_failed(
                job, op, ev.error or "the live restore failed", self.state.find_node(op.args.source),
                await self.placement(job), now()))
            return
        checkpoints = await self.state.bus.checkpoints.values(prefix=f"{job.id}.") if ev.unverifiable else []
        await self.effects.apply(restore.on_restore_failed(job, op, ev, checkpoints, now()))

    async def _op_of(self, job: Job, kind: OpKind) -> Op:
        """The job's op; one that has ended already (changing nothing) when its record is gone."""
        op = await self.state.op(job.op) if job.op else None
        return op or no_op(job, kind)

    async def on_live_event(self, job: Job, ev: wire.NodeEvent) -> None:
        """The reports of a live move's two halves (``ferry.scheduler.ops.live_move``)."""
        op = await self.state.op(job.op) if job.op else None
        if op is None or not isinstance(op.args, LiveMove):
            return
        t = now()
        if ev.kind == "live_frozen":
            await self.effects.apply(live_move.on_frozen(job, op, ev))
        elif ev.kind == "live_freeze_failed":
            await self.effects.apply(live_move.on_freeze_failed(job, op, ev, t))
        elif ev.kind == "live_local":
            await self.effects.apply(live_move.on_local(job, op, ev, t))
        elif ev.kind == "live_resumed":
            await self.effects.apply(live_move.on_resumed(job, op, ev, t))
        elif ev.kind == "live_resume_failed":
            await self.effects.apply(live_move.on_resume_failed(job, op, ev, await self.placement(job), t))
        elif ev.kind == "live_lost":
            source = self.state.find_node(op.args.source)
            await self.effects.apply(live_move.on_lost(job, op, ev, source, await self.placement(job), t))

    # ---- time-driven work ------------------------------------------------------------------

    async def tick_loop(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.5)
            if self.stopping.is_set():
                break
            try:
                async with self.lock:
                    await self.control.tick()
            except FerryError as exc:
                log.warning("tick: %s", exc)
            except Exception:
                log.exception("tick failed")


def main() -> None:
    service_main(Scheduler)


if __name__ == "__main__":
    main()
