"""The scheduler's control loop: what is driven by cluster state and time rather than by one
message (failover, evacuation on a notice or a drain, preempt-and-save, parked jobs coming back,
placement of pending jobs, periodic checkpoints, rebalancing), and the node-state changes that
start it. State-driven, so a restarted scheduler simply carries on."""

import time
from typing import Protocol

import tenacity

from ferry.common import wire
from ferry.common.bus import CasConflict
from ferry.common.config import Settings
from ferry.common.errors import ConflictError, NotFoundError, UsageError
from ferry.common.models import (
    TERMINAL_STATES,
    Event,
    Job,
    JobState,
    JobUsage,
    Node,
    NodeState,
    Op,
    OpKind,
    OpState,
    new_id,
    now,
)
from ferry.common.opargs import CheckpointArgs, ColdMove, RestoreArgs
from ferry.policy import decisions as policy
from ferry.policy import preemption, rightsize
from ferry.policy.views import gpu_assignments, gpu_trouble, job_view, node_views
from ferry.scheduler.ops import evacuate, failover
from ferry.scheduler.ops.step import Placement, Step
from ferry.scheduler.state import ClusterState


class Actions(Protocol):
    """What the control loop asks the scheduler to do (the scheduler service provides them)."""

    async def pick_node(self, job: Job, wanted: str | None, exclude: str | None = None) -> tuple[str | None, str]:
        ...

    async def place(self, job: Job) -> bool:
        ...

    async def checkpoint(self, job: Job, op: Op, *, stop: bool, resumed: bool = False) -> None:
        ...

    async def send_restore(self, job: Job, op: Op) -> None:
        ...

    async def placement(self, job: Job, exclude: str | None = None) -> Placement:
        ...

    async def apply(self, step: Step) -> None:
        ...

    async def begin_move(self, job: Job, op: Op, source: Node, target: str) -> None:
        ...

    async def gang_checkpoint(self, name: str, op: Op, *, stop: bool, periodic: bool = False,
                              reason: str | None = None, parked_by: str = "user") -> None:
        ...

    async def gang_failover(self, name: str, lost: Node, why: str = "") -> None:
        ...

    async def gang_resume(self, name: str) -> None:
        ...


GANG_RETRY_S = 10.0  # a gang's periodic checkpoint that could not start now is tried again after this


