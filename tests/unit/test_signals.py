"""What operators' agents watch and the guardrails on what they do: pure functions of records."""

import json

import pytest

from ferry.common.errors import ConflictError
from ferry.common.guardrails import Action, AgentLimits, action_of, refusal, spent
from ferry.common.models import AuditEntry, CheckpointRecord, Job, JobState, Node, NodeState, PriceRecord
from ferry.policy import admission, plans, progress, signals

NOW = 1_000_000.0
HOUR = 3600.0
GIB = 2**30


def node(id_: str, *, spot: bool = False, price: float = 1.0, zone: str = "us-east-1a", kind: str = "m5.xlarge",
         preemptions: int = 0, state: NodeState = NodeState.READY, **kw: object) -> Node:
    fields: dict[str, object] = {"heartbeat": NOW, **kw}
    return Node(id=id_, spot=spot, price_per_hour=price, cpus=4, memory_bytes=16 * GIB, criu_ok=True,
                started=NOW - 10 * HOUR, preemptions=preemptions, state=state,
                labels={"zone": zone, "instance_type": kind}, lazy_pages=True, **fields)


def job(name: str, *, node_id: str | None = "od", state: JobState = JobState.RUNNING, **kw: object) -> Job:
    fields: dict[str, object] = {"cpus": 1, "memory_bytes": GIB, **kw}
    return Job(id=f"j-{name}", name=name, argv=["x"], node=node_id, state=state, created=NOW - 600,
               updated=NOW - 300, **fields)


def snap(jobs: list[Job], nodes: list[Node], prices: list[PriceRecord] = (),  # type: ignore[assignment]
         checkpoints: list[CheckpointRecord] = ()) -> signals.Snapshot:  # type: ignore[assignment]
    return signals.Snapshot(jobs=jobs, nodes=nodes, prices=prices, checkpoints=checkpoints, now=NOW)


SPOT = node("spot", spot=True, price=0.3, preemptions=4)
OD = node("od", price=1.0)
PRICES = [PriceRecord(zone="us-east-1a", instance_type="m5.xlarge", market="on-demand", price_per_hour=1.0),
          PriceRecord(zone="us-east-1a", instance_type="m5.xlarge", market="spot", price_per_hour=0.3,
                      previous_price_per_hour=0.25)]


def test_queue_groups_waiting_jobs_by_priority_and_shape_with_their_waits_and_why() -> None:
    big = [job(f"big{i}", node_id=None, state=JobState.PENDING, cpus=64) for i in range(2)]
    parked = job("parked", node_id=None, state=JobState.PREEMPTED, parked_by="capacity", priority=5)
    user_parked = job("mine", node_id=None, state=JobState.PREEMPTED, parked_by="user")
    q = signals.queue(snap([*big, parked, user_parked, job("runs")], [OD]))
    assert q.waiting == 3
    assert [(g.priority, g.waiting) for g in q.groups] == [(5, 1), (0, 2)]
    assert q.groups[1].oldest_wait_s == 600 and q.groups[0].oldest_wait_s == 300
    assert q.groups[1].reasons == ["needs 64 cpus, the largest free is 3 on od"]


def test_sla_risk_puts_a_deadline_job_on_spot_first_and_a_patient_one_on_demand_last() -> None:
    on_spot = job("urgent", node_id="spot", deadline=NOW + HOUR)
    safe = job("safe", node_id="od", deadline=NOW + 10 * HOUR)
    no_sla = job("free", node_id="spot")
    risks = signals.sla_risk(snap([safe, on_spot, no_sla], [SPOT, OD]))
    assert [(r.job, r.risk) for r in risks] == [("urgent", "high"), ("safe", "low")]
    assert risks[0].suggestion == "migrate it to an on-demand node"
    assert 0 < risks[0].p_interruption < 1 and risks[1].p_interruption == 0


def test_sla_risk_counts_the_downtime_budget_and_a_node_under_notice() -> None:
    tight = job("tight", node_id="spot", max_downtime_s=5.0, move_cost_s=20.0)
    noticed = node("spot", spot=True, state=NodeState.PREEMPTING, notice_deadline=NOW + 60)
    risks = {r.job: r for r in signals.sla_risk(snap([tight], [SPOT]))}
    assert risks["tight"].downtime_budget_s == -15.0 and risks["tight"].risk == "high"
    under_notice = signals.sla_risk(snap([tight], [noticed]))[0]
    assert under_notice.why == "its node spot is preempting"


