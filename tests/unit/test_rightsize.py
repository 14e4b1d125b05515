"""Right-sizing: the request follows the use; a job that outgrows its node moves or waits for one."""

from ferry.policy.decisions import JobView, NodeView
from ferry.policy.rightsize import decide, decide_gpu, new_gpu_request, new_request

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


def test_a_job_that_ends_before_a_move_would_finish_where_it_is() -> None:
    small = node("small", 1800 * MIB, used=1350 * MIB)
    big = node("big", 8 * GIB)
    ending = JobView(id="j", memory_bytes=1350 * MIB, remaining_s=20.0, move_cost_s=45.0)
    stays = decide(ending, 1300 * MIB, 1300 * MIB, small, [big], 0.0)
    assert stays is not None and stays.move_to is None and "finishes on small" in stays.reason
    # with more work left than a move costs, it moves
    longer = JobView(id="j", memory_bytes=1350 * MIB, remaining_s=600.0, move_cost_s=45.0)
    moves = decide(longer, 1300 * MIB, 1300 * MIB, small, [big], 0.0)
    assert moves is not None and moves.move_to == "big"
    # already past what its node holds: it moves however soon it would end
    over = decide(ending, 1900 * MIB, 1900 * MIB, small, [big], 0.0)
    assert over is not None and over.move_to == "big"


def test_gpu_memory_pressure_moves_a_job_to_bigger_gpus_and_waste_lowers_its_request() -> None:
    assert new_gpu_request(0, 0, 0, 24 * GIB) is None  # no GPU use: nothing to say
    grown = new_gpu_request(0, 23 * GIB, 23 * GIB, 24 * GIB)
    assert grown is not None and grown[0] == 34.5 * GIB and "needs GPUs with" in grown[1]
    shrunk = new_gpu_request(40 * GIB, 2 * GIB, 3 * GIB, 80 * GIB)
    assert shrunk is not None and shrunk[0] == 4.5 * GIB
    assert new_gpu_request(16 * GIB, 10 * GIB, 10 * GIB, 80 * GIB) is None
    job = JobView(id="j", gpus=1, remaining_s=3600.0, move_cost_s=60.0)
    big = NodeView(id="h100", spot=False, price_per_hour=4.0, cpus=8, memory_bytes=64 * GIB, gpus=1, free_cpus=8,
                   free_memory_bytes=64 * GIB, free_gpus=1)
    move = decide_gpu(job, 0, 23 * GIB, 23 * GIB, 24 * GIB, "a10", [big], 0.0)
    assert move is not None and move.move_to == "h100" and move.memory_bytes == int(34.5 * GIB)
    stuck = decide_gpu(job, 0, 23 * GIB, 23 * GIB, 24 * GIB, "a10", [], 0.0)
    assert stuck is not None and stuck.outgrown and "autoscaler" in stuck.reason
    ending = JobView(id="j", gpus=1, remaining_s=10.0, move_cost_s=60.0)
    stays = decide_gpu(ending, 0, 23 * GIB, 23 * GIB, 24 * GIB, "a10", [big], 0.0)
    assert stays is not None and stays.move_to is None and not stays.outgrown
