"""Right-sizing: the request follows the use; a job that outgrows its node moves or waits for one."""

from ferry.policy.decisions import JobView, NodeView
from ferry.policy.rightsize import decide, new_request

MIB, GIB = 1 << 20, 1 << 30


def node(id_: str, memory: int, used: int = 0, usable: bool = True) -> NodeView:
    return NodeView(id=id_, spot=False, price_per_hour=1.0, cpus=4, memory_bytes=memory, free_cpus=4,
                    free_memory_bytes=memory - used, usable=usable)


def test_the_request_grows_under_pressure_shrinks_when_wasted_and_stays_between() -> None:
    assert new_request(0, 100 * MIB, 100 * MIB) == (150 * MIB, "uses 100.0 MiB with no memory request: asks for "
                                                               "150.0 MiB")
    grown = new_request(GIB, 900 * MIB, 950 * MIB)
    assert grown is not None and grown[0] == 1425 * MIB and "grows to" in grown[1]
    shrunk = new_request(4 * GIB, 200 * MIB, 300 * MIB)
    assert shrunk is not None and shrunk[0] == 450 * MIB and "shrinks to" in shrunk[1]
    assert new_request(GIB, 500 * MIB, 600 * MIB) is None
    assert new_request(GIB, 10, 10)[0] == 64 * MIB  # type: ignore[index]  # never below the floor


def test_a_job_that_outgrows_its_node_moves_where_it_fits_or_is_marked_outgrown() -> None:
    job = JobView(id="j", memory_bytes=GIB)
    small = node("small", 2 * GIB, used=GIB)  # the job's own request counts as used
    stay = decide(job, 900 * MIB, 900 * MIB, small, [], 0.0)
    assert stay is not None and stay.move_to is None and not stay.outgrown and stay.memory_bytes == 1350 * MIB
    big = node("big", 8 * GIB)
    job = JobView(id="j", memory_bytes=1350 * MIB)
    small = node("small", 1800 * MIB, used=1350 * MIB)
    move = decide(job, 1300 * MIB, 1300 * MIB, small, [big, node("tiny", GIB)], 0.0)
    assert move is not None and move.move_to == "big" and move.memory_bytes == 1950 * MIB
    stuck = decide(job, 1300 * MIB, 1300 * MIB, small, [node("tiny", GIB)], 0.0)
    assert stuck is not None and stuck.outgrown and stuck.move_to is None and "autoscaler" in stuck.reason
    # marked outgrown, the request already raised: a node that fits has come since
    raised = JobView(id="j", memory_bytes=1950 * MIB)
    full = node("small", 1800 * MIB, used=1950 * MIB)
    later = decide(raised, 1300 * MIB, 1300 * MIB, full, [big], 0.0, outgrown=True)
    assert later is not None and later.move_to == "big"
    assert decide(raised, 1300 * MIB, 1300 * MIB, full, [], 0.0, outgrown=True) is None
