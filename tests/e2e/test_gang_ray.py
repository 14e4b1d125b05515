"""A Ray cluster as a gang (issue 15): a head (with the driver) and two worker nodes, each a gang
member on its own Ferry node, the driver calling a stateful actor on each worker. One worker moves
live while the driver works; the gang is checkpointed and restored whole on other nodes; a worker's
node dies and the gang comes back from its last group checkpoint. Through all of it the actors'
counts go on with no number lost or repeated."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import PY, Cluster, wait_until
from tests.e2e.test_ray import RAY_BIN, STORE, ray_processes

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

# What a Ray cluster under Ferry sets: the GCS declares a raylet dead after 5 failed health checks
# 3 s apart, and a gang restored on other nodes is away longer, so the head waits longer; and no log
# monitor, which holds every log file open for reading: a restore from a checkpoint older than the
# file's size fails (CRIU checks a read-only file's size). Token authentication is off: only the
# gang's own addresses reach the Ray ports (the job network).
HEAD = f"""
set -e
export RAY_AUTH_MODE=disabled RAY_health_check_failure_threshold=60
"$RAY" start --head --port=6379 --num-cpus=1 --include-dashboard=false --object-store-memory={STORE} \\
    --temp-dir="$1" --include-log-monitor=False --disable-usage-stats >/dev/null
exec "$PY" -u -c '
import time, ray
ray.init(address="auto", log_to_driver=False)

@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n

@ray.remote
def square(x):
    return x * x

seen = 0
while seen < 3:
    alive = sum(n["Alive"] for n in ray.nodes())
    if alive != seen:
        print("nodes", alive, flush=True)
        seen = alive
    time.sleep(0.5)
a = Counter.options(resources={{"w1": 1}}).remote()
b = Counter.options(resources={{"w2": 1}}).remote()
print("ready", flush=True)
while True:
    x, y = ray.get([a.inc.remote(), b.inc.remote()])
    sq = ray.get(square.remote(x))  # a task, wherever a CPU is free
    print(x, y, sq, flush=True)
    time.sleep(0.1)
'
"""

WORKER = f"""
export RAY_AUTH_MODE=disabled RAY_raylet_start_wait_time_s=120
exec "$RAY" start --address="$1:6379" --num-cpus=1 --object-store-memory={STORE} --resources="{{\\"$2\\": 1}}" \\
    --include-log-monitor=False --disable-usage-stats --block >/dev/null
"""


@pytest.fixture
def ray_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="fgang-", dir="/tmp")  # short: Ray's unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


def rows(c: Cluster) -> list[tuple[int, int, int]]:
    lines = c.logs("rg-head").splitlines()
    if "ready" not in lines:
        return []
    return [(int(x), int(y), int(sq)) for x, y, sq in (line.split() for line in lines[lines.index("ready") + 1:])]


def counts_past(c: Cluster, more: int) -> None:
    start = len(rows(c))
    wait_until(lambda: len(rows(c)) >= start + more, 180, f"the driver to count {more} more")


def joined(c: Cluster, n: int) -> None:
    wait_until(lambda: f"nodes {n}\n" in c.logs("rg-head"), 240, f"Ray node {n} to join")


def where(c: Cluster) -> dict[str, str]:
    return {job: c.json("status", job)["node"] for job in ("rg-head", "rg-w1", "rg-w2")}


def all_running(c: Cluster) -> bool:
    return all(c.json("status", job)["state"] == "running" for job in ("rg-head", "rg-w1", "rg-w2"))


def test_a_ray_cluster_gang_moves_a_worker_live_restores_whole_and_survives_a_workers_node(
        three_nodes: Cluster, ray_dir: str) -> None:
    c = three_nodes
    c.json("run", "--name", "rg-head", "--gang", "rg", "--node", "n1", "--", "env", f"RAY={RAY_BIN}", f"PY={PY}",
           "bash", "-c", HEAD, "rg-head", ray_dir)
    head = c.json("status", "rg-head")["address"]
    for n, (worker, node) in enumerate((("w1", "n2"), ("w2", "n3")), start=2):
        c.json("run", "--name", f"rg-{worker}", "--gang", "rg", "--node", node, "--", "env", f"RAY={RAY_BIN}",
               "bash", "-c", WORKER, f"rg-{worker}", head, worker)
        # one Ray node joining at a time: two raylets starting at once on 2 cores time out
        joined(c, n)
    wait_until(lambda: len(rows(c)) >= 10, 300, "the driver to start counting on both workers")

    # (b) a worker moves live while the driver keeps calling it; the rest runs on
    c.json("migrate", "rg-w1", "--to", "n1", "--live")
    assert where(c)["rg-w1"] == "n1"
    counts_past(c, 20)

    # (a) the whole gang, stopped with one group checkpoint and restored on other nodes
    group = c.json("checkpoint", "--gang", "rg", "--stop")
    assert len(group["members"]) == 3 and group["freeze_ms"] <= group["freeze_ms_sum"], group
    wait_until(lambda: not ray_processes(ray_dir), 60, "Ray's processes to stop with the gang")
    stopped = len(rows(c))
    c.json("restore", "--gang", "rg", "--nodes", "n2,n3,n1")  # by name: rg-head, rg-w1, rg-w2
    assert where(c) == {"rg-head": "n2", "rg-w1": "n3", "rg-w2": "n1"}
    counts_past(c, 20)
    assert rows(c)[stopped][0] == stopped + 1  # the actors went on from the checkpoint, not from 1

    # (c) a worker's node dies: the gang comes back from its last group checkpoint
    c.json("checkpoint", "--gang", "rg")
    before = len(rows(c))
    c.ferry("chaos", "kill-node", "n3")
    wait_until(lambda: all_running(c) and "n3" not in where(c).values(), 180, "the gang to be restored off n3")
    wait_until(lambda: len(rows(c)) >= before + 20, 180, "the driver to count on after the failover")

    got = rows(c)
    assert [x for x, _, _ in got] == list(range(1, len(got) + 1)), "worker 1's actor lost or repeated a call"
    assert [y for _, y, _ in got] == list(range(1, len(got) + 1)), "worker 2's actor lost or repeated a call"
    assert all(sq == x * x for x, _, sq in got)
    for job in ("rg-w1", "rg-w2", "rg-head"):
        c.ferry("kill", job)
    wait_until(lambda: not ray_processes(ray_dir), 60, "Ray's processes to end with the gang")