class ControlLoop:
    def __init__(self, state: ClusterState, settings: Settings, actions: Actions) -> None:
        self.state, self.settings, self.actions = state, settings, actions
        self.last_review: dict[str, float] = {}

    async def tick(self) -> None:
        """Everything driven by state and time rather than by one message, so that a restarted
        scheduler simply carries on: failover, evacuation, parked jobs coming back, placement of
        pending jobs, periodic checkpoints and rebalancing."""
        t = time.time()
        nodes = {n.id: n for n in await self.state.nodes()}
        for listed in sorted(self.state.live_jobs(), key=lambda j: (-j.priority, j.created)):
            job = self.state.find_job(listed.id)  # a copy, as a gang's transition may have changed it meanwhile
            if job is None or job.state in TERMINAL_STATES:
                continue
            node = nodes.get(job.node) if job.node else None
            if node is not None and node.state == NodeState.LOST and job.state != JobState.PREEMPTED:
                await self.lost(job, node)
            elif job.op is not None:
                continue
            elif job.state == JobState.PENDING and job.node is None:
                await self.actions.place(job)
            elif job.state == JobState.PREEMPTED and job.parked_by == "capacity":
                await self.unpark(job)
            elif job.state != JobState.RUNNING or node is None:
                continue
            elif node.state in (NodeState.DRAINING, NodeState.PREEMPTING):
                await self.evacuate(job, node)
            elif (trouble := gpu_trouble(job, node)) is not None:
                await self.state.emit(Event(kind="gpu_fault", job=job.id, node=node.id, message=trouble[1]))
                if trouble[0]:  # the GPU still answers: a final checkpoint, then elsewhere
                    await self.evacuate(job, node)
                else:  # it does not: from the last checkpoint, as if the node were lost
                    await self.failover(job, node, why=f"GPU fault on {node.id}: {trouble[1]}")
            elif job.next_checkpoint_at and t >= job.next_checkpoint_at:
                await self.periodic_checkpoint(job, t)
            elif t - self.last_review.get(job.id, 0.0) > self.settings.rebalance_every_s:
                self.last_review[job.id] = t
                await self.review(job, node)

    async def lost(self, job: Job, node: Node) -> None:
        if job.gang:
            await self.actions.gang_failover(job.gang, node)
        else:
            await self.failover(job, node)

    async def unpark(self, job: Job) -> None:
        if job.gang:
            await self.actions.gang_resume(job.gang)
        else:
            await self.resume_parked(job)

    async def periodic_checkpoint(self, job: Job, t: float) -> None:
        """A job's checkpoint is due; a gang member's: the whole gang's group checkpoint. A gang
        that cannot be checkpointed now (a member starting or busy) is tried again a little later."""
        if not job.gang:
            op = Op(id=new_id("op"), kind=OpKind.CHECKPOINT, job=job.id, args=CheckpointArgs(periodic=True))
            await self.state.save_op(op)
            await self.actions.checkpoint(job, op, stop=False)
            return
        gang = job.gang
        try:
            await self.actions.gang_checkpoint(gang, Op(id=new_id("op"), kind=OpKind.CHECKPOINT), stop=False,
                                               periodic=True)
        except ConflictError as exc:
            job.next_checkpoint_at = t + min(job.checkpoint_every_s, GANG_RETRY_S)
            job.reason = f"periodic group checkpoint of gang {gang} postponed: {exc}"
            await self.state.save_job(job)

    async def failover(self, job: Job, node: Node, why: str = "") -> None:
        """`node` is gone (or `job`'s GPU there): bring `job` back elsewhere from its last
        checkpoint, or from scratch (``ops.failover``)."""
        in_flight = await self.state.op(job.op) if job.op else None
        placement = await self.actions.placement(job, exclude=node.id) if job.last_checkpoint else Placement(None)
        step = failover.on_lost(job, in_flight, node.id, placement, why=why, restore_op=new_id("op"), now=now())
        await self.actions.apply(step)
        if step.job.state == JobState.PENDING and step.job.node is None:
            await self.actions.place(step.job)

    async def evacuate(self, job: Job, node: Node) -> None:
        """Moves `job` off a draining or preempted node (``ops.evacuate``). When nothing can take
        it, lower-priority jobs elsewhere are parked to make room (preempt-and-save); when that does
        not help either, `job` itself is parked with its final checkpoint."""
        if job.supervised_elsewhere:  # its caller's supervisor restarts it: save it where it is, never move it
            placement = Placement(None, "it runs in the foreground of a `--here` command there")
        else:
            placement = await self.actions.placement(job, exclude=node.id)
        if placement.node is None and not job.supervised_elsewhere and await self.make_room(job, exclude=node.id):
            return  # the victims are being parked; the next tick moves `job`
        op, event = evacuate.plan(job, node, placement, new_id("op"))
        await self.state.save_op(op)
        await self.state.emit(event)
        if placement.node is None:
            await self.actions.checkpoint(job, op, stop=True, resumed=True)
        else:
            job.gpu_uuids = list(placement.gpus)  # the GPUs the job gets on its target
            await self.actions.begin_move(job, op, node, placement.node)

    async def make_room(self, job: Job, exclude: str) -> bool:
        """Parks lower-priority jobs on one usable node so that `job` fits there; False if no set of
        lower-priority jobs on any node would make room. Jobs already being parked count as gone."""
        t = now()
        jobs = [j for j in self.state.live_jobs() if j.id != job.id]
        views = node_views(await self.state.nodes(), jobs, t, self.settings.heartbeat_timeout_s)
        found = preemption.victims(job_view(job, t), jobs, views, exclude)
        if found is None:
            return False
        where, chosen = found
        for seen in chosen:
            victim = self.state.find_job(seen.id)  # a copy: parking it changes it
            if victim is None or victim.op is not None:
                continue
            if victim.gang:  # a gang is parked whole, with one group checkpoint
                why = f"parked to make room for {job.name} (priority {job.priority})"
                try:
                    await self.actions.gang_checkpoint(victim.gang, Op(id=new_id("op"), kind=OpKind.CHECKPOINT),
                                                       stop=True, reason=why, parked_by="capacity")
                except ConflictError:
                    continue  # busy now: the next tick finds it again
                continue
            op = Op(id=new_id("op"), kind=OpKind.CHECKPOINT, job=victim.id,
                    args=CheckpointArgs(parked_by="user" if victim.supervised_elsewhere else "capacity",
                                        reason=f"parked to make room for {job.name} (priority {job.priority})"))
            await self.state.save_op(op)
            await self.state.emit(Event(kind="preempting", job=victim.id, node=where,
                                        message=f"parking it for {job.name} (priority {job.priority})"))
            await self.actions.checkpoint(victim, op, stop=True)
        return True

    async def resume_parked(self, job: Job) -> None:
        target, why = await self.actions.pick_node(job, None)
        if target is None:
            first = (job.reason or "parked").split("; waiting for capacity:")[0]
            reason = f"{first}; waiting for capacity: {why}"
            if job.reason != reason:
                job.reason = reason
                await self.state.save_job(job)
            return
        op = Op(id=new_id("op"), kind=OpKind.RESTORE, job=job.id, state=OpState.RUNNING, phase="restore",
                checkpoint=job.last_checkpoint, args=RestoreArgs(resume=True, target=target))
        await self.state.save_op(op)
        job.state, job.op, job.node = JobState.RESTORING, op.id, target
        job.incarnation += 1
        await self.state.save_job(job, "resuming", f"capacity is back: restoring {job.last_checkpoint} on {target}")
        await self.actions.send_restore(job, op)

    async def review(self, job: Job, node: Node) -> None:
        """A running job's periodic look: right-sizing first (when asked for), then rebalancing."""
        if not (job.right_size and await self.right_size(job, node)):
            await self.rebalance(job, node)

    async def right_size(self, job: Job, node: Node) -> bool:
        """``ferry.policy.rightsize`` for a running `job` with what its node sampled: its request
        follows its use, and it moves when it outgrows its node. True when a move began."""
        usage = node.usage.get(job.id)
        if usage is None or job.supervised_elsewhere:
            return False
        t = now()
        views = node_views(await self.state.nodes(), self.state.live_jobs(), t, self.settings.heartbeat_timeout_s,
                           await self.state.prices())
        current = next((v for v in views if v.id == node.id), None)
        if current is None:
            return False
        resize = rightsize.decide(job_view(job, t), usage.rss_bytes, usage.peak_rss_bytes, current, views, t,
                                  outgrown=job.outgrown)
        gpu = await self.gpu_resize(job, node, usage, views, t) if resize is None or resize.move_to is None else None
        chosen = [r for r in (resize, gpu) if r is not None]
        if not chosen:
            return False
        data: dict[str, int | float] = {"rss_bytes": usage.rss_bytes}
        if resize is not None:
            job.memory_bytes = data["memory_bytes"] = resize.memory_bytes
        if gpu is not None:
            job.gpu_memory_bytes = data["gpu_memory_bytes"] = gpu.memory_bytes
            data["gpu_used_bytes"] = usage.peak_gpu_memory_bytes
        job.outgrown = any(r.outgrown for r in chosen)
        reason = "; ".join(r.reason for r in chosen)
        job.reason = reason if job.outgrown else None
        await self.state.save_job(job)
        await self.state.emit(Event(kind="right_sized", job=job.id, node=node.id, message=reason, data=data))
        target = next((r.move_to for r in chosen if r.move_to is not None), None)
        if target is None or job.requested_node:
            return False
        await self.move_for(job, node, target, reason)
        return True

    async def gpu_resize(self, job: Job, node: Node, usage: JobUsage, views: list[policy.NodeView],
                         t: float) -> rightsize.Resize | None:
        """GPU memory right-sizing: its GPUs' size from its node's record, and the nodes whose free
        GPUs would hold the new request from the scheduler's GPU placement."""
        mine = [g for g in node.gpu_list if g.get("uuid") in job.gpu_uuids]
        if not job.gpus or not mine or not usage.peak_gpu_memory_bytes:
            return None
        capacity = min(int(g.get("memory_total", 0)) for g in mine)
        wanted = rightsize.new_gpu_request(job.gpu_memory_bytes, usage.gpu_memory_bytes,
                                           usage.peak_gpu_memory_bytes, capacity)
        fitting: list[policy.NodeView] = []
        if wanted is not None and wanted[0] > capacity:
            bigger = job.model_copy(update={"gpu_memory_bytes": wanted[0], "gpu_uuids": []})
            others = [j for j in self.state.live_jobs() if j.id != job.id]
            where = gpu_assignments(bigger, self.state.node_records(), others)  # read only: no copies
            fitting = [v for v in views if isinstance(where.get(v.id), list)]
        return rightsize.decide_gpu(job_view(job, t), job.gpu_memory_bytes, usage.gpu_memory_bytes,
                                    usage.peak_gpu_memory_bytes, capacity, node.id, fitting, t)

    async def move_for(self, job: Job, node: Node, target: str, reason: str) -> None:
        """A move the scheduler decided itself (rebalancing, right-sizing), said as an event."""
        op = Op(id=new_id("op"), kind=OpKind.MIGRATE, job=job.id,
                args=ColdMove(target=target, source=node.id, rebalance=reason))
        await self.state.save_op(op)
        await self.state.emit(Event(kind="rebalancing", job=job.id, node=node.id, message=f"to {target}: {reason}"))
        await self.actions.begin_move(job, op, node, target)

    async def rebalance(self, job: Job, node: Node) -> None:
        """Moves `job` when a better node saves more over its remaining time than a move costs."""
        if job.requested_node or job.supervised_elsewhere or not job.last_checkpoint:
            return
        t = now()
        views = node_views(await self.state.nodes(), [j for j in self.state.live_jobs() if j.id != job.id], t,
                           self.settings.heartbeat_timeout_s, await self.state.prices())
        current = next((v for v in views if v.id == node.id), None)
        jv = job_view(job, t)
        best, _ = policy.best_node(jv, [v for v in views if v.usable and v.id != node.id], t)
        if current is None or best is None:
            return
        remaining = jv.remaining_s if jv.remaining_s is not None else (
            (job.deadline - t) if job.deadline else self.settings.rebalance_horizon_s)
        decision = policy.should_move(jv, current, best, t, max(remaining, 0.0), job.last_move_at)
        if decision.move:
            await self.move_for(job, node, best.id, decision.reason)

    async def set_node_state(self, node_id: str, state: NodeState, **fields: object) -> Node:
        """Compare-and-set of a node's state (its own heartbeat writes the record too)."""

        async def attempt() -> Node:
            found = await self.state.bus.nodes.get_rev(node_id)
            if found is None:
                raise NotFoundError(f"no node {node_id!r}: `ferry nodes` lists them")
            node, rev = found
            node.state = state
            for key, value in fields.items():
                setattr(node, key, value)
            self.state.noted_node(node, await self.state.bus.nodes.update(node_id, node, rev))
            return node

        try:
            return await tenacity.AsyncRetrying(
                retry=tenacity.retry_if_exception_type(CasConflict), stop=tenacity.stop_after_attempt(20),
                wait=tenacity.wait_fixed(0.05), reraise=True)(attempt)
        except CasConflict:
            raise ConflictError(f"node {node_id} keeps changing; try again") from None

    async def on_notice(self, ev: wire.NodeEvent) -> None:
        node = self.state.find_node(ev.node)
        if node is None or (node.notice_deadline == ev.deadline and node.state == NodeState.PREEMPTING):
            return
        await self.set_node_state(ev.node, NodeState.PREEMPTING, notice_deadline=ev.deadline,
                                  preemptions=node.preemptions + 1)
        left = (ev.deadline or now()) - now()
        await self.state.emit(Event(kind="spot_notice", node=ev.node,
                                    message=f"{ev.node} goes away in {left:.0f}s: evacuating its jobs"))
        await self.tick()  # evacuate now, highest priority first

    async def drain_node(self, cmd: wire.SchedulerCommand, op: Op) -> None:
        if not cmd.node:
            raise UsageError("say which node to drain")
        node = await self.state.node(cmd.node)
        if cmd.stop:  # undo
            if node.state == NodeState.DRAINING:
                await self.set_node_state(cmd.node, NodeState.READY)
            await self.state.emit(Event(kind="undrained", node=cmd.node, message=f"{cmd.node} takes work again"))
        else:
            await self.set_node_state(cmd.node, NodeState.DRAINING)
            await self.state.emit(Event(kind="draining", node=cmd.node, message=f"{cmd.node}: moving its jobs away"))
        await self.state.finish_op(op.id)
        await self.tick()
