"""The live move's pure transitions (ferry.scheduler.ops.live_move), phase by phase and failure by
failure, without a bus: what the job and op become and which node commands go where."""

from ferry.common import wire
from ferry.common.models import CheckpointRecord, Job, JobState, Node, NodeState, Op, OpKind, OpState
from ferry.common.moves import LiveFrozen, LiveLocal, LiveRestored
from ferry.common.opargs import ColdMove, LiveMove, Round
from ferry.scheduler.ops import live_move
from ferry.scheduler.ops.step import Emit, Placement, SaveJob, SaveOp, Step

NOW = 10_000.0
MIB = 2**20


def job(**kw: object) -> Job:
    fields: dict[str, object] = {"id": "job-1", "name": "t1", "argv": ["x"], "node": "a", "state": JobState.RUNNING,
                                 "incarnation": 3, "last_checkpoint": "ck-old", "checkpoint_every_s": 60.0}
    return Job(**(fields | kw))


def node(id: str, lazy: bool = True, **kw: object) -> Node:
    return Node(id=id, lazy_pages=lazy, **kw)


def record(id: str, uploaded: int = 100 * MIB, **kw: object) -> CheckpointRecord:
    return CheckpointRecord(id=id, job="job-1", bytes_uploaded=uploaded, freeze_ms=300.0, **kw)


def frozen() -> LiveFrozen:
    return LiveFrozen(address="10.0.0.1", port=4242, store_job="job-1.live", images="lv-abc", stdout_path="out",
                      stderr_path="err", bytes_final=2 * MIB, freeze_ms=40.0, frozen_at=NOW, last_write_at=NOW)


def sent(step: Step) -> list[tuple[str, str | None, str, int]]:
    """(service, node, kind, incarnation) of each node command, in order."""
    return [(c.service, c.cmd.job.node, c.cmd.kind, c.cmd.incarnation) for c in step.commands()]


def events(step: Step) -> list[str]:
    return [e.event for e in step.effects if isinstance(e, SaveJob) and e.event is not None]


def in_phase(phase: str, **kw: object) -> tuple[Job, Op]:
    """A job in the middle of a post-copy move from a (incarnation 3) to b."""
    fields: dict[str, object] = {"rounds": [Round(checkpoint="ck-abc-r1", bytes_uploaded=100 * MIB)]}
    args = LiveMove(source="a", target="b", source_incarnation=3, images="lv-abc", **(fields | kw))
    op = Op(id="op-abc", kind=OpKind.MIGRATE, job="job-1", state=OpState.RUNNING, phase=phase, args=args,
            created=NOW - 5)
    moved = phase in ("switch", "postcopy")
    j = job(state=JobState.MIGRATING, op=op.id, moving_to="b", node="b" if moved else "a",
            incarnation=4 if moved else 3)
    return j, op


def start(source: Node, target: Node, fresh: CheckpointRecord | str | None = None, **kw: object) -> Step:
    op = Op(id="op-abc", kind=OpKind.MIGRATE, job="job-1", args=ColdMove(target="b", source="a",
                                                                         criu_args=["--tcp-established"]))
    return live_move.start(job(), op, source=source, target=target, fresh=fresh, fault=None, now=NOW, **kw)


# ---- starting ----------------------------------------------------------------------------------

def test_a_post_copy_move_begins_with_one_pre_copy_round_on_the_source() -> None:
    s = start(node("a"), node("b"))
    a = s.op.args
    assert isinstance(a, LiveMove) and a.mode == "postcopy" and (a.source, a.target) == ("a", "b")
    assert a.source_incarnation == 3 and a.criu_args == ["--tcp-established"]
    assert (s.job.state, s.job.op, s.job.moving_to) == (JobState.MIGRATING, "op-abc", "b")
    assert (s.op.phase, s.op.checkpoint, s.op.state) == ("precopy", "ck-abc-r1", OpState.RUNNING)
    assert sent(s) == [("checkpointer", "a", "checkpoint", 3)]
    assert s.commands()[0].cmd.options.criu_args == ["--tcp-established"]
    assert any(isinstance(e, Emit) and e.event.kind == "live_move" for e in s.effects)
    assert a.round_why is None  # nobody said why


