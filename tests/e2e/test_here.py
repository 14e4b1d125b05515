"""`ferry run --here` and `ferry restore --here` (issue 12): the job runs as a child of the
command, in its cgroup, with its output on the command's stdout and stderr, and the command ends
with the job's exit status. With --checkpoint-on-term a SIGTERM checkpoints the job before it
stops, and `ferry restore --here` on another node continues it where it was; Ferry itself never
moves such a job."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.cgroups import scratch_cgroup
from tests.conftest import BIN, PY, Cluster, wait_until
from tests.e2e.test_errors import one_line_error

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

COUNT = 300
COUNTER = f"import time\nfor i in range({COUNT}):\n    print(i, flush=True)\n    time.sleep(0.05)\n"


def here(c: Cluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(BIN / "ferry"), *args], env=c.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_here_job_is_the_commands_child_in_its_cgroup_and_ends_with_its_exit_code(cluster: Cluster) -> None:
    script = "echo out; echo err >&2; cat /proc/self/cgroup; exit 3"
    with scratch_cgroup() as cg:
        done = cluster.ferry("run", "--here", "--node", "node-1", "--name", "here-exit", "--cgroup", str(cg),
                             "--", "sh", "-c", script, check=False)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert done.stdout.startswith("out\n") and f"/{cg.name}" in done.stdout, done.stdout
    assert done.stderr == "err\n", done.stderr
    status = cluster.json("status", "here-exit")
    assert (status["state"], status["exit_code"], status["node"], status["here"]) == ("failed", 3, "node-1", True)


def test_a_sigterm_checkpoints_a_here_job_and_a_restore_here_elsewhere_continues_it(cluster: Cluster) -> None:
    c = cluster
    first = here(c, "run", "--here", "--node", "node-1", "--name", "here-count", "--checkpoint-on-term",
                 "--", PY, "-c", COUNTER)
    try:
        wait_until(lambda: c.ferry("logs", "here-count", check=False).stdout.count("\n") >= 30, 120,
                   "30 lines from here-count")
        refused = one_line_error(c.ferry("migrate", "here-count", "--to", "node-2", check=False), 1)
        assert "--here" in refused, refused
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 143, (first.returncode, err)
    assert "checkpointing the job" in err and "checkpointed as" in err, err
    status = c.json("status", "here-count")
    assert status["state"] == "preempted" and status["last_checkpoint"], status
    before = out.count("\n")
    assert before >= 30

    second = here(c, "restore", "here-count", "--here", "--node", "node-2")
    try:
        out2, err2 = second.communicate(timeout=180)
    finally:
        second.kill()
    assert second.returncode == 0, err2
    assert [int(x) for x in (out + out2).split()] == list(range(COUNT)), "the count restarted, skipped or repeated"
    status = c.json("status", "here-count")  # the command returns once the job's end is recorded
    assert (status["state"], status["node"], status["restarts"]) == ("succeeded", "node-2", 1), status


@pytest.mark.parametrize(("args", "says"), [
    (["--here"], "--here: say which node this is"),
    (["--here", "--node", "node-9"], "no node 'node-9'"),
    (["--here", "--node", "node-1", "--cgroup", "/nonexistent"], "--cgroup /nonexistent: not a cgroup"),
    (["--cgroup", "/sys/fs/cgroup"], "--cgroup works only with --here"),
])
def test_bad_here_requests_are_refused_before_anything_starts(cluster: Cluster, args: list[str], says: str) -> None:
    env = {k: v for k, v in cluster.env.items() if k != "FERRY_NODE_ID"}
    result = subprocess.run([str(BIN / "ferry"), "run", "--name", "here-bad", *args, "--", "true"], env=env,
                            capture_output=True, text=True, timeout=60)
    line = one_line_error(result, 2)
    assert says in line, line
    assert "here-bad" not in {j["name"] for j in cluster.json("ps", "-a")}
