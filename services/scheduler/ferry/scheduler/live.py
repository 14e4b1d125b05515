"""Live moves, as the scheduler drives them (op phases in brackets):

    [precopy]   rounds of ordinary checkpoints while the job runs: each ships to the store only the
                chunks it does not have yet, and each is a committed checkpoint to fall back on
    [freeze]    post-copy: the source freezes, sends all but the memory, its page server listens
    [switch]    the target restores at once with lazy pages (incarnation + 1: the fencing token)
    [postcopy]  the job runs on the target while its memory arrives; then the source is ended
    pre-copy only (a node without post-copy): after the rounds, a final checkpoint ships only the
                delta and the target restores it ([checkpoint], [restore], as a cold move)

How many rounds: with post-copy the freeze ships no memory at all, so one round is enough (it is
the committed checkpoint that a failed post-copy falls back on), and none when the job's last
periodic checkpoint is younger than its interval (as good a fallback as the job has anyway).
Without post-copy, rounds go on while they pay, by P.Haul's rule (``precopy_done``). Without
soft-dirty tracking every round is a full dump that freezes the job for its duration: the rounds'
cost is in the op's result.

Failures: a round or the freeze failing leaves the source running (the op fails); the target
failing before or after it ran makes the source resume (``live_resume``); a source that is gone by
then, or lost, means a restore from the last committed checkpoint. The job never runs twice: the
source stays frozen (SIGSTOP) until the target has every page, and is killed only then.
"""

import logging
from typing import Any

from ferry.common import wire
from ferry.common.config import Settings
from ferry.common.errors import ConflictError
from ferry.common.models import CheckpointRecord, Event, Job, JobState, Node, NodeState, Op, OpState, now
from ferry.scheduler.state import ClusterState
from ferry.sim.faults import take_live_fault

log = logging.getLogger(__name__)

MAX_ROUNDS = 8
ALMOST_NOTHING = 0.02  # of the first round's bytes
GROWTH = 1.10


RESENDABLE = ("precopy", "freeze", "switch", "resume")
"""Phases whose node command a restarted scheduler sends again (``resume_live``)."""


def live_phase(op: Op | None) -> str | None:
    """The phase of a live move, or None when `op` is not one."""
    return op.phase if op is not None and op.args.get("live") else None


def precopy_done(shipped: list[int], max_rounds: int = MAX_ROUNDS) -> bool:
    """P.Haul's rule over the bytes each round shipped: stop after ``max_rounds``, after a round that
    shipped almost nothing (2% of the first), or after one that shipped 10% more than the one before."""
    if not shipped:
        return False
    if len(shipped) >= max_rounds:
        return True
    if len(shipped) >= 2 and shipped[-1] <= ALMOST_NOTHING * max(shipped[0], 1):
        return True
    return len(shipped) >= 2 and shipped[-1] > GROWTH * shipped[-2]


def live_result(job: Job, op: Op) -> dict[str, Any]:
    """What `ferry migrate --live -o json` prints, from what the nodes reported."""
    a = op.args
    frozen, restored, local = a.get("frozen", {}), a.get("restored", {}), a.get("local", {})
    rounds = a.get("rounds", [])
    last, first = frozen.get("last_write_at"), local.get("first_write_at")
    running_at = restored.get("running_at")
    return {
        "job": job.name, "from": a.get("source"), "to": a.get("target"), "mode": a.get("mode"),
        "rounds": len(rounds),
        "bytes_precopy": sum(int(r["bytes_uploaded"]) for r in rounds),
        "bytes_final": frozen.get("bytes_final", a.get("final_bytes")),
        "round_freeze_ms": [r["freeze_ms"] for r in rounds],
        "freeze_ms": frozen.get("freeze_ms", a.get("final_freeze_ms")),
        "downtime_ms": (first - last) * 1000 if first is not None and last is not None else None,
        "switch_ms": ((running_at - frozen["frozen_at"]) * 1000 if running_at and frozen.get("frozen_at")
                      else None),
        "restore_ms": restored.get("restore_ms"),
        "degraded_ms": local.get("degraded_ms"),
        "bytes_lazy": local.get("bytes_lazy"),
        "total_ms": (now() - op.created) * 1000,
    }


