"""`ferry adopt PID` (issue 12): a process another supervisor started (here: this test, which
reads its stdout through a pipe) comes under Ferry's care where it runs. It stays this test's
child in its own session; Ferry checkpoints it (leave-running, then --stop), restores it on
another node as a job of its own, and reports its exit status when it ends where it was adopted."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from tests.cgroups import cgroup_of, cgroup_root, scratch_cgroup
from tests.conftest import PY, Cluster, wait_until
from tests.e2e.test_errors import one_line_error

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

COUNT = 400
COUNTER = f"import time\nfor i in range({COUNT}):\n    print(i, flush=True)\n    time.sleep(0.02)\n"


def read_lines(pipe: subprocess.Popen[str], n: int) -> list[str]:
    assert pipe.stdout is not None
    return [pipe.stdout.readline() for _ in range(n)]


def test_an_adopted_process_is_checkpointed_where_it_runs_and_restored_on_another_node(cluster: Cluster) -> None:
    c = cluster
    with scratch_cgroup() as cg:
        proc = subprocess.Popen([PY, "-c", COUNTER], stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            seen = read_lines(proc, 10)
            (cg / "cgroup.procs").write_text(str(proc.pid))  # as a SLURM step's cgroup holds its tree
            job = c.json("adopt", str(proc.pid), "--name", "adopted", "--node", "node-1", "--cgroup", str(cg))
            assert (job["state"], job["node"], job["adopt_pid"], job["adopted"]) == (
                "running", "node-1", proc.pid, True)
            assert "adopted          process" in c.ferry("status", "adopted").stdout
            c.json("checkpoint", "adopted")  # leave-running: it goes on where it was
            seen += read_lines(proc, 10)
            assert psutil.Process(proc.pid).ppid() == os.getpid() and os.getsid(proc.pid) == proc.pid
            assert cgroup_of(proc.pid, cgroup_root()) == f"/{cg.name}"
            refused = one_line_error(c.ferry("migrate", "adopted", "--to", "node-2", check=False), 1)
            assert "its own supervisor" in refused, refused
            final = c.json("checkpoint", "adopted", "--stop")
            assert final["final"]
            assert proc.wait(timeout=60) == -9, "the final checkpoint ends the process where it ran"
            assert proc.stdout is not None
            seen += proc.stdout.read().splitlines(keepends=True)
        finally:
            proc.kill()
            proc.wait()
    assert c.json("status", "adopted")["state"] == "preempted"

    c.json("restore", "adopted", "--node", "node-2")  # from here on it is Ferry's: its output is the job's
    assert c.ferry("wait", "adopted", "--timeout", "120").returncode == 0
    status = c.json("status", "adopted")
    assert (status["node"], status["adopt_pid"]) == ("node-2", 0)
    after = c.logs("adopted")
    assert [int(x) for x in "".join(seen).split() + after.split()] == list(range(COUNT)), \
        "the count restarted, skipped or repeated across the adoption's checkpoint and restore"


def test_an_adopted_process_that_ends_reports_its_exit_status(cluster: Cluster) -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 1.5; exit 5"], start_new_session=True)
    try:
        cluster.json("adopt", str(proc.pid), "--name", "adopted-exit", "--node", "node-1")
        # this test, its parent, reaps it only afterwards: Ferry reads the status from the zombie
        done = cluster.ferry("wait", "adopted-exit", "--timeout", "60", check=False)
        assert done.returncode == 5, (done.stdout, done.stderr)
        assert cluster.json("status", "adopted-exit")["state"] == "failed"
    finally:
        proc.kill()
    assert proc.wait() == 5, "Ferry took the exit status from its real parent"


def test_a_cgroup_must_hold_exactly_the_adopted_tree(cluster: Cluster) -> None:
    one = subprocess.Popen(["sleep", "600"], start_new_session=True)
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        with scratch_cgroup() as cg, scratch_cgroup() as empty:
            for proc in (one, other):
                (cg / "cgroup.procs").write_text(str(proc.pid))
            for where, says in ((cg, f"outside the tree of {one.pid} ({other.pid})"), (empty, "is not in the cgroup")):
                line = one_line_error(cluster.ferry("adopt", str(one.pid), "--cgroup", str(where), "--name",
                                                    "adopt-cg", "--node", "node-1", check=False), 2)
                assert says in line, line
            assert "adopt-cg" not in {j["name"] for j in cluster.json("ps", "-a")}
    finally:
        for proc in (one, other):
            proc.kill()
            proc.wait()


def test_processes_ferry_cannot_adopt_are_refused_before_anything_starts(cluster: Cluster) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    nested = subprocess.Popen(["unshare", "-pf", "sh", "-c", "sleep 600 & wait"], start_new_session=True)
    try:
        inner = wait_until(lambda: [p.pid for p in psutil.Process(nested.pid).children(recursive=True)
                                    if p.name() == "sleep"], 10, "the sleep in its own PID namespace")[0]
        cases = [(str(gone.pid), "no process"), ("1", "1 is this machine's init"),
                 (str(os.getpid()), "this command or one of its parents"),
                 (str(cluster.service_pid("checkpointer@node-1")), "Ferry's own"),
                 (str(inner), "shares a PID namespace")]
        for pid, says in cases:
            line = one_line_error(cluster.ferry("adopt", pid, "--name", "adopt-bad", "--node", "node-1",
                                                check=False), 2)
            assert says in line, (pid, line)
        assert "adopt-bad" not in {j["name"] for j in cluster.json("ps", "-a")}
    finally:
        os.killpg(nested.pid, 9)
        nested.wait()
