"""A node service killed while a job is frozen for it never leaves the job frozen: the restarted
service resumes or finishes what its predecessor froze, and the job's output stays whole."""

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import BIN, PY, Cluster, start_cluster, stop_cluster, wait_until
from tests.e2e.test_control import copies
from tests.e2e.test_resilience import kill_service

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

LINES = 500
# 300 MiB of random bytes (incompressible: the upload takes a while), then a counter


def hog(lines: int) -> list[str]:
    return [PY, "-c", "import os, time\nbuf = os.urandom(300 << 20)\nprint('ready', flush=True)\n"
            f"for i in range({lines}):\n    print(i, flush=True)\n    time.sleep(0.05)\n"]


HOG = hog(LINES)
LONG_LINES = 1500  # runs for 75 s: outlives the checks after a move


@pytest.fixture(scope="module")
def cluster(criu_bin: str) -> Iterator[Cluster]:
    """This file's own cluster, whose nodes are declared lost after 20 s of silence, not 5: each test
    kills a node service, and what it checks is what the restarted service does. Beside another
    cluster on this 2-core machine a restart took longer than 5 s, health declared the node lost
    and the test saw a failover instead (node loss is test_control's and test_cut_off's subject)."""
    c = start_cluster(Path(tempfile.mkdtemp(prefix="ferry-frozen-")), env={"FERRY_HEARTBEAT_TIMEOUT_S": "20"})
    yield c
    stop_cluster(c)


def workload_pid(cluster: Cluster, node: str, job_id: str) -> int:
    shim = cluster.data_dir / "nodes" / node / "jobs" / job_id / "shim.json"
    return int(json.loads(shim.read_text())["pid"])


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("action", [["checkpoint", "--stop"], ["migrate", "--to", "node-2"]],
                         ids=["checkpoint-stop", "cold-migrate"])
def test_checkpointer_killed_while_the_job_is_stopped_for_it(cluster: Cluster, action: list[str]) -> None:
    name = f"frozen-{action[0]}"
    job = cluster.json("run", "--name", name, "--node", "node-1", "--", *HOG)
    cluster.wait_lines(name, 3)
    pid = workload_pid(cluster, "node-1", job["id"])
    cmd = subprocess.Popen([str(BIN / "ferry"), action[0], name, *action[1:], "-o", "json"], env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # CRIU's dump ends with the tree stopped (--leave-stopped, state T) until the upload commits
    wait_until(lambda: proc_state(pid) == "T", 60, "the job to be stopped after its dump", interval=0.005)
    kill_service(cluster, "checkpointer@node-1")
    _, err = cmd.communicate(timeout=240)
    # whatever the command answered, the job Ferry reports is what the job is
    status = cluster.json("status", name)
    if status["state"] == "running":
        # it runs, or soon does: a checkpointer down past the node's lease left it held by its
        # monitor (ferry.criu.hold), and the restarted one's first lease releases it (CI, stop 43:
        # the refused retry of the move answered before that lease did)
        pid_now = workload_pid(cluster, status["node"], job["id"])
        wait_until(lambda: proc_state(pid_now) not in ("T", "t", "gone"), 30,
                   f"the job Ferry reports running to run ({status}, {err})", interval=0.1)
    else:
        assert cmd.returncode == 0 and status["state"] == "preempted", (status, err)
        assert proc_state(pid) == "gone"
        cluster.json("restore", name, "--node", "node-2")
    assert cluster.ferry("wait", name, "--timeout", "180", check=False).returncode == 0
    assert cluster.logs(name).splitlines() == ["ready", *map(str, range(LINES))]
    assert proc_state(pid) == "gone"


def test_a_frozen_job_left_by_a_dead_checkpointer_runs_on_at_its_restart(cluster: Cluster) -> None:
    """The bare mechanism: the stop marker of a checkpoint that never committed, and a stopped tree."""
    name = "frozen-bare"
    job = cluster.json("run", "--name", name, "--node", "node-2", "--", "sh", "-c",
                       "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done")
    cluster.wait_lines(name, 3)
    pid = workload_pid(cluster, "node-2", job["id"])
    jobdir = cluster.data_dir / "nodes" / "node-2" / "jobs" / job["id"]
    incarnation = json.loads((jobdir / "shim.json").read_text())["incarnation"]
    old = cluster.service_pid("checkpointer@node-2")
    os.kill(old, signal.SIGSTOP)  # hold the service while its state is set up as a crash leaves it
    try:
        (jobdir / f"stop-{incarnation}").write_text("ck-never-committed")
        os.kill(pid, signal.SIGSTOP)
        assert wait_until(lambda: proc_state(pid) == "T", 5, "the job to stop")
    finally:
        os.kill(old, signal.SIGKILL)
        os.kill(old, signal.SIGCONT)
    wait_until(lambda: cluster.service_pid("checkpointer@node-2") != old, 30, "the checkpointer to start again")
    wait_until(lambda: proc_state(pid) not in ("T", "t"), 30, "the job to run again")
    # the marker goes after the resume (a restart between the two resumes again): a moment later
    wait_until(lambda: not (jobdir / f"stop-{incarnation}").exists(), 10, "the stop marker to be removed")
    n = cluster.logs(name).count("\n")
    cluster.wait_lines(name, n + 5)
    assert cluster.json("status", name)["state"] == "running"
    cluster.ferry("kill", name)


def shim_restoring(jobdir: Path) -> bool:
    return any("ferry.criu.shim" in (argv := p.info["cmdline"] or []) and "restore" in argv and str(jobdir) in argv
               for p in psutil.process_iter(["cmdline"]))


@pytest.mark.parametrize("action", [["restore", "--node", "node-2"], ["migrate", "--to", "node-2"]],
                         ids=["restore", "cold-migrate"])
def test_migrator_killed_during_a_restore_restores_once_and_soon(cluster: Cluster, action: list[str]) -> None:
    """Before: the move waited out the 60 s ack wait; and the redelivered restore must never start a
    second copy beside the one the dead migrator's shim is still restoring."""
    name, argv = f"mig-{action[0]}", hog(LONG_LINES)
    job = cluster.json("run", "--name", name, "--node", "node-1", "--", *argv)
    cluster.wait_lines(name, 3)
    if action[0] == "restore":
        cluster.json("checkpoint", name, "--stop")
    jobdir = cluster.data_dir / "nodes" / "node-2" / "jobs" / job["id"]
    started = time.monotonic()
    cmd = subprocess.Popen([str(BIN / "ferry"), action[0], name, *action[1:], "-o", "json"], env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: shim_restoring(jobdir), 90, "the target's shim to restore", interval=0.005)
    kill_service(cluster, "migrator@node-2")
    _, err = cmd.communicate(timeout=180)
    assert cmd.returncode == 0, err
    assert time.monotonic() - started < 45
    status = cluster.json("status", name)
    assert status["state"] == "running" and status["node"] == "node-2"
    time.sleep(15)  # past the ack wait: a redelivered restore would have started its copy by now
    assert copies(argv) == 1
    # it counts on where it stopped on node-2 (its whole run would take another 40 s)
    seen = len(cluster.logs(name).splitlines())
    lines = cluster.wait_lines(name, seen + 20).splitlines()
    assert lines == ["ready", *map(str, range(len(lines) - 1))]
    assert cluster.json("status", name)["state"] == "running"
    cluster.ferry("kill", name)
