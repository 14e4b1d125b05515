"""End to end, the control plane: failover after a crash, evacuation on a spot notice, drain with
preempt-and-save, and a scheduler killed in the middle of a failover. Real CLI, cluster, CRIU."""

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

CLUSTER = """
nodes:
  - {id: spot-a, zone: us-east-1a, instance_type: p3.2xlarge, spot: true, price_per_hour: 0.92, cpus: 4}
  - {id: spot-b, zone: us-east-1c, instance_type: p3.2xlarge, spot: true, price_per_hour: 0.95, cpus: 4}
  - {id: od-1, zone: us-east-1a, instance_type: p3.2xlarge, spot: false, price_per_hour: 3.06, cpus: 4}
"""
SMALL = """
nodes:
  - {id: n1, cpus: 2}
  - {id: n2, cpus: 2}
"""
FAST = {"FERRY_HEARTBEAT_TIMEOUT_S": "3", "FERRY_HEARTBEAT_INTERVAL_S": "0.5", "FERRY_REBALANCE_EVERY_S": "1"}


def train(steps: int) -> list[str]:
    return [PY, str(WORKLOADS / "train.py"), "--steps", str(steps), "--sleep", "0.02", "--width", "1024"]


def make_cluster(text: str, extra: Sequence[str] = (), env: dict[str, str] | None = None,
                 prefix: str = "ferry-ctl-") -> Iterator[Cluster]:
    """A cluster of the nodes `text` (a cluster file) lists, with `extra` arguments to `ferry up`."""
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    spec = data_dir.parent / f"{data_dir.name}.yaml"
    spec.write_text(text)
    c = start_cluster(data_dir, extra=["--cluster", str(spec), *extra], env=env or FAST)
    yield c
    stop_cluster(c)


@pytest.fixture
def spot_cluster(criu_bin: str) -> Iterator[Cluster]:
    yield from make_cluster(CLUSTER)


def copies(argv: list[str]) -> int:
    """How many processes run exactly `argv` on this machine."""
    want = "\0".join(argv).encode()
    n = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                n += (proc / "cmdline").read_bytes().rstrip(b"\0") == want
            except OSError:
                pass
    return n


def committed(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    return [c for c in cluster.json("checkpoints", job) if c["state"] == "committed"]


def test_kill_node_fails_over_and_the_output_is_identical(spot_cluster: Cluster) -> None:
    c, argv = spot_cluster, train(300)
    want = reference_output(argv)
    c.json("run", "--name", "fo", "--node", "spot-a", "--checkpoint-every", "2s", "--", *argv)
    c.wait_lines("fo", 30)
    wait_until(lambda: committed(c, "fo"), 60, "a periodic checkpoint")
    killed_at = time.time()
    c.ferry("chaos", "kill-node", "spot-a")
    moved = wait_until(lambda: (s := c.json("status", "fo"))["node"] != "spot-a" and s["state"] == "running" and s,
                       60, "the job to run elsewhere")
    back_after = time.time() - killed_at
    print(f"failover: running again {back_after:.1f}s after the crash")
    assert moved["restarts"] >= 1
    last = committed(c, "fo")[-1]
    # detection (3 s timeout) + restore, with room for this busy 2-core machine and the CLI's polling
    assert back_after < 3 + 15, f"running again only {back_after:.1f}s after the crash"
    # progress lost: at most the checkpoint interval (2 s) plus the time the last checkpoint took, and as
    # long again when the crash hit a checkpoint in flight (plus the scheduler's 0.5 s tick and slack)
    took = float(last["total_ms"]) / 1000
    assert killed_at - float(last["created"]) < 2 + 2 * took + 2
    assert {n["id"]: n["state"] for n in c.json("nodes")}["spot-a"] == "lost"
    assert c.ferry("wait", "fo", "--timeout", "300").returncode == 0
    assert c.logs("fo") == want


def test_spot_notice_moves_the_job_before_the_deadline_without_losing_steps(spot_cluster: Cluster) -> None:
    c, argv = spot_cluster, train(301)
    want = reference_output(argv)
    c.json("run", "--name", "ev", "--node", "spot-a", "--", *argv)
    c.wait_lines("ev", 30)
    notice = c.json("chaos", "spot-notice", "spot-a", "--in", "40s")
    moved = wait_until(lambda: (s := c.json("status", "ev"))["node"] != "spot-a" and s["state"] == "running" and s,
                       40, "the job to leave spot-a")
    assert time.time() < notice["deadline"], "the move finished after the node's deadline"
    assert moved["node"] in ("spot-b", "od-1")
    last = committed(c, "ev")[-1]
    assert last["final"] is True and last["node"] == "spot-a"  # a final checkpoint: no step was lost
    assert {n["id"]: n["state"] for n in c.json("nodes")}["spot-a"] == "preempting"
    assert c.ferry("wait", "ev", "--timeout", "300").returncode == 0
    assert c.logs("ev") == want


def counter(name: str) -> list[str]:
    return ["sh", "-c", f"i=0; while true; do i=$((i+1)); echo {name} $i; sleep 0.05; done"]


def continuous(text: str, name: str) -> bool:
    numbers = [int(line.split()[1]) for line in text.splitlines()]
    return bool(numbers) and numbers == list(range(1, len(numbers) + 1)) and all(
        line.startswith(f"{name} ") for line in text.splitlines())


def test_drain_parks_lower_priority_work_and_it_resumes_when_capacity_returns(small_cluster: Cluster) -> None:
    c = small_cluster
    c.json("run", "--name", "lo", "--node", "n1", "--cpus", "2", "--priority", "1", "--", *counter("lo"))
    c.json("run", "--name", "hi", "--node", "n2", "--cpus", "2", "--priority", "5", "--", *counter("hi"))
    c.wait_lines("lo", 5)
    c.wait_lines("hi", 5)
    drained = c.json("drain", "n2", "--timeout", "120s")
    assert drained["state"] == "draining" and drained["jobs_left"] == []
    hi, lo = c.json("status", "hi"), c.json("status", "lo")
    assert hi["state"] == "running" and hi["node"] == "n1"
    assert lo["state"] == "preempted" and "room for hi" in lo["reason"]
    assert committed(c, "lo")[-1]["final"] is True
    parked_at = c.logs("lo").count("\n")
    c.json("undrain", "n2")
    back = wait_until(lambda: (s := c.json("status", "lo"))["state"] == "running" and s, 60, "lo to resume")
    assert back["node"] == "n2"
    c.wait_lines("lo", parked_at + 10)
    assert continuous(c.logs("lo"), "lo") and continuous(c.logs("hi"), "hi")
    c.ferry("kill", "lo")
    c.ferry("kill", "hi")


def test_scheduler_killed_in_the_middle_of_a_failover(spot_cluster: Cluster) -> None:
    c, argv = spot_cluster, train(302)
    want = reference_output(argv)
    c.json("run", "--name", "mid", "--node", "spot-a", "--checkpoint-every", "2s", "--", *argv)
    c.wait_lines("mid", 30)
    wait_until(lambda: committed(c, "mid"), 60, "a periodic checkpoint")
    c.ferry("chaos", "kill-node", "spot-a")
    # the moment the failover starts, kill the scheduler
    wait_until(lambda: c.json("status", "mid")["state"] in ("restoring", "pending"), 30, "the failover to start")
    old = c.service_pid("scheduler")
    os.kill(old, signal.SIGKILL)
    most = 0
    deadline = time.monotonic() + 300
    while c.json("status", "mid")["state"] not in ("succeeded", "failed"):
        most = max(most, copies(argv))
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)
    assert most <= 1, f"{most} copies of the job ran at once"
    assert c.service_pid("scheduler") != old
    status = c.json("status", "mid")
    assert status["state"] == "succeeded" and status["node"] != "spot-a"
    assert c.logs("mid") == want


