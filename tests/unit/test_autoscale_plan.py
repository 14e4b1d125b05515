"""The autoscaler's plan: a pure function of the fleet, the jobs and time."""

import pytest
from pydantic import ValidationError

from ferry.common.models import AutoscalePolicy
from ferry.policy.autoscale import Fleet, Offer, ScaleDown, ScaleUp, plan, utilization
from ferry.policy.decisions import JobView, NodeView

GIB = 2**30
SMALL = Offer("small", "z-a", False, 0.10, cpus=2, memory_bytes=4 * GIB)
LARGE = Offer("large", "z-a", False, 0.40, cpus=8, memory_bytes=32 * GIB)
SPOT_LARGE = Offer("large", "z-b", True, 0.12, cpus=8, memory_bytes=32 * GIB)
POLICY = AutoscalePolicy(min_nodes=1, max_nodes=4, target_utilization=0.8, scale_down_after_s=600,
                         scale_up_after_s=5)


def node(id_: str, cpus: int = 2, used: float = 0.0, price: float = 0.10, jobs: int = 0) -> NodeView:
    return NodeView(id=id_, spot=False, price_per_hour=price, cpus=cpus, memory_bytes=4 * GIB * cpus // 2,
                    free_cpus=cpus - used, free_memory_bytes=4 * GIB * cpus // 2, jobs=jobs)


def job(id_: str, cpus: float = 1, node_id: str | None = None) -> JobView:
    return JobView(id=id_, cpus=cpus, memory_bytes=GIB, node=node_id)


def test_min_above_max_is_refused() -> None:
    with pytest.raises(ValidationError, match="--min 5 is above --max 2"):
        AutoscalePolicy(min_nodes=5, max_nodes=2)
    with pytest.raises(ValidationError):
        AutoscalePolicy(target_utilization=1.5)


def test_a_waiting_job_that_fits_no_node_gets_the_cheapest_offer_that_fits_it() -> None:
    fleet = Fleet(nodes=[node("n1", used=2)], managed=frozenset({"n1"}), waiting=[(job("big", cpus=6), 30.0)])
    result = plan(POLICY, fleet, [SMALL, LARGE], 100.0, {})
    assert [type(a) for a in result.actions] == [ScaleUp]
    up = result.actions[0]
    assert isinstance(up, ScaleUp) and up.offer == LARGE and up.jobs == ("big",)
    assert "big" in up.reason and "0.400 USD/h" in up.reason


def test_jobs_share_one_launch_and_a_fresh_wait_does_not_count_yet() -> None:
    fleet = Fleet(nodes=[node("n1", used=2)], managed=frozenset({"n1"}),
                  waiting=[(job("a"), 10.0), (job("b"), 10.0), (job("c"), 1.0)])
    result = plan(POLICY, fleet, [SMALL, LARGE], 100.0, {})
    assert len(result.actions) == 1
    up = result.actions[0]
    assert isinstance(up, ScaleUp) and up.offer == SMALL and up.jobs == ("a", "b")


def test_a_launch_under_way_is_counted_before_another() -> None:
    fleet = Fleet(nodes=[node("n1", used=2)], managed=frozenset({"n1"}), launching=[SMALL],
                  waiting=[(job("a"), 10.0)])
    assert plan(POLICY, fleet, [SMALL], 100.0, {}).actions == ()


def test_the_fleet_never_grows_past_max_and_says_why() -> None:
    nodes = [node(f"n{i}", used=2) for i in range(4)]
    fleet = Fleet(nodes=nodes, managed=frozenset(n.id for n in nodes), waiting=[(job("a"), 10.0)])
    result = plan(POLICY, fleet, [SMALL], 100.0, {})
    assert result.actions == ()
    assert result.stuck == {"a": "the fleet is at --max 4 nodes"}


def test_a_job_no_offer_fits_is_stuck_with_the_reason_and_a_refused_offer_is_skipped() -> None:
    fleet = Fleet(nodes=[node("n1", used=2)], managed=frozenset({"n1"}), waiting=[(job("huge", cpus=64), 10.0)])
    stuck = plan(POLICY, fleet, [SMALL, LARGE], 0.0, {}).stuck
    assert stuck == {"huge": "no instance type the providers offer fits it"}
    fleet = Fleet(nodes=[node("n1", used=2)], managed=frozenset({"n1"}), waiting=[(job("big", cpus=6), 10.0)],
                  refused=frozenset({LARGE.key}))
    result = plan(POLICY, fleet, [SMALL, LARGE], 0.0, {})
    assert result.actions == () and "refused" in result.stuck["big"]


def test_spot_is_chosen_for_a_job_without_an_sla_when_it_is_cheaper() -> None:
    fleet = Fleet(nodes=[], managed=frozenset(), waiting=[(job("a", cpus=6), 10.0)])
    up = plan(POLICY, fleet, [LARGE, SPOT_LARGE], 0.0, {}).actions[0]
    assert isinstance(up, ScaleUp) and up.offer == SPOT_LARGE


def test_the_fleet_grows_to_min_with_the_cheapest_offer() -> None:
    policy = AutoscalePolicy(min_nodes=2, max_nodes=4)
    result = plan(policy, Fleet(nodes=[], managed=frozenset()), [LARGE, SMALL], 0.0, {})
    assert [a.offer for a in result.actions if isinstance(a, ScaleUp)] == [SMALL, SMALL]


def test_an_underused_node_retires_after_the_delay_and_not_before() -> None:
    nodes = [node("n1", cpus=8, used=2, price=0.4, jobs=1), node("n2", cpus=8, used=2, price=0.5, jobs=1)]
    jobs_on = {"n1": [job("a", cpus=2, node_id="n1")], "n2": [job("b", cpus=2, node_id="n2")]}
    fleet = Fleet(nodes=nodes, managed=frozenset({"n1", "n2"}), jobs_on=jobs_on)
    first = plan(POLICY, fleet, [SMALL], 1000.0, {})
    assert first.actions == () and first.underused_since == {"n1": 1000.0, "n2": 1000.0}
    early = plan(POLICY, fleet, [SMALL], 1500.0, first.underused_since)
    assert early.actions == ()
    late = plan(POLICY, fleet, [SMALL], 1600.0, early.underused_since)
    assert len(late.actions) == 1
    down = late.actions[0]
    assert isinstance(down, ScaleDown) and down.node == "n2" and down.jobs == ("b",)  # the dearer one
    assert down.saving_per_hour == 0.5 and "fit on n1" in down.reason


def test_no_retirement_below_min_over_the_target_or_while_jobs_wait() -> None:
    one = Fleet(nodes=[node("n1")], managed=frozenset({"n1"}))
    assert plan(POLICY, one, [SMALL], 10_000.0, {"n1": 0.0}).actions == ()
    # the other node would end above 80%
    nodes = [node("n1", cpus=8, used=6, jobs=1), node("n2", cpus=8, used=2, jobs=1)]
    jobs_on = {"n1": [job("a", cpus=6, node_id="n1")], "n2": [job("b", cpus=2, node_id="n2")]}
    busy = Fleet(nodes=nodes, managed=frozenset({"n1", "n2"}), jobs_on=jobs_on)
    assert plan(POLICY, busy, [SMALL], 10_000.0, {"n1": 0.0, "n2": 0.0}).actions == ()
    # with a job waiting, the count starts over
    idle = Fleet(nodes=[node("n1", cpus=8), node("n2", cpus=8)], managed=frozenset({"n1", "n2"}),
                 waiting=[(job("x", cpus=64), 10.0)])
    result = plan(POLICY, idle, [SMALL], 10_000.0, {"n1": 0.0, "n2": 0.0})
    assert not any(isinstance(a, ScaleDown) for a in result.actions) and result.underused_since == {}


def test_a_node_that_is_busy_again_starts_its_count_over_and_unmanaged_nodes_stay() -> None:
    nodes = [node("n1", cpus=8), node("n2", cpus=8, used=8, jobs=1)]
    fleet = Fleet(nodes=nodes, managed=frozenset({"n2"}), jobs_on={"n2": [job("a", cpus=8, node_id="n2")]})
    result = plan(POLICY, fleet, [SMALL], 10_000.0, {"n2": 0.0})
    assert result.actions == () and result.underused_since == {}


def test_utilization_is_the_busiest_resource() -> None:
    assert utilization(node("n", cpus=4, used=1)) == 0.25
    assert plan(AutoscalePolicy(enabled=False), Fleet(nodes=[], managed=frozenset()), [SMALL], 0.0, {}).actions == ()


def test_bad_bounds_are_one_line_usage_errors_for_the_cli_and_the_api() -> None:
    from ferry.api.convert import autoscale_from_pb
    from ferry.common.errors import UsageError
    from ferry.v1 import ferry_pb2 as pb

    with pytest.raises(UsageError, match=r"^--min 5 is above --max 2$"):
        AutoscalePolicy.checked(min_nodes=5, max_nodes=2)
    with pytest.raises(UsageError, match=r"^--target-utilization: Input should be less than or equal to 1$"):
        AutoscalePolicy.checked(target_utilization=1.5)
    with pytest.raises(UsageError, match="--max"):
        autoscale_from_pb(pb.AutoscalePolicy(enabled=True, min_nodes=1, max_nodes=0, target_utilization=0.8))
    ok = autoscale_from_pb(pb.AutoscalePolicy(enabled=True, min_nodes=1, max_nodes=3, target_utilization=0.5,
                                              scale_down_after_s=60))
    assert (ok.min_nodes, ok.max_nodes, ok.target_utilization, ok.scale_down_after_s) == (1, 3, 0.5, 60)


def test_the_zones_interruption_history_and_the_jobs_sla_choose_the_market() -> None:
    from dataclasses import replace

    stormy = replace(SPOT_LARGE, preemptions=40, uptime_s=10 * 3600)
    calm = replace(SPOT_LARGE, preemptions=0, uptime_s=100 * 3600)
    fragile = replace(job("a", cpus=6), max_downtime_s=10.0)  # tolerates 10 s of downtime
    for offers, want in (([LARGE, stormy], LARGE), ([LARGE, calm], calm)):
        fleet = Fleet(nodes=[], managed=frozenset(), waiting=[(fragile, 10.0)])
        up = plan(POLICY, fleet, offers, 0.0, {}).actions[0]
        assert isinstance(up, ScaleUp) and up.offer == want
