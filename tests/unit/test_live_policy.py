"""The scheduler's pure live-move decisions: when pre-copy rounds stop, when a move goes live, and
what `ferry migrate --live -o json` reports."""

import time

from ferry.common.models import Job, Node, NodeState, Op, OpKind
from ferry.common.moves import LiveFrozen, LiveLocal, LiveRestored
from ferry.common.opargs import LiveMove, Round
from ferry.policy.views import wants_live
from ferry.scheduler.ops.live_move import precopy_done
from ferry.scheduler.ops.live_report import live_result

MIB = 2**20


def test_rounds_stop_by_p_hauls_rule() -> None:
    assert not precopy_done([])
    assert not precopy_done([1024 * MIB])  # one round: the next may ship far less
    assert not precopy_done([1024 * MIB, 60 * MIB])  # 6% is not "almost nothing"
    assert precopy_done([1024 * MIB, 60 * MIB, 10 * MIB])  # under 2% of the first round
    assert precopy_done([1024 * MIB, 60 * MIB, 67 * MIB])  # grew by more than 10%
    assert not precopy_done([1024 * MIB, 60 * MIB, 65 * MIB])  # grew, but by less than 10%
    assert precopy_done([100 * MIB] + [50 * MIB] * 7)  # eight rounds at most
    assert precopy_done([100 * MIB, 50 * MIB], max_rounds=2)


def job(**kw: object) -> Job:
    return Job(id="j-1", name="web", argv=["x"], node="a", **kw)


def node(id: str, **kw: object) -> Node:
    return Node(id=id, lazy_pages=True, **kw)


def test_moves_go_live_only_when_the_sla_needs_it_and_both_nodes_can() -> None:
    assert not wants_live(job(), node("a"), node("b"), time.time())  # no SLA: a cold move is fine
    assert wants_live(job(max_downtime_s=1.0, move_cost_s=4.0), node("a"), node("b"), time.time())
    assert not wants_live(job(max_downtime_s=10.0, move_cost_s=4.0), node("a"), node("b"), time.time())
    assert not wants_live(job(max_downtime_s=1.0, move_cost_s=4.0), node("a"), Node(id="b"), time.time())
    assert not wants_live(job(max_downtime_s=1.0, gpu_uuids=["GPU-1"]), node("a"), node("b"), time.time())
    soon = node("a", state=NodeState.PREEMPTING, notice_deadline=time.time() + 20)
    later = node("a", state=NodeState.PREEMPTING, notice_deadline=time.time() + 120)
    t = time.time()
    assert not wants_live(job(max_downtime_s=1.0, move_cost_s=4.0), soon, node("b"), t)  # too little time left
    assert wants_live(job(max_downtime_s=1.0, move_cost_s=4.0), later, node("b"), t)


def test_the_result_is_computed_from_what_the_nodes_measured() -> None:
    frozen = LiveFrozen(address="10.0.0.1", port=1, store_job="j-1.live", images="lv-1", stdout_path="o",
                        stderr_path="e", bytes_final=2 * MIB, freeze_ms=40.0, frozen_at=1000.0, last_write_at=1000.01)
    op = Op(id="op-1", kind=OpKind.MIGRATE, args=LiveMove(
        source="a", target="b", mode="postcopy", round_why="the job has no checkpoint yet",
        rounds=[Round(checkpoint="ck-1-r1", bytes_uploaded=100 * MIB, freeze_ms=300.0)],
        frozen=frozen, restored=LiveRestored(restore_ms=90.0, running_at=1000.2),
        local=LiveLocal(degraded_ms=800.0, bytes_lazy=98 * MIB, first_write_at=1000.25)))
    r = live_result(job(), op, time.time())
    assert (r["job"], r["from"], r["to"], r["mode"], r["rounds"]) == ("web", "a", "b", "postcopy", 1)
    assert r["round_why"] == "the job has no checkpoint yet"
    assert r["bytes_precopy"] == 100 * MIB and r["bytes_final"] == 2 * MIB and r["round_freeze_ms"] == [300.0]
    assert abs(r["downtime_ms"] - 240.0) < 1e-6  # the source's last write to the target's first
    assert abs(r["switch_ms"] - 200.0) < 1e-6
    assert r["freeze_ms"] == 40.0 and r["restore_ms"] == 90.0 and r["degraded_ms"] == 800.0
    unseen = Op(id="op-2", kind=OpKind.MIGRATE, args=LiveMove(local=LiveLocal()))
    assert live_result(job(), unseen, time.time())["downtime_ms"] is None  # never made up
