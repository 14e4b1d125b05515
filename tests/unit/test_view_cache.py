"""The scheduler's view cache answers as node_views does, however the records change between
calls: jobs added, ended, moved or resized, nodes replaced, drained, late or gone, prices set."""

import random
import time

from ferry.common.models import Job, JobState, Node, NodeState, PriceRecord
from ferry.policy.views import ViewCache, node_views

STATES = [JobState.RUNNING, JobState.PENDING, JobState.SUCCEEDED, JobState.PREEMPTED, JobState.MIGRATING]


def test_the_cache_gives_node_views_answers_through_random_changes() -> None:
    rng = random.Random(3)
    t = float(int(time.time()))  # a whole second: the cache counts uptime in seconds
    nodes = [Node(id=f"n{i}", cpus=8, memory_bytes=32 << 30, gpus=2, started=t - 50, last_heartbeat=t,
                  labels={"zone": "z", "instance_type": "m"}) for i in range(6)]
    jobs: list[Job] = []
    prices: list[PriceRecord] = []
    cache = ViewCache()
    for step in range(300):
        what = rng.random()
        if what < 0.4 or not jobs:
            jobs.append(Job(id=f"j{step}", name=f"j{step}", argv=["x"],
                            node=rng.choice([None, *[n.id for n in nodes]]), cpus=rng.choice([0.1, 0.5, 1.0]),
                            memory_bytes=rng.randrange(1 << 30), gpus=rng.randint(0, 1), state=rng.choice(STATES)))
        elif what < 0.6:
            i = rng.randrange(len(jobs))  # a changed record is another object, as the mirror makes it
            jobs[i] = jobs[i].model_copy(update={"state": rng.choice(STATES), "cpus": rng.choice([0.1, 0.3, 2.0]),
                                                 "moving_to": rng.choice([None, "n1", "n2"])})
        elif what < 0.75:
            jobs.pop(rng.randrange(len(jobs)))
        elif what < 0.9:
            i = rng.randrange(len(nodes))
            nodes[i] = nodes[i].model_copy(update={
                "state": rng.choice([NodeState.READY, NodeState.DRAINING]), "criu_ok": rng.random() < 0.9,
                "last_heartbeat": t - rng.choice([0.0, 10.0])})
        else:
            prices.append(PriceRecord(zone="z", instance_type="m", market="on-demand", price_per_hour=rng.random(),
                                      timestamp=float(step)))
        assert cache.views(nodes, jobs, t, 5.0, prices) == node_views(nodes, jobs, t, 5.0, prices), step


def test_fractional_cpus_add_up_without_drift() -> None:
    t = float(int(time.time()))
    node = Node(id="n", cpus=1, memory_bytes=1 << 30, started=t, last_heartbeat=t)
    jobs = [Job(id=f"j{i}", name=f"j{i}", argv=["x"], node="n", cpus=0.1, state=JobState.RUNNING) for i in range(10)]
    cache = ViewCache()
    for i in range(10):  # in and out, one at a time
        cache.views([node], jobs[:i + 1], t, 5.0)
    for i in range(10, 0, -1):
        (view,) = cache.views([node], jobs[:i], t, 5.0)
    assert view.free_cpus == 0.9 and cache.views([node], [], t, 5.0)[0].free_cpus == 1.0
