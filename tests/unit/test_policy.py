"""The scheduler's placement and rebalancing policy: pure functions of cluster state and time."""

from collections import Counter
from dataclasses import replace

from ferry.policy.decisions import (
    CRITICAL_PENALTY,
    JobView,
    NodeView,
    choose_node,
    deadline_critical,
    place,
    score_node,
    should_move,
    slack_reserve_s,
    slack_s,
)

GIB = 2**30
HOUR = 3600.0


def node(id_: str, *, spot: bool = False, price: float = 1.0, cpus: float = 8, mem: int = 32 * GIB, gpus: int = 0,
         preemptions: int = 0, uptime_h: float = 100.0, usable: bool = True, reason: str = "") -> NodeView:
    return NodeView(id=id_, spot=spot, price_per_hour=price, zone="z", cpus=cpus, memory_bytes=mem, gpus=gpus,
                    free_cpus=cpus, free_memory_bytes=mem, free_gpus=gpus, preemptions=preemptions,
                    uptime_s=uptime_h * HOUR, usable=usable, reason=reason)


def job(id_: str, *, priority: int = 0, cpus: float = 1, mem: int = GIB, gpus: int = 0,
        deadline_at: float | None = None, remaining_s: float | None = None, max_downtime_s: float | None = None,
        node_id: str | None = None, unsaved_s: float = 0.0) -> JobView:
    return JobView(id=id_, priority=priority, cpus=cpus, memory_bytes=mem, gpus=gpus, deadline_at=deadline_at,
                   max_downtime_s=max_downtime_s, remaining_s=remaining_s, node=node_id, move_cost_s=90.0,
                   checkpoint_every_s=600.0, unsaved_s=unsaved_s)


SPOT = node("spot-a", spot=True, price=0.92, preemptions=10, uptime_h=100)
ON_DEMAND = node("od", price=3.06)


# ---------------------------------------------------------------- placement


def test_capacity_is_respected_as_jobs_are_assigned() -> None:
    nodes = [node("node-1", cpus=4), node("node-2", cpus=2)]
    jobs = [job("a", cpus=3), job("b", cpus=3), job("c", cpus=2)]
    result = place(jobs, nodes, now=0.0)
    assert result.assignments == {"a": "node-1", "c": "node-2"}
    assert result.unplaced == {"b": "needs 3 cpus, the largest free is 2 on node-2"}


def test_higher_priority_is_placed_first() -> None:
    nodes = [node("only", cpus=2)]
    result = place([job("low", cpus=2), job("high", cpus=2, priority=5)], nodes, now=0.0)
    assert result.assignments == {"high": "only"}
    assert "low" in result.unplaced


def test_equal_nodes_share_equal_work_instead_of_the_first_by_id_taking_it_all() -> None:
    nodes = [node(f"node-{i}", cpus=64) for i in range(1, 5)]
    result = place([job(f"j{i:03d}", cpus=0, mem=0) for i in range(200)], nodes, now=0.0)
    per_node = [list(result.assignments.values()).count(n.id) for n in nodes]
    assert per_node == [50, 50, 50, 50]
    # a node that holds fewer jobs wins a tie, then the one with more free cpus, then the id
    busy, idle = replace(nodes[0], jobs=3), replace(nodes[3], jobs=1)
    assert choose_node(job("x", cpus=0), [busy, idle], now=0.0) == idle
    fuller = replace(nodes[1], free_cpus=60.0)
    assert choose_node(job("x", cpus=0), [fuller, nodes[2]], now=0.0) == nodes[2]
    assert choose_node(job("x", cpus=0), [nodes[3], nodes[2]], now=0.0) == nodes[2]


def test_equal_nodes_take_turns_at_short_jobs_that_end_before_the_next_pick() -> None:
    """Jobs that end at once leave every node at zero jobs: the node picked longest ago (or never)
    wins the tie, not the first by id."""
    nodes = [node(f"node-{i}", cpus=64) for i in range(1, 5)]
    assert choose_node(job("x", cpus=0), nodes, 0.0, last_given={"node-1": 2, "node-2": 0, "node-3": 1,
                                                                  "node-4": 3}) == nodes[1]
    assert choose_node(job("x", cpus=0), nodes, 0.0, last_given={"node-1": 0}) == nodes[1]  # never picked
    last_given: dict[str, int] = {}
    picked = []
    for k in range(12):
        best = choose_node(job(f"j{k}", cpus=0), nodes, 0.0, last_given=last_given)
        assert best is not None
        last_given[best.id] = k
        picked.append(best.id)
    assert Counter(picked) == {n.id: 3 for n in nodes}
    # the job count and free cpus still come first
    busy = replace(nodes[1], jobs=1)
    assert choose_node(job("x", cpus=0), [nodes[0], busy], 0.0, last_given={"node-1": 9}) == nodes[0]


def test_cheaper_node_wins_when_both_fit() -> None:
    result = place([job("a")], [node("dear", price=3.0), node("cheap", price=1.0)], now=0.0)
    assert result.assignments == {"a": "cheap"}