def test_the_round_says_what_would_have_let_the_move_skip_it() -> None:
    old = record("ck-old", state="committed", created=NOW - 120)  # the job's interval is 60 s
    why = live_move.fresh_fallback(job(), old, NOW)
    assert isinstance(why, str) and why == "its last checkpoint is older than its interval (60s)"
    s = start(node("a"), node("b"), fresh=why)
    assert isinstance(s.op.args, LiveMove) and s.op.args.round_why == why and s.op.phase == "precopy"
    assert "--checkpoint-every" in str(live_move.fresh_fallback(job(checkpoint_every_s=0.0), old, NOW))
    assert live_move.fresh_fallback(job(last_checkpoint=None), None, NOW) == "the job has no checkpoint yet"
    assert live_move.fresh_fallback(job(), None, NOW) == "its last checkpoint ck-old is not committed"
    young = record("ck-old", state="committed", created=NOW - 30)
    assert live_move.fresh_fallback(job(), young, NOW) is young
    pre = start(node("a"), node("b", lazy=False, lazy_pages_error="no userfaultfd"), fresh=why)
    assert isinstance(pre.op.args, LiveMove) and pre.op.args.round_why is None  # pre-copy: rounds are the move


def test_a_fresh_periodic_checkpoint_replaces_the_round_and_the_source_freezes_at_once() -> None:
    s = start(node("a"), node("b"), fresh=record("ck-periodic"))
    assert isinstance(s.op.args, LiveMove) and s.op.args.fallback_checkpoint == "ck-periodic"
    assert s.op.args.round_why is None
    assert s.op.phase == "freeze" and s.op.args.images == "lv-abc"
    # the target prepares its restore (as the next incarnation) while the source freezes
    assert sent(s) == [("migrator", "b", "live_prepare", 4), ("checkpointer", "a", "live_freeze", 3)]
    assert s.commands()[0].cmd.checkpoint == "ck-periodic"


def test_without_post_copy_on_either_node_the_move_is_pre_copy_rounds() -> None:
    s = start(node("a"), node("b", lazy=False, lazy_pages_error="no userfaultfd"), fresh=record("ck-periodic"))
    assert isinstance(s.op.args, LiveMove) and s.op.args.mode == "precopy"
    assert s.op.phase == "precopy" and sent(s) == [("checkpointer", "a", "checkpoint", 3)]
    assert live_move.why_not_postcopy(node("a"), node("b", lazy=False, lazy_pages_error="no uffd")) == "b: no uffd"
    assert live_move.why_not_postcopy(node("a"), node("b")) is None


def test_start_leaves_what_it_was_given_alone() -> None:
    j, op = job(), Op(id="op-abc", kind=OpKind.MIGRATE, args=ColdMove(target="b"))
    before = (j.model_dump(), op.model_dump())
    live_move.start(j, op, source=node("a"), target=node("b"), fresh=None, fault="freeze", now=NOW)
    assert (j.model_dump(), op.model_dump()) == before


def test_an_armed_fault_goes_only_to_the_command_of_its_phase() -> None:
    op = Op(id="op-abc", kind=OpKind.MIGRATE, args=ColdMove(target="b"))
    s = live_move.start(job(), op, source=node("a"), target=node("b"), fresh=record("ck-p"), fault="freeze", now=NOW)
    assert [c.cmd.options.fail for c in s.commands()] == [None, "freeze"]


# ---- rounds ------------------------------------------------------------------------------------

def test_with_post_copy_the_committed_round_freezes_the_source() -> None:
    j, op = in_phase("precopy", rounds=[])
    s = live_move.on_round(j, op, record("ck-abc-r1"), NOW)
    assert isinstance(s.op.args, LiveMove) and [r.checkpoint for r in s.op.args.rounds] == ["ck-abc-r1"]
    assert s.op.phase == "freeze"
    assert sent(s) == [("migrator", "b", "live_prepare", 4), ("checkpointer", "a", "live_freeze", 3)]


def test_pre_copy_rounds_go_on_while_they_pay_then_a_final_checkpoint_ships_the_delta() -> None:
    j, op = in_phase("precopy", mode="precopy", rounds=[])
    s = live_move.on_round(j, op, record("ck-abc-r1", 1024 * MIB), NOW)
    assert (s.op.phase, s.op.checkpoint) == ("precopy", "ck-abc-r2")
    s = live_move.on_round(s.job, s.op, record("ck-abc-r2", 10 * MIB), NOW)  # under 2% of the first
    assert (s.op.phase, s.op.checkpoint) == ("checkpoint", "ck-abc")
    assert sent(s) == [("checkpointer", "a", "checkpoint", 3)] and s.commands()[0].cmd.stop


# ---- the switch ----------------------------------------------------------------------------------

