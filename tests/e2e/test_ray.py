"""Ray (PyPI `ray`, installed by setup.sh) started inside a Ferry job: `ray.init()` with an actor
in a bridge network, and `ray start --head` plus a worker node in an isolated one. Each job is
checkpointed, moved cold and live and (the first) stopped and restored on the other node; its
actor keeps counting from where it was, with no number lost or repeated, and its GCS keeps both
Ray nodes alive. Ray's daemons (gcs_server, raylet, workers) talk over TCP on the job's own
addresses, which is what needs the job's network namespace (issue 12)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray

from tests.conftest import PY, Cluster, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

RAY_BIN = str(Path(PY).with_name("ray"))
STORE = 80 * 1024 * 1024  # about Ray's smallest object store

INIT_DRIVER = f"""
import sys, time, ray
ray.init(num_cpus=1, include_dashboard=False, object_store_memory={STORE}, _temp_dir=sys.argv[1],
         log_to_driver=False)

@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n

counter = Counter.remote()
ref = ray.put(list(range(1000)))  # an object in the object store, read on every step
print("ready", flush=True)
while True:
    print(ray.get(counter.inc.remote()), sum(ray.get(ref)), flush=True)
    time.sleep(0.1)
"""

# Token authentication is off: the Ray cluster lives in the job's isolated namespace, where only
# the job's own processes can reach it.
TWO_NODES = f"""
set -e
export RAY_AUTH_MODE=disabled
"$RAY" start --head --num-cpus=1 --include-dashboard=false --object-store-memory={STORE} \\
    --temp-dir="$1" --disable-usage-stats >/dev/null
"$RAY" start --address=127.0.0.1:6379 --num-cpus=1 --object-store-memory={STORE} \\
    --resources='{{"worker": 1}}' --disable-usage-stats >/dev/null
exec "$PY" -u -c '
import time, ray
ray.init(address="auto", log_to_driver=False)

@ray.remote(resources={{"worker": 1}})  # on the worker node
class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n

counter = Counter.remote()
print("ready", flush=True)
while True:
    n = ray.get(counter.inc.remote())
    print(n, sum(node["Alive"] for node in ray.nodes()) if n % 10 == 0 else "-", flush=True)
    time.sleep(0.1)
'
"""


@pytest.fixture
def ray_dir() -> Iterator[str]:
    # Ray's unix sockets live under its temp dir: a short path keeps them under 108 bytes
    path = tempfile.mkdtemp(prefix="fray-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def counted(c: Cluster, job: str) -> list[list[str]]:
    lines = c.logs(job).splitlines()
    assert "ready" in lines, lines[-20:]
    return [line.split() for line in lines[lines.index("ready") + 1:]]


def assert_unbroken(rows: list[list[str]]) -> None:
    numbers = [int(row[0]) for row in rows]
    assert numbers == list(range(1, len(numbers) + 1)), [n for i, n in enumerate(numbers) if n != i + 1][:10]


def counts_past(c: Cluster, job: str, more: int) -> None:
    start = len(counted(c, job))
    wait_until(lambda: len(counted(c, job)) >= start + more, 120, f"{job} to count {more} more")


def ray_processes(ray_dir: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(ray_dir in arg for arg in p.info["cmdline"] or ()):
            found.append(p.pid)
    return found


def on(c: Cluster, job: str, node: str) -> None:
    wait_until(lambda: (s := c.json("status", job))["node"] == node and s["state"] == "running", 120,
               f"{job} to run on {node}")


def test_ray_init_with_an_actor_moves_cold_and_live_and_restores_after_a_stop(cluster: Cluster,
                                                                              ray_dir: str) -> None:
    assert ray.__version__  # the Ray the job runs is the one setup.sh installed
    c = cluster
    c.json("run", "--name", "ray-init", "--network", "bridge", "--node", "node-1", "--",
           PY, "-c", INIT_DRIVER, ray_dir)
    c.wait_lines("ray-init", 20, timeout=240)
    counts_past(c, "ray-init", 10)
    assert len(ray_processes(ray_dir)) >= 3  # gcs_server, raylet and at least the actor's worker
    c.json("checkpoint", "ray-init")
    for node, live in (("node-2", False), ("node-1", True)):
        c.json("migrate", "ray-init", "--to", node, *(["--live"] if live else []))
        on(c, "ray-init", node)
        counts_past(c, "ray-init", 10)
    c.json("checkpoint", "ray-init", "--stop")
    wait_until(lambda: not ray_processes(ray_dir), 30, "Ray's processes to stop with the job")
    stopped = len(counted(c, "ray-init"))
    c.json("restore", "ray-init", "--node", "node-2")
    on(c, "ray-init", "node-2")
    counts_past(c, "ray-init", 10)
    rows = counted(c, "ray-init")
    assert_unbroken(rows)
    assert int(rows[stopped][0]) == stopped + 1  # it went on from the checkpoint, not from 1
    assert {row[1] for row in rows} == {str(sum(range(1000)))}  # the stored object came along
    c.json("kill", "ray-init")
    wait_until(lambda: not ray_processes(ray_dir), 30, "Ray's processes to end with the job")


def test_a_ray_head_and_worker_node_move_together_in_an_isolated_job(cluster: Cluster, ray_dir: str) -> None:
    c = cluster
    c.json("run", "--name", "ray-two", "--network", "isolated", "--node", "node-1", "--",
           "env", f"RAY={RAY_BIN}", f"PY={PY}", "bash", "-c", TWO_NODES, "ray-two", ray_dir)
    c.wait_lines("ray-two", 20, timeout=240)
    counts_past(c, "ray-two", 10)
    for node, live in (("node-2", False), ("node-1", True)):
        c.json("migrate", "ray-two", "--to", node, *(["--live"] if live else []))
        on(c, "ray-two", node)
        counts_past(c, "ray-two", 25)
    rows = counted(c, "ray-two")
    assert_unbroken(rows)
    alive = [row[1] for row in rows if row[1] != "-"]
    assert alive and set(alive[-2:]) == {"2"}, alive  # both Ray nodes are still alive after the moves
    c.json("kill", "ray-two")
    wait_until(lambda: not ray_processes(ray_dir), 30, "Ray's processes to end with the job")