def test_spot_market_joins_prices_trend_and_interruptions_seen() -> None:
    market = signals.spot_market(snap([], [SPOT, OD], PRICES))
    assert len(market) == 1
    m = market[0]
    assert (m.spot_price, m.on_demand_price, m.discount, m.trend) == (0.3, 1.0, 0.7, 0.2)
    assert (m.nodes, m.interruptions) == (2, 4) and m.interruptions_per_day == pytest.approx(4 / (20 / 24), 1e-3)


def test_cluster_health_names_what_is_wrong() -> None:
    sick = node("gpu", gpu_conditions=["XID 79 on GPU 0: fallen off the bus"])
    late = node("late", heartbeat=NOW - 60)
    failed = CheckpointRecord(id="c1", job="j-t", job_name="t", state="failed", created=NOW - 100)
    health = signals.cluster_health(snap([job("t")], [OD, sick, late], checkpoints=[failed]))
    assert not health.ok and health.nodes == {"ready": 3} and health.usable == 2
    problems = {p.node: p.problems for p in health.problems}
    assert problems["gpu"] == ["XID 79 on GPU 0: fallen off the bus"]
    assert "has not sent a heartbeat" in problems["late"][0]
    assert health.failing_checkpoints == {"t": 1}
    assert signals.cluster_health(snap([job("t")], [OD])).ok


def test_savings_against_the_same_nodes_on_demand() -> None:
    s = signals.savings(snap([], [SPOT, OD, node("unknown", spot=True, kind="x9", price=0.1)], PRICES))
    assert s.saved_usd == pytest.approx(0.7 * 10) and s.saving_per_hour == pytest.approx(0.7)
    assert s.spent_usd == pytest.approx((0.3 + 1.0 + 0.1) * 10) and s.unpriced == ["unknown"]


def test_explain_ranks_the_nodes_and_says_whether_a_move_pays() -> None:
    long_job = job("long", node_id="od", deadline=None)
    ex = signals.explain(snap([long_job], [OD, SPOT], PRICES), long_job)
    assert ex.best == "spot" and [a.node for a in ex.alternatives] == ["spot", "od"]
    assert ex.score is not None and ex.move_cost_usd is not None and ex.live_possible
    assert ex.would_move and ex.why == "saves 0.70 USD against a move costing 0.01 USD"
    on_spot = job("cheap", node_id="spot")
    stays = signals.explain(snap([on_spot], [OD, SPOT], PRICES), on_spot)
    assert not stays.would_move and stays.why == "already on the best node"
    full = node("full", price=0.01)
    hog = job("hog", node_id="full", cpus=4)
    ex = signals.explain(snap([hog, long_job], [full, OD]), long_job)
    assert next(a for a in ex.alternatives if a.node == "full").why_not.startswith("node full has 0 free cpus")


def test_a_signal_answers_json_that_parses_back() -> None:
    data = json.loads(signals.to_json(signals.sla_risk(snap([job("urgent", node_id="spot", deadline=NOW + 60)],
                                                           [SPOT]))))
    assert [signals.SlaRisk.model_validate(d).job for d in data] == ["urgent"]


def test_plans_say_what_would_happen() -> None:
    t = job("t", node_id="od")
    s = snap([t], [OD, SPOT], PRICES)
    p = plans.migrate(s, t, "spot", live=True)
    assert p.summary.startswith("would move t from od (1.00 USD/h) to spot (0.30 USD/h), live")
    assert p.cost_per_hour == 0.3 and p.price_per_hour_before == 1.0
    drain = plans.drain(s, "od", undo=False)
    assert [m.target for m in drain.moves] == ["spot"] and "1 job(s) leave it (0 parked" in drain.summary
    assert plans.drain(snap([t], [OD]), "od", undo=False).moves[0].action == "checkpoint"