def test_reasons_for_unplaceable_jobs() -> None:
    assert place([job("a")], [], 0.0).unplaced["a"] == "no nodes have joined the cluster"
    down = [node("n1", usable=False, reason="no heartbeat for 30s")]
    assert place([job("a")], down, 0.0).unplaced["a"] == "no usable node: n1: no heartbeat for 30s"
    assert place([job("a", gpus=2)], [node("n1", gpus=1), node("n2")], 0.0).unplaced["a"] == \
        "needs 2 gpus, the largest free is 1 on n1"
    assert place([job("a", mem=64 * GIB)], [node("n1")], 0.0).unplaced["a"] == \
        "needs 64.0 GiB of memory, the largest free is 32.0 GiB on n1"
    # enough cpus on one node, enough memory on the other, never both together
    split = [node("n1", cpus=8, mem=GIB), node("n2", cpus=1, mem=32 * GIB)]
    assert place([job("a", cpus=4, mem=4 * GIB)], split, 0.0).unplaced["a"] == \
        "no single node has enough free cpus, memory and gpus together"


def test_score_is_none_when_the_job_does_not_fit() -> None:
    assert score_node(job("a", cpus=16), node("n"), 0.0) is None
    assert score_node(job("a"), node("n", usable=False), 0.0) is None
    assert score_node(job("a"), node("n"), 0.0) is not None


# ---------------------------------------------------------------- reliability and SLA


def test_more_preemptions_per_hour_score_lower() -> None:
    steady = node("steady", spot=True, price=0.92, preemptions=1, uptime_h=200)
    flaky = node("flaky", spot=True, price=0.92, preemptions=50, uptime_h=200)
    a = job("a")
    assert score_node(a, steady, 0.0) > score_node(a, flaky, 0.0)  # type: ignore[operator]


def test_priority_and_sla_scale_how_much_reliability_matters() -> None:
    steady = node("steady", spot=True, price=0.92, preemptions=1, uptime_h=200)
    flaky = node("flaky", spot=True, price=0.92, preemptions=50, uptime_h=200)

    def gap(j: JobView) -> float:
        return score_node(j, steady, 0.0) - score_node(j, flaky, 0.0)  # type: ignore[operator]

    plain = gap(job("a"))
    assert gap(job("a", priority=10)) > plain
    assert gap(job("a", max_downtime_s=60)) > plain
    relaxed = gap(job("a", deadline_at=100 * HOUR, remaining_s=10 * HOUR))
    tight = gap(job("a", deadline_at=12 * HOUR, remaining_s=10 * HOUR))
    assert tight > relaxed > plain


def test_slack() -> None:
    assert slack_s(job("a"), 0.0) is None
    assert slack_s(job("a", deadline_at=10 * HOUR, remaining_s=4 * HOUR), 1 * HOUR) == 5 * HOUR - 90


def test_deadline_critical_counts_unsaved_work_and_the_horizon() -> None:
    # slack = 1000 - 0 - 500 - 90 = 410 s
    pending = job("a", deadline_at=1000, remaining_s=500)
    assert not deadline_critical(pending, 0.0, horizon_s=400)
    assert deadline_critical(pending, 0.0, horizon_s=420)
    running = job("a", deadline_at=1000, remaining_s=500, unsaved_s=300)
    assert deadline_critical(running, 0.0, horizon_s=200)  # 410 < 200 + 300
    assert not deadline_critical(job("a"), 0.0)  # no deadline, never critical


def test_a_deadline_critical_job_prefers_on_demand() -> None:
    relaxed = job("a", deadline_at=70 * HOUR, remaining_s=48 * HOUR)
    assert score_node(relaxed, SPOT, 0.0) > score_node(relaxed, ON_DEMAND, 0.0)  # type: ignore[operator]
    assert place([relaxed], [SPOT, ON_DEMAND], 0.0).assignments == {"a": "spot-a"}

    critical = job("a", deadline_at=48 * HOUR + 100, remaining_s=48 * HOUR)
    spot_score = score_node(critical, SPOT, 0.0)
    assert spot_score is not None and spot_score < -CRITICAL_PENALTY / 2
    assert place([critical], [SPOT, ON_DEMAND], 0.0).assignments == {"a": "od"}


def test_a_deadline_job_waits_for_spot_until_the_deadline_needs_on_demand() -> None:
    gone = node("spot-a", spot=True, price=0.92, usable=False, reason="no spot capacity")
    relaxed = job("a", deadline_at=70 * HOUR, remaining_s=48 * HOUR)
    assert choose_node(relaxed, [gone, ON_DEMAND], 0.0, horizon_s=195) is None  # waiting is free
    assert choose_node(relaxed, [SPOT, ON_DEMAND], 0.0, horizon_s=195) == SPOT
    critical = job("a", deadline_at=48 * HOUR + 200, remaining_s=48 * HOUR)
    assert choose_node(critical, [SPOT, ON_DEMAND], 0.0, horizon_s=195) == ON_DEMAND
    # without a deadline there is nothing to wait for
    assert choose_node(job("a"), [gone, ON_DEMAND], 0.0) == ON_DEMAND


