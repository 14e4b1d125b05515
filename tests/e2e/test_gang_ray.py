"""A Ray cluster as a gang (issue 15), made by `ferry ray up`: a head (running the driver) and two
worker nodes, each a gang member on its own Ferry node, the driver calling a stateful actor on each
worker. One worker moves
live while the driver works; the gang is checkpointed and restored whole on other nodes; a worker's
node dies and the gang comes back from its last group checkpoint. Through all of it the actors'
counts go on with no number lost or repeated."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import PY, Cluster, wait_until
from tests.e2e.test_ray import ray_processes
from tests.netdiag import network_diagnosis

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

# The driver, run in the head's job by `ferry ray up -- ...` (Ray wants drivers on a Ray node),
# calling a counter actor pinned to each worker (`ferry ray up` gives worker i the resource
# "NAME-wi"; the actors wait for their workers to join) and a task wherever a CPU is free.
DRIVER = """
import time, ray
ray.init(log_to_driver=False)  # RAY_ADDRESS=auto: the head it runs beside

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

a = Counter.options(resources={"rg-w1": 1}).remote()
b = Counter.options(resources={"rg-w2": 1}).remote()
print("ready", flush=True)
while True:
    x, y = ray.get([a.inc.remote(), b.inc.remote()])
    sq = ray.get(square.remote(x))
    print(x, y, sq, flush=True)
    time.sleep(0.1)
"""

MEMBERS = ("rg-head", "rg-w1", "rg-w2")


RAY_DIR = "/tmp/ferry-ray-rg"  # where `ferry ray up --name rg` keeps Ray's session


def rows(c: Cluster) -> list[tuple[int, int, int]]:
    lines = c.logs("rg-head").splitlines()
    if "ready" not in lines:
        return []
    return [(int(x), int(y), int(sq)) for x, y, sq in (line.split() for line in lines[lines.index("ready") + 1:])]


STALL_S = 20.0  # a driver this long without a row is stuck: the network is read while it still is


def counts_past(c: Cluster, more: int, start: int | None = None, after: object = None) -> None:
    """Waits for `more` rows. `after`: what the step before returned (a move's figures), printed
    with a failure, and with it the job network as it was once the driver had stalled."""
    start = len(rows(c)) if start is None else start
    seen, since, stalled = start, time.monotonic(), ""

    def counted() -> bool:
        nonlocal seen, since, stalled
        n = len(rows(c))
        if n != seen:
            seen, since = n, time.monotonic()
        elif not stalled and time.monotonic() - since > STALL_S:
            stalled = network_diagnosis(c, MEMBERS)
        return n >= start + more
    try:
        wait_until(counted, 180, f"the driver to count {more} more")
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe step before returned: {after}\n"
                             f"the network {STALL_S:.0f} s into the stall:\n{stalled}\n{diagnosis(c)}") from None


def diagnosis(c: Cluster) -> str:
    """What a stalled driver leaves to read: the members' records, the head's last output, Ray's
    own warnings and errors (its session logs), the job network as the nodes and the members see
    it, and the node services' warnings, so a failure in CI says where the calls stopped."""
    parts = []
    for node in ("n1", "n2", "n3"):
        for svc in ("checkpointer", "migrator"):
            log = c.data_dir / "logs" / f"{svc}-{node}.log"
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            warned = [line[:300] for line in lines if " WARNING " in line or " ERROR " in line]
            parts.append(f"--- {svc}@{node} warnings\n" + "\n".join(warned[-15:]))
    for job in MEMBERS:
        s = c.json("status", job)
        parts.append(f"{job}: {s.get('state')} on {s.get('node')}, exit {s.get('exit_code')}, "
                     f"{s.get('error') or s.get('reason') or ''}")
    for stream in ("stdout", "stderr"):
        out = c.ferry("logs", "rg-head", "--stream", stream, check=False).stdout
        parts.append(f"head's last {stream}:\n" + "\n".join(out.splitlines()[-15:]))
    logs = Path(RAY_DIR) / "session_latest" / "logs"
    found = []
    for f in sorted(logs.glob("*.*")) if logs.is_dir() else ():
        if f.suffix in (".log", ".out", ".err"):
            found += [f"{f.name}: {line[:300]}" for line in f.read_text(errors="replace").splitlines()
                      if (" W " in line[:40] or " E " in line[:40] or "Error" in line)
                      and "cannot be loaded because" not in line]  # the dashboard's missing extras
    parts.append("Ray's warnings and errors:\n" + "\n".join(found[-60:]))
    return "\n".join(parts)


def where(c: Cluster) -> dict[str, str]:
    return {job: c.json("status", job)["node"] for job in MEMBERS}


def all_running(c: Cluster) -> bool:
    return all(c.json("status", job)["state"] == "running" for job in MEMBERS)


def test_a_ray_cluster_gang_moves_a_worker_live_restores_whole_and_survives_a_workers_node(
        three_nodes: Cluster) -> None:
    c = three_nodes
    up = c.json("ray", "up", "--name", "rg", "--workers", "2", "--nodes", "n1,n2,n3", "--cpus", "1", "--",
                PY, "-c", DRIVER)
    assert [m["name"] for m in up["members"]] == ["rg-head", "rg-w1", "rg-w2"], up
    assert all(m["gang"] == "rg" and m["labels"]["source"] == "ray" for m in up["members"])
    wait_until(lambda: len(rows(c)) >= 10, 300, "the driver to start counting on both workers")

    # (b) a worker moves live while the driver keeps calling it; the rest runs on
    moved = c.json("migrate", "rg-w1", "--to", "n1", "--live")
    assert where(c)["rg-w1"] == "n1"
    counts_past(c, 20, after=moved)

    # (a) the whole gang, stopped with one group checkpoint and restored on other nodes
    group = c.json("checkpoint", "--gang", "rg", "--stop")
    assert len(group["members"]) == 3 and group["freeze_ms"] <= group["freeze_ms_sum"], group
    wait_until(lambda: not ray_processes(RAY_DIR), 60, "Ray's processes to stop with the gang")
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
    counts_past(c, 20, start=before)  # after the failover

    got = rows(c)
    assert [x for x, _, _ in got] == list(range(1, len(got) + 1)), "worker 1's actor lost or repeated a call"
    assert [y for _, y, _ in got] == list(range(1, len(got) + 1)), "worker 2's actor lost or repeated a call"
    assert all(sq == x * x for x, _, sq in got)
    for job in MEMBERS:
        c.ferry("kill", job)
    wait_until(lambda: not ray_processes(RAY_DIR), 60, "Ray's processes to end with the gang")