def test_admission_refuses_what_the_scheduler_would() -> None:
    with pytest.raises(ConflictError, match="only a running job can be migrated"):
        admission.migratable(job("p", state=JobState.PREEMPTED))
    with pytest.raises(ConflictError, match="runs on od already"):
        admission.not_there(job("t"), "od")
    with pytest.raises(ConflictError, match="is running on od"):
        admission.restorable(job("t"), None)
    assert admission.restorable(job("p", state=JobState.PREEMPTED, last_checkpoint="c9"), None) == "c9"


def entry(method: str, *, outcome: str = "ok", age_s: float = 60, who: str = "claw", cost: float = 0.0,
          undo: bool = False) -> AuditEntry:
    return AuditEntry(time=NOW - age_s, tenant="acme", who=who, role="agent", method=method, outcome=outcome,
                      cost_per_hour=cost, undo=undo)


def test_the_limits_count_only_this_agents_successful_actions_of_the_last_hour() -> None:
    trail = [entry("Migrate", cost=1.0), entry("Restore", cost=2.0), entry("Migrate", outcome="RESOURCE_EXHAUSTED"),
             entry("Migrate", age_s=2 * HOUR), entry("Migrate", who="other"), entry("DrainNode"),
             entry("DrainNode", undo=True), entry("Checkpoint")]
    used = spent(trail, "claw", "acme", NOW)
    assert used == {"move": 2, "drain": 1, "cost": 3.0}
    limits = AgentLimits(moves_per_hour=3, drains_per_hour=1, cost_per_hour=4.0)
    assert refusal(limits, used, Action.MOVE, 0.5) is None
    assert "limit of 3 moves per hour" in (refusal(limits, used, Action.MOVE, 0.5, pending=1) or "")
    assert "limit of 1 drains per hour" in (refusal(limits, used, Action.DRAIN, 0.0) or "")
    assert "4 USD/h committed" in (refusal(limits, used, Action.MOVE, 1.5) or "")
    assert action_of("DrainNode", undo=True) is Action.OTHER and action_of("Checkpoint") is Action.OTHER
    assert AgentLimits().drains_per_hour == 0  # an agent nobody configured drains nothing


def test_the_time_a_job_runs_is_counted_across_stops_and_gives_its_remaining_work() -> None:
    j = job("w", state=JobState.PENDING, work_s=1000.0)
    progress.account(j, NOW)
    assert j.running_since is None and progress.remaining_s(j, NOW) == 1000.0
    j.state = JobState.RUNNING
    progress.account(j, NOW)
    j.state = JobState.CHECKPOINTING  # a leave-running checkpoint: it still runs
    progress.account(j, NOW + 100)
    j.state = JobState.PREEMPTED
    progress.account(j, NOW + 300)
    assert j.ran_s == 300 and j.running_since is None
    assert progress.remaining_s(j, NOW + 5000) == 700  # parked: the clock does not run
    j.state = JobState.RUNNING
    progress.account(j, NOW + 6000)
    assert progress.ran_s(j, NOW + 6100) == 400 and progress.remaining_s(j, NOW + 6100) == 600
    assert progress.remaining_s(job("unsaid"), NOW) is None


def test_sla_risk_with_the_remaining_work_known_measures_the_slack() -> None:
    def started(name: str, node_id: str, deadline_in: float, work: float) -> Job:
        return job(name, node_id=node_id, deadline=NOW + deadline_in, work_s=work, running_since=NOW - 600)

    roomy = started("roomy", "od", 4 * HOUR, HOUR)  # 50 min left, 4 h to go
    tight = started("tight", "spot", 1000, 1100)  # 500 s of work left, 1000 s to go: 470 s of slack, and an
    # interruption costs a restore and up to 10 min of work since the last checkpoint
    late = started("late", "od", 600, 3600)  # 50 min left, 10 min to go
    risks = {r.job: r for r in signals.sla_risk(snap([roomy, tight, late], [SPOT, OD]))}
    assert risks["roomy"].remaining_work_s == 3000 and risks["roomy"].slack_s == 4 * HOUR - 3000 - 30
    assert risks["roomy"].risk == "low"
    assert risks["tight"].risk == "high" and risks["tight"].suggestion == "migrate it to an on-demand node"
    assert risks["late"].risk == "high" and "does not fit before its deadline" in risks["late"].why