def test_a_deadline_job_keeps_a_slack_reserve_for_going_back_to_spot() -> None:
    """Its slack down to the reserve (8 trips of two 90 s moves and a 600 s interval = 104 min,
    or a fifth of the work left if less), the job sits out an outage on on-demand instead of
    spending the rest, and goes back to spot when it returns: still not critical."""
    gone = node("spot-a", spot=True, price=0.92, usable=False, reason="no spot capacity")
    work = 24 * HOUR
    assert slack_reserve_s(job("a", deadline_at=36 * HOUR, remaining_s=work)) == 8 * (2 * 90 + 600)
    assert slack_reserve_s(job("a", deadline_at=2 * HOUR, remaining_s=HOUR)) == 0.2 * HOUR
    above = job("a", deadline_at=work + 90 + 8 * 780 + 60, remaining_s=work)
    below = job("a", deadline_at=work + 90 + 8 * 780 - 60, remaining_s=work)
    assert choose_node(above, [gone, ON_DEMAND], 0.0, horizon_s=195) is None
    assert choose_node(below, [gone, ON_DEMAND], 0.0, horizon_s=195) == ON_DEMAND
    assert not deadline_critical(below, 0.0, 195)
    on_od = replace(below, node="od")
    assert choose_node(on_od, [SPOT, ON_DEMAND], 0.0, horizon_s=195) == SPOT
    assert should_move(on_od, ON_DEMAND, SPOT, 0.0, work, None, horizon_s=195).move


# ---------------------------------------------------------------- rebalancing


def test_a_tiny_saving_does_not_move_a_big_one_does() -> None:
    a = job("a", node_id="here")
    here = node("here", price=1.00)
    slightly = node("slightly", price=0.999)
    much = node("much", price=0.5)
    tiny = should_move(a, here, slightly, 0.0, remaining_s=HOUR, last_move_at=None)
    assert not tiny.move and 0 < tiny.saving < tiny.cost
    big = should_move(a, here, much, 0.0, remaining_s=10 * HOUR, last_move_at=None)
    assert big.move and big.saving > big.cost * 1.2
    assert big.saving == 5.0 and big.cost == 90 / HOUR * 1.5


def test_hysteresis_band() -> None:
    # cost of a move: 90 s at 1.0 + 0.5 USD/h = 0.0375 USD; saving 0.5 USD/h * remaining
    a = job("a", node_id="here")
    here, there = node("here", price=1.0), node("there", price=0.5)
    just_above_cost = 0.0375 * 1.1 / 0.5 * HOUR  # beats the cost, not by 20%
    assert not should_move(a, here, there, 0.0, just_above_cost, None).move
    assert should_move(a, here, there, 0.0, just_above_cost, None, hysteresis=0.05).move
    assert should_move(a, here, there, 0.0, just_above_cost * 1.2, None).move


def test_min_interval_between_moves() -> None:
    a = job("a", node_id="here")
    here, there = node("here", price=1.0), node("there", price=0.5)
    assert not should_move(a, here, there, 1000.0, 10 * HOUR, last_move_at=700.0).move
    assert should_move(a, here, there, 1000.0, 10 * HOUR, last_move_at=300.0).move
    assert should_move(a, here, there, 1000.0, 10 * HOUR, last_move_at=700.0, min_interval_s=200).move


def test_no_move_to_the_same_node_or_one_that_does_not_fit() -> None:
    a = job("a", cpus=4, node_id="here")
    here = node("here", price=1.0)
    assert not should_move(a, here, here, 0.0, 10 * HOUR, None).move
    assert not should_move(a, here, node("small", price=0.1, cpus=2), 0.0, 10 * HOUR, None).move


def test_the_deadline_moves_a_job_off_spot_and_keeps_it_off() -> None:
    # slack: 10 h - (10 h - 100 s) - 90 s = 10 s, less than the scheduler's next look
    critical = job("a", deadline_at=10 * HOUR, remaining_s=10 * HOUR - 100, node_id="spot-a")
    leave = should_move(critical, SPOT, ON_DEMAND, 0.0, 10 * HOUR - 100, last_move_at=0.0)
    assert leave.move and "deadline" in leave.reason  # even right after a move, and at a loss
    back = should_move(critical, ON_DEMAND, SPOT, 0.0, 10 * HOUR - 100, last_move_at=None)
    assert not back.move and "deadline" in back.reason


def test_cheaper_spot_pays_for_a_move_from_on_demand_when_the_deadline_allows() -> None:
    relaxed = job("a", deadline_at=70 * HOUR, remaining_s=40 * HOUR, node_id="od")
    decision = should_move(relaxed, ON_DEMAND, SPOT, 0.0, 40 * HOUR, last_move_at=None)
    assert decision.move and decision.saving > 50