def test_bad_control_input(small_cluster: Cluster, tmp_path: Path) -> None:
    c = small_cluster
    for args in (["drain", "n9"], ["undrain", "n9"], ["chaos", "kill-node", "n9"],
                 ["chaos", "spot-notice", "n9", "--in", "30s"]):
        result = c.ferry(*args, check=False)
        assert result.returncode == 2, (args, result.stderr)
        assert "n9" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    huge = c.json("run", "--name", "huge", "--cpus", "64", "--", "sleep", "600")
    assert huge["state"] == "pending"
    assert "needs 64 cpus" in c.json("status", "huge")["reason"]
    c.ferry("kill", "huge")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - {id: a, cpus: many}\n")
    result = subprocess.run([str(BIN / "ferry"), "up", "--cluster", str(bad), "--data-dir", str(tmp_path / "d")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "bad.yaml: nodes[0].cpus" in result.stderr


def test_prices_and_nodes_show_the_cluster_file(spot_cluster: Cluster) -> None:
    nodes = {n["id"]: n for n in spot_cluster.json("nodes")}
    assert nodes["spot-a"]["spot"] is True and nodes["spot-a"]["price_per_hour"] == 0.92
    assert nodes["od-1"]["spot"] is False and nodes["od-1"]["labels"]["zone"] == "us-east-1a"
    prices = spot_cluster.json("prices")
    assert {(n["id"], n["price_per_hour"]) for n in prices["nodes"]} >= {("spot-a", 0.92), ("od-1", 3.06)}
    # an unpinned job goes where it is cheapest
    job = spot_cluster.json("run", "--name", "cheap", "--", "sleep", "600")
    assert job["node"] == "spot-a"
    spot_cluster.ferry("kill", "cheap")


def test_rebalancing_moves_a_job_to_a_cheaper_node_once(spot_cluster: Cluster) -> None:
    c = spot_cluster
    c.json("drain", "spot-a")
    c.json("drain", "spot-b")
    c.json("run", "--name", "rb", "--", *counter("rb"))
    assert c.json("status", "rb")["node"] == "od-1"
    c.wait_lines("rb", 10)
    c.json("checkpoint", "rb")  # a measured move cost
    c.json("undrain", "spot-a")
    moved = wait_until(lambda: (s := c.json("status", "rb"))["node"] == "spot-a" and s["state"] == "running" and s,
                       60, "the job to move to the cheaper spot-a")
    assert moved["restarts"] == 1
    c.json("undrain", "spot-b")
    time.sleep(4)  # several review rounds: spot-b is hardly cheaper, and a move was just made
    status = c.json("status", "rb")
    assert status["node"] == "spot-a" and status["restarts"] == 1
    n = c.logs("rb").count("\n")
    c.wait_lines("rb", n + 5)
    assert continuous(c.logs("rb"), "rb")
    c.ferry("kill", "rb")