class LiveMoves:
    """Mixed into the Scheduler, which provides the attributes and actions declared here."""

    state: ClusterState
    settings: Settings

    async def send_node(self, job: Job, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        raise NotImplementedError

    async def checkpoint(self, job: Job, op: Op, *, stop: bool, resumed: bool = False) -> None:
        raise NotImplementedError

    async def _send_restore(self, job: Job, op: Op) -> None:
        raise NotImplementedError

    async def pick_node(self, job: Job, wanted: str | None, exclude: str | None = None) -> tuple[str | None, str]:
        raise NotImplementedError

    def _schedule_next_checkpoint(self, job: Job) -> None:
        raise NotImplementedError

    # ---- starting ------------------------------------------------------------------------------

    async def start_live(self, job: Job, op: Op, target: str) -> None:
        """Starts a live move of running `job` to `target` (already checked to fit)."""
        assert job.node
        source, dest = await self.state.node(job.node), await self.state.node(target)
        postcopy = source.lazy_pages and dest.lazy_pages
        if not postcopy:
            why = "; ".join(f"{n.id}: {n.lazy_pages_error or 'no post-copy'}" for n in (source, dest)
                            if not n.lazy_pages)
            log.info("live move of %s without post-copy (%s): pre-copy rounds, then the delta", job.name, why)
        op.args.update({"live": True, "mode": "postcopy" if postcopy else "precopy", "target": target,
                        "source": job.node, "source_incarnation": job.incarnation, "rounds": []})
        fault = take_live_fault(self.settings.data_dir)
        if fault is not None:
            op.args["fault"] = fault
        job.state, job.op, job.moving_to = JobState.MIGRATING, op.id, target
        await self.state.emit(Event(kind="live_move", job=job.id, node=job.node,
                                    message=f"to {target} ({op.args['mode']})"))
        fresh = await self._fresh_checkpoint(job) if postcopy else None
        if fresh is not None:  # a round would freeze the job for a whole dump and buy nothing
            op.state, op.job = OpState.RUNNING, job.id
            op.args["fallback_checkpoint"] = fresh.id
            await self._freeze(job, op, fresh.id)
            return
        await self._live_round(job, op)

    def _node_data(self, op: Op, phase: str) -> dict[str, Any]:
        """What the node command of `phase` carries besides its job: CRIU options, an armed fault."""
        extra: dict[str, Any] = {"criu_args": op.args["criu_args"]} if op.args.get("criu_args") else {}
        return extra | ({"fail": phase} if op.args.get("fault") == phase else {})

    async def _live_round(self, job: Job, op: Op) -> None:
        n = len(op.args["rounds"]) + 1
        ckpt = f"ck-{op.id.split('-', 1)[-1]}-r{n}"
        op.state, op.phase, op.checkpoint, op.job = OpState.RUNNING, "precopy", ckpt, job.id
        await self.state.save_op(op)
        await self.state.save_job(job)
        await self.resume_live(job, op)

    async def resume_live(self, job: Job, op: Op) -> None:
        """After a scheduler restart: send the command of the phase in flight again (node commands
        are deduplicated by id, so one that had arrived is not repeated)."""
        if op.phase == "precopy" and op.checkpoint:
            await self.send_node(job, "checkpointer", wire.NodeCommand(
                kind="checkpoint", op=op.id, job=job, incarnation=job.incarnation, checkpoint=op.checkpoint,
                parent=job.last_checkpoint, data=self._node_data(op, "round")))
        elif op.phase == "freeze":
            await self.send_node(job, "checkpointer", wire.NodeCommand(
                kind="live_freeze", op=op.id, job=job, incarnation=job.incarnation, checkpoint=op.args["images"],
                data=self._node_data(op, "freeze") | self._node_data(op, "source")))
        elif op.phase == "switch":
            frozen = op.args["frozen"]
            data = {k: frozen[k] for k in ("address", "port", "store_job", "images", "stdout_path", "stderr_path")}
            await self.send_node(job, "migrator", wire.NodeCommand(
                kind="live_restore", op=op.id, job=job, incarnation=job.incarnation, checkpoint=op.args["images"],
                data=data | self._node_data(op, "restore") | self._node_data(op, "postcopy")))
        elif op.phase == "resume":
            await self.send_node(job, "checkpointer", wire.NodeCommand(
                kind="live_resume", op=op.id, job=job, incarnation=job.incarnation,
                checkpoint=op.args.get("images")))

    async def begin_move(self, job: Job, op: Op, source: Node, target: str) -> None:
        """A move the scheduler decided (drain, notice, rebalance): live when `wants_live`, else cold."""
        dest = await self.state.bus.nodes.get(target)
        if dest is not None and self.wants_live(job, source, dest):
            await self.start_live(job, op, target)
        else:
            await self.checkpoint(job, op, stop=True, resumed=True)

    # ---- node reports --------------------------------------------------------------------------

    async def on_live_round(self, job: Job, op: Op, record: Any) -> None:
        """A pre-copy round committed (it is the job's newest checkpoint now)."""
        op.args["rounds"].append({"checkpoint": record.id, "bytes_uploaded": record.bytes_uploaded,
                                  "bytes_logical": record.bytes_logical, "freeze_ms": record.freeze_ms})
        if op.args["mode"] == "postcopy":
            await self._freeze(job, op, record.id)
            return
        if not precopy_done([int(r["bytes_uploaded"]) for r in op.args["rounds"]]):
            await self._live_round(job, op)
            return
        op.checkpoint = None  # the final checkpoint: then the target restores it, as in a cold move
        await self.checkpoint(job, op, stop=True, resumed=True)

    async def _freeze(self, job: Job, op: Op, checkpoint: str) -> None:
        """Post-copy: the target loads its restore while the source freezes (`checkpoint`, committed,
        tells the target where the job's output files were)."""
        op.phase = "freeze"
        op.args["images"] = f"lv-{op.id.split('-', 1)[-1]}"
        await self.state.save_op(op)
        await self.state.save_job(job)
        target = job.model_copy(update={"node": op.args["target"]})
        await self.send_node(target, "migrator", wire.NodeCommand(
            kind="live_prepare", op=op.id, job=target, incarnation=job.incarnation + 1, checkpoint=checkpoint,
            data=self._node_data(op, "prepare")))
        await self.resume_live(job, op)

    async def _fresh_checkpoint(self, job: Job) -> CheckpointRecord | None:
        """The job's last checkpoint when it is younger than the job's own checkpoint interval: as
        good a fallback as the job has anyway, so a post-copy move needs no pre-copy round."""
        if not job.last_checkpoint or job.checkpoint_every_s <= 0:
            return None
        record = await self.state.bus.checkpoints.get(wire.ckpt_key(job.id, job.last_checkpoint))
        if record is None or record.state != "committed" or now() - record.created > job.checkpoint_every_s:
            return None
        return record

    async def on_live_frozen(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        if op is None or ev.op != op.id or op.phase != "freeze":
            return
        op.args["frozen"] = ev.data
        op.phase = "switch"
        await self.state.save_op(op)
        job.incarnation += 1
        job.node = str(op.args["target"])
        await self.state.save_job(job, "migrating", f"live: restoring on {job.node} with lazy pages")
        await self.resume_live(job, op)

    async def on_live_freeze_failed(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        if op is None or ev.op != op.id:
            return
        await self._live_failed(job, op, ev.error or "the final dump failed")

    async def on_live_restored(self, job: Job, op: Op, ev: wire.NodeEvent) -> None:
        """The target runs (its memory still arriving)."""
        op.args["restored"] = ev.data
        op.phase = "postcopy"
        op.restore_ms = ev.restore_ms
        await self.state.save_op(op)
        # still `migrating` until the source is no longer needed (a drain waits for that)
        job.node, job.error, job.reason = ev.node, None, f"runs on {ev.node}; its memory is still arriving"
        await self.state.save_job(job, "restored", f"live on {ev.node} (pid {ev.pid}); memory still arriving")

    async def on_live_local(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        if op is None or ev.op != op.id or op.phase != "postcopy":
            return
        op.args["local"] = ev.data
        await self._end_source(job, op)
        job.state, job.reason, job.moving_to = JobState.RUNNING, None, None
        job.restarts += 1
        job.last_move_at = now()
        result = live_result(job, op)  # move_cost_s stays a cold move's: what wants_live compares with
        self._schedule_next_checkpoint(job)
        job.op = None
        await self.state.save_job(job, "live_moved", f"on {ev.node}; downtime {result['downtime_ms'] or 0:.0f} ms")
        await self.state.finish_op(op.id, restore_ms=op.restore_ms, result=result)

    async def _end_source(self, job: Job, op: Op) -> None:
        source = job.model_copy(update={"node": op.args["source"], "incarnation": op.args["source_incarnation"]})
        await self.send_node(source, "checkpointer", wire.NodeCommand(
            kind="live_end", op=op.id, job=source, incarnation=source.incarnation, checkpoint=op.args.get("images")))

    async def on_live_target_failed(self, job: Job, op: Op, error: str) -> None:
        """The target failed (before or after it ran; its copy is gone): the source resumes."""
        op.args["target_error"] = error
        source_id = str(op.args["source"])
        source_node = await self.state.bus.nodes.get(source_id)
        job.incarnation = int(op.args["source_incarnation"])
        job.node = source_id
        if source_node is None or source_node.state == NodeState.LOST:
            await self._fall_back(job, op, f"{error}; the source {source_id} is lost")
            return
        op.phase = "resume"
        await self.state.save_op(op)
        await self.state.save_job(job, "migrate_rollback", f"live: {error}; resuming on {source_id}")
        await self.resume_live(job, op)

    async def on_live_resumed(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        if op is None or ev.op != op.id:
            return
        await self._live_failed(job, op, str(op.args.get("target_error", "the target failed")))

    async def on_live_resume_failed(self, job: Job, ev: wire.NodeEvent) -> None:
        op = await self.state.op(job.op) if job.op else None
        if op is None or ev.op != op.id:
            return
        await self._fall_back(job, op, f"{op.args.get('target_error')}; {ev.error}")

    async def _live_failed(self, job: Job, op: Op, error: str) -> None:
        """The source runs (again): the job is as it was before the move."""
        job.state, job.node, job.op, job.moving_to = JobState.RUNNING, str(op.args["source"]), None, None
        job.incarnation = int(op.args["source_incarnation"])
        self._schedule_next_checkpoint(job)
        await self.state.save_job(job, "live_move_failed", f"{error}; it runs on {job.node}")
        await self.state.finish_op(op.id, error=f"live move failed: {error}; {job.name} runs on {job.node} as before",
                                   result=live_result(job, op))

    async def _fall_back(self, job: Job, op: Op, error: str) -> None:
        """Neither copy runs: restore from the last committed checkpoint (a pre-copy round at worst)."""
        if not job.last_checkpoint:
            job.state, job.op, job.error = JobState.FAILED, None, error
            await self.state.save_job(job, "failed", error)
            await self.state.finish_op(op.id, error=f"live move failed: {error}, and there is no checkpoint")
            return
        target, why = await self.pick_node(job, None)
        if target is None:
            job.state, job.op, job.parked_by = JobState.PREEMPTED, None, "capacity"
            job.reason = f"live move failed ({error}); waiting for capacity: {why}"
            await self.state.save_job(job, "preempted", job.reason)
            await self.state.finish_op(op.id, error=f"live move failed: {error}; the job is parked")
            return
        op.args["fallback_error"] = error
        op.phase, op.checkpoint = "restore", job.last_checkpoint
        op.args["target"] = target
        await self.state.save_op(op)
        job.state, job.node, job.moving_to = JobState.RESTORING, target, None
        job.incarnation = max(job.incarnation, int(op.args["source_incarnation"]) + 1) + 1
        await self.state.save_job(job, "restoring", f"live move failed ({error}): {job.last_checkpoint} on {target}")
        await self._send_restore(job, op)

    # ---- policy --------------------------------------------------------------------------------

    def wants_live(self, job: Job, source: Node, target: Node) -> bool:
        """For moves the scheduler starts itself: live when the job's SLA bounds its downtime below
        what a cold move costs, and, under a spot notice, when the time left covers a live move
        (its memory must leave the source before the source dies) three times over."""
        if job.max_downtime_s is None or job.max_downtime_s >= job.move_cost_s or job.gpu_uuids:
            return False
        if not (source.lazy_pages and target.lazy_pages):
            return False
        if source.state == NodeState.PREEMPTING and source.notice_deadline is not None:
            return source.notice_deadline - now() > 3 * max(job.move_cost_s, 10.0)
        return True

    def refuse_live(self, job: Job) -> None:
        if job.gpu_uuids:
            raise ConflictError(f"job {job.name} uses GPUs: CUDA state cannot be served lazily; drop --live")