def test_frozen_source_hands_over_to_the_target_with_the_next_incarnation() -> None:
    j, op = in_phase("freeze")
    ev = wire.NodeEvent(kind="live_frozen", node="a", job="job-1", incarnation=3, op="op-abc", live=frozen())
    s = live_move.on_frozen(j, op, ev)
    assert s is not None and s.op.phase == "switch" and (s.job.node, s.job.incarnation) == ("b", 4)
    assert sent(s) == [("migrator", "b", "live_restore", 4)]
    pages = s.commands()[0].cmd.pages
    assert pages is not None and (pages.address, pages.port, pages.images) == ("10.0.0.1", 4242, "lv-abc")


def test_reports_of_another_op_or_phase_change_nothing() -> None:
    j, op = in_phase("switch")
    ev = wire.NodeEvent(kind="live_frozen", node="a", job="job-1", incarnation=3, op="op-abc", live=frozen())
    assert live_move.on_frozen(j, op, ev) is None  # not in the freeze any more
    other = ev.model_copy(update={"op": "op-other"})
    assert live_move.on_freeze_failed(j, op, other, NOW) is None
    assert live_move.on_resumed(j, op, other, NOW) is None
    assert live_move.on_resume_failed(j, op, other, Placement("c"), NOW) is None
    lost = wire.NodeEvent(kind="live_lost", node="b", job="job-1", incarnation=4, op="op-abc")
    assert live_move.on_lost(j, op, lost, node("a"), Placement("c"), NOW) is None  # only in post-copy
    local = wire.NodeEvent(kind="live_local", node="b", job="job-1", incarnation=4, op="op-abc")
    assert live_move.on_local(j, op, local, NOW) is None


def test_a_failed_freeze_leaves_the_job_running_on_the_source() -> None:
    j, op = in_phase("freeze")
    ev = wire.NodeEvent(kind="live_freeze_failed", node="a", job="job-1", incarnation=3, op="op-abc", error="boom")
    s = live_move.on_freeze_failed(j, op, ev, NOW)
    assert s is not None and (s.job.state, s.job.node, s.job.op, s.job.moving_to) == (JobState.RUNNING, "a", None, None)
    assert s.job.next_checkpoint_at == NOW + 60.0
    assert s.op.state == OpState.FAILED and s.op.error is not None and "boom" in s.op.error
    assert "runs on a as before" in s.op.error and events(s) == ["live_move_failed"] and not sent(s)


def test_the_target_runs_then_every_page_arrives_and_the_source_is_ended() -> None:
    j, op = in_phase("switch")
    ev = wire.NodeEvent(kind="restored", node="b", job="job-1", incarnation=4, op="op-abc", pid=7, restore_ms=90.0,
                        live=LiveRestored(restore_ms=80.0, running_at=NOW + 0.2))
    s = live_move.on_restored(j, op, ev)
    assert s.op.phase == "postcopy" and s.op.restore_ms == 90.0
    assert s.job.state == JobState.MIGRATING and s.job.node == "b"  # the source is still needed
    local = wire.NodeEvent(kind="live_local", node="b", job="job-1", incarnation=4, op="op-abc",
                           live=LiveLocal(first_write_at=NOW + 0.25, degraded_ms=800.0))
    op2 = s.op.model_copy(update={"args": s.op.args.model_copy(update={"frozen": frozen()})})
    done = live_move.on_local(s.job, op2, local, NOW)
    assert done is not None and done.op.state == OpState.DONE
    assert (done.job.state, done.job.op, done.job.moving_to, done.job.restarts) == (JobState.RUNNING, None, None, 1)
    assert sent(done) == [("checkpointer", "a", "live_end", 3)]  # the source's own incarnation
    assert abs(done.op.result["downtime_ms"] - 250.0) < 1e-6 and events(done) == ["live_moved"]


# ---- the target fails --------------------------------------------------------------------------

def test_a_failed_target_makes_the_frozen_source_resume() -> None:
    j, op = in_phase("switch")
    s = live_move.on_target_failed(j, op, "restore failed", node("a"), Placement("c"), NOW)
    assert s.op.phase == "resume" and (s.job.node, s.job.incarnation) == ("a", 3)
    assert sent(s) == [("checkpointer", "a", "live_resume", 3)] and events(s) == ["migrate_rollback"]
    ev = wire.NodeEvent(kind="live_resumed", node="a", job="job-1", incarnation=3, op="op-abc")
    r = live_move.on_resumed(s.job, s.op, ev, NOW)
    assert r is not None and r.job.state == JobState.RUNNING and r.op.state == OpState.FAILED
    assert r.op.error is not None and "restore failed" in r.op.error


