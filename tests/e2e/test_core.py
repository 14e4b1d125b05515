"""End to end: the real `ferry` CLI against a real all-in-one cluster, with real CRIU and NATS."""

import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster, wait_until
from tests.e2e.test_frozen import workload_pid

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

TRAIN = [PY, str(WORKLOADS / "train.py"), "--steps", "160", "--sleep", "0.01", "--width", "1024"]
MEMHOG = [PY, str(WORKLOADS / "memhog.py"), "--mib", "48", "--dirty-pct", "5", "--interval", "0.1", "--rounds", "40"]


def test_nodes_are_ready_with_criu(cluster: Cluster) -> None:
    nodes = {n["id"]: n for n in cluster.json("nodes")}
    for name in ("node-1", "node-2"):
        assert nodes[name]["state"] == "ready"
        assert nodes[name]["criu_ok"] is True
        assert nodes[name]["criu_version"].startswith("4.")


def test_train_checkpointed_at_a_random_step_continues_identically_on_node_2(cluster: Cluster) -> None:
    want = reference_output(TRAIN)
    job = cluster.json("run", "--name", "train-e2e", "--node", "node-1", "--", *TRAIN)
    assert job["state"] == "running" and job["node"] == "node-1"
    step = random.randint(5, 120)
    cluster.wait_lines("train-e2e", step)
    ck = cluster.json("checkpoint", "train-e2e", "--stop")
    assert ck["final"] is True and ck["state"] == "committed"
    for key in ("id", "job", "bytes_logical", "bytes_uploaded", "freeze_ms", "dump_ms", "upload_ms"):
        assert key in ck
    assert ck["bytes_logical"] > 10 * 2**20 and ck["bytes_uploaded"] > 0 and ck["dump_ms"] > 0
    assert cluster.json("status", "train-e2e")["state"] == "preempted"
    moved = cluster.json("restore", "train-e2e", "--node", "node-2")
    assert moved["node"] == "node-2" and moved["state"] == "running" and moved["restarts"] == 1
    done = cluster.ferry("wait", "train-e2e", "--timeout", "300")
    assert done.returncode == 0
    status = cluster.json("status", "train-e2e")
    assert status["state"] == "succeeded" and status["exit_code"] == 0 and status["node"] == "node-2"
    assert status["last_checkpoint"] == ck["id"]
    got = cluster.logs("train-e2e")
    assert got.splitlines() == want.splitlines()
    assert got.splitlines()[-1].startswith("done ")


def test_migrate_there_and_back_keeps_train_output_identical(cluster: Cluster) -> None:
    want = reference_output(TRAIN)
    cluster.json("run", "--name", "train-mig", "--node", "node-1", "--network", "host", "--", *TRAIN)
    cluster.wait_lines("train-mig", 20)
    there = cluster.json("migrate", "train-mig", "--to", "node-2")
    assert there["node"] == "node-2" and there["state"] == "running"
    # a cold move makes no progress from its dump to its restore: that whole time is lost
    assert there["lost_basis"] == "pause" and 0 < there["lost_s"] <= there["total_ms"] / 1000, there
    assert there["last_move_lost_s"] == there["lost_s"]
    assert "of progress, against the job unmoved" in cluster.ferry("status", "train-mig").stdout
    cluster.wait_lines("train-mig", 60)
    back = cluster.json("migrate", "train-mig", "--to", "node-1")
    assert back["node"] == "node-1" and back["restarts"] == 2
    assert cluster.ferry("wait", "train-mig", "--timeout", "300").returncode == 0
    assert cluster.logs("train-mig") == want


def test_memhog_restored_on_the_other_node_prints_the_same_crc_sequence(cluster: Cluster) -> None:
    want = reference_output(MEMHOG)
    cluster.json("run", "--name", "memhog-e2e", "--node", "node-2", "--", *MEMHOG)
    cluster.wait_lines("memhog-e2e", 8)
    cluster.json("checkpoint", "memhog-e2e", "--stop")
    cluster.json("restore", "memhog-e2e", "--node", "node-1")
    assert cluster.ferry("wait", "memhog-e2e", "--timeout", "300").returncode == 0
    got = cluster.logs("memhog-e2e")
    assert got == want
    assert len(got.splitlines()) == 41


def test_process_tree_with_pipes_survives_and_its_exit_code_is_reported(cluster: Cluster, tmp_path: Path) -> None:
    # after its 20th line the producer waits for `go`, made once the tree runs on node-2: on a
    # loaded machine the whole count could otherwise end before the checkpoint (a dump of a tree
    # that exits under it fails)
    go = tmp_path / "go"
    script = (
        "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo $i; "
        f"if [ $i -eq 20 ]; then while [ ! -e {go} ]; do sleep 0.05; done; fi; sleep 0.05; done | "
        'while read x; do echo "got $x"; done; exit 7'
    )
    cluster.json("run", "--name", "tree", "--node", "node-1", "--", "sh", "-c", script)
    cluster.wait_lines("tree", 15)
    cluster.json("checkpoint", "tree", "--stop")
    cluster.json("restore", "tree", "--node", "node-2")
    go.touch()
    waited = cluster.ferry("wait", "tree", "--timeout", "120", check=False)
    assert waited.returncode == 7
    status = cluster.json("status", "tree")
    assert status["state"] == "failed" and status["exit_code"] == 7
    assert cluster.logs("tree").splitlines() == [f"got {i}" for i in range(1, 61)]