def test_a_target_dying_before_its_memory_arrived_is_a_failed_target_one_that_finished_ends_the_source() -> None:
    j, op = in_phase("postcopy")
    failed = live_move.on_target_exited(j, op, 139, node("a"), Placement("c"), NOW)
    assert failed.op.phase == "resume" and sent(failed) == [("checkpointer", "a", "live_resume", 3)]
    assert isinstance(failed.op.args, LiveMove) and "exit 139" in (failed.op.args.target_error or "")
    finished = live_move.on_target_exited(j, op, 0, node("a"), Placement("c"), NOW)
    assert sent(finished) == [("checkpointer", "a", "live_end", 3)] and finished.op.phase == "postcopy"


def test_a_target_that_lost_its_memory_source_in_post_copy_is_a_failed_target() -> None:
    j, op = in_phase("postcopy")
    ev = wire.NodeEvent(kind="live_lost", node="b", job="job-1", incarnation=4, op="op-abc", error="socket closed")
    s = live_move.on_lost(j, op, ev, node("a"), Placement("c"), NOW)
    assert s is not None and s.op.phase == "resume" and sent(s) == [("checkpointer", "a", "live_resume", 3)]


def test_with_the_source_lost_too_the_job_is_restored_from_its_last_checkpoint() -> None:
    j, op = in_phase("switch")
    s = live_move.on_target_failed(j, op, "restore failed", node("a", state=NodeState.LOST), Placement("c"), NOW)
    assert (s.op.phase, s.op.checkpoint) == ("restore", "ck-old")
    assert (s.job.state, s.job.node, s.job.moving_to) == (JobState.RESTORING, "c", None)
    assert s.job.incarnation == 5  # above both copies: neither can report as the job any more
    assert sent(s) == [("migrator", "c", "restore", 5)]
    assert isinstance(s.op.args, LiveMove) and "is lost" in (s.op.args.fallback_error or "")


def test_a_gone_source_with_nowhere_to_go_parks_the_job_and_without_a_checkpoint_fails_it() -> None:
    j, op = in_phase("resume", target_error="restore failed")
    ev = wire.NodeEvent(kind="live_resume_failed", node="a", job="job-1", incarnation=3, op="op-abc", error="gone")
    parked = live_move.on_resume_failed(j, op, ev, Placement(None, "no node has 4 CPUs free"), NOW)
    assert parked is not None and (parked.job.state, parked.job.parked_by) == (JobState.PREEMPTED, "capacity")
    assert "no node has 4 CPUs free" in (parked.job.reason or "") and parked.op.state == OpState.FAILED
    assert not sent(parked)
    none = live_move.on_resume_failed(j.model_copy(update={"last_checkpoint": None}), op, ev, Placement("c"), NOW)
    assert none is not None and none.job.state == JobState.FAILED and none.op.state == OpState.FAILED
    assert "no checkpoint" in (none.op.error or "")


# ---- after a scheduler restart ------------------------------------------------------------------

def test_the_command_of_each_phase_in_flight_is_sent_again() -> None:
    expected = {"precopy": [("checkpointer", "a", "checkpoint", 3)],
                "freeze": [("checkpointer", "a", "live_freeze", 3)],
                "switch": [("migrator", "b", "live_restore", 4)],
                "resume": [("checkpointer", "a", "live_resume", 3)],
                "postcopy": []}
    for phase, commands in expected.items():
        j, op = in_phase(phase, frozen=frozen())
        if phase == "precopy":
            op.checkpoint = "ck-abc-r1"
        assert sent(live_move.resend(j, op)) == commands, phase
    assert set(live_move.RESENDABLE) == {p for p, c in expected.items() if c}


def test_saved_records_are_snapshots_in_order() -> None:
    j, op = in_phase("freeze")
    ev = wire.NodeEvent(kind="live_frozen", node="a", job="job-1", incarnation=3, op="op-abc", live=frozen())
    s = live_move.on_frozen(j, op, ev)
    assert s is not None
    kinds = [type(e).__name__ for e in s.effects]
    assert kinds == ["SaveOp", "SaveJob", "Send"]  # the op first: a restarted scheduler resends its phase
    saved = next(e for e in s.effects if isinstance(e, SaveOp)).op
    assert saved.phase == "switch" and saved is not s.op