def test_a_job_that_ends_during_its_checkpoint_is_said_to_have_ended_in_one_line(cluster: Cluster) -> None:
    """The job is killed the moment CRIU seizes it (its TracerPid turns to CRIU's): the checkpoint
    fails with a line that says the job ended, not CRIU's words for a namespace that went away
    under it, and the job's end is reported as any other."""
    job = cluster.json("run", "--name", "gone", "--node", "node-1", "--", "sh", "-c",
                       "while true; do echo x; sleep 0.05; done")
    cluster.wait_lines("gone", 3)
    pid = workload_pid(cluster, "node-1", job["id"])
    done = threading.Event()

    def kill_once_seized() -> None:
        while not done.is_set():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return
            if re.search(r"^TracerPid:\s*[1-9]", status, re.M):
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.0005)
    killer = threading.Thread(target=kill_once_seized)
    killer.start()
    try:
        result = cluster.ferry("checkpoint", "gone", check=False)
    finally:
        done.set()
        killer.join()
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "job gone ended while it was being checkpointed, so nothing was saved" in lines[0], lines
    assert [c["state"] for c in cluster.json("checkpoints", "gone")] == ["failed"]  # none committed
    ended = wait_until(lambda: (s := cluster.json("status", "gone"))["state"] == "failed" and s, 30, "its end")
    assert ended["exit_code"] == 128 + signal.SIGKILL, ended


def test_second_checkpoint_uploads_only_what_changed(cluster: Cluster) -> None:
    argv = [PY, str(WORKLOADS / "memhog.py"), "--mib", "256", "--dirty-pct", "5", "--interval", "3"]
    cluster.json("run", "--name", "incr", "--node", "node-1", "--", *argv)
    cluster.wait_lines("incr", 1)  # "ready 256": the buffer is filled
    first = cluster.json("checkpoint", "incr")
    lines = cluster.logs("incr").count("\n")
    cluster.wait_lines("incr", lines + 1)  # one round rewrote 5% of the buffer
    second = cluster.json("checkpoint", "incr")
    assert first["bytes_logical"] > 256 * 2**20
    assert second["parent"] == first["id"]
    ratio = second["bytes_uploaded"] / first["bytes_uploaded"]
    assert ratio < 0.2, f"second checkpoint uploaded {ratio:.1%} of the first"
    cluster.ferry("kill", "incr")
    assert cluster.json("status", "incr")["state"] == "killed"


def test_periodic_checkpoints(cluster: Cluster) -> None:
    cluster.json(
        "run",
        "--name",
        "periodic",
        "--checkpoint-every",
        "1s",
        "--",
        "sh",
        "-c",
        "while true; do date +%s%N; sleep 0.1; done",
    )
    wait_until(
        lambda: len([c for c in cluster.json("checkpoints", "periodic") if c["state"] == "committed"]) >= 2,
        60,
        "two periodic checkpoints",
    )
    assert cluster.json("status", "periodic")["state"] in ("running", "checkpointing")
    cluster.ferry("kill", "periodic")


def test_logs_follow_ends_with_the_job(cluster: Cluster) -> None:
    cluster.json("run", "--name", "follow", "--", "sh", "-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done")
    out = cluster.ferry("logs", "follow", "-f", timeout=60).stdout
    assert out.splitlines() == [f"line {i}" for i in range(1, 6)]
    assert cluster.json("status", "follow")["state"] == "succeeded"


def test_env_and_cwd_reach_the_workload(cluster: Cluster, tmp_path: Path) -> None:
    cluster.json(
        "run",
        "--name",
        "envcwd",
        "--cwd",
        str(tmp_path),
        "--env",
        "GREETING=hello world",
        "--",
        "sh",
        "-c",
        'echo "$GREETING"; pwd',
    )
    assert cluster.ferry("wait", "envcwd", "--timeout", "60").returncode == 0
    assert cluster.logs("envcwd").splitlines() == ["hello world", str(tmp_path)]


def test_ps_and_kill(cluster: Cluster) -> None:
    cluster.json("run", "--name", "sleeper", "--", "sleep", "600")
    names = {j["name"]: j for j in cluster.json("ps")}
    assert names["sleeper"]["state"] == "running"
    killed = cluster.json("kill", "sleeper", "--grace", "1s")
    assert killed["state"] == "killed"
    assert "sleeper" not in {j["name"] for j in cluster.json("ps")}
    assert "sleeper" in {j["name"] for j in cluster.json("ps", "-a")}
    waited = cluster.ferry("wait", "sleeper", check=False)
    assert waited.returncode == 137


def test_a_stopped_cluster_leaves_no_scratch_behind(tmp_path: Path) -> None:
    """The nodes' scratch folders are in /dev/shm (memory): a dump or restore a killed service left
    there would hold that memory until the host reboots, so `ferry up` removes them as it stops."""
    from ferry.node.base import scratch_dir

    c = start_cluster(tmp_path / "ferry", nodes=1)
    try:
        c.json("run", "--name", "scratch-job", "--", "sh", "-c", "while true; do echo x; sleep 0.05; done")
        c.wait_lines("scratch-job", 3)
        c.json("checkpoint", "scratch-job")
        scratch = scratch_dir("", (tmp_path / "ferry" / "nodes" / "node-1").resolve(), "node-1")
        assert scratch.is_dir()
        (scratch / "restore-left-by-a-killed-migrator").mkdir()
    finally:
        stop_cluster(c)
    assert not scratch.exists()
