"""A dead or paused bus is not a dead node: `ferry up` restarts NATS like any service, and after an
outage longer than the heartbeat timeout no node is declared lost and no job is restarted."""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_until
from tests.e2e.test_frozen import workload_pid
from tests.e2e.test_resilience import COUNTER, kill_service

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

TIMEOUT_S = 3.0  # the heartbeat timeout of make_cluster's clusters (FAST)


def assert_untouched(c: Cluster, name: str, job_id: str, pid: int) -> None:
    status = c.json("status", name)
    assert status["state"] == "running" and status["restarts"] == 0 and status["node"] == "n1", status
    assert workload_pid(c, "n1", job_id) == pid and Path(f"/proc/{pid}").exists()
    assert {n["id"]: n["state"] for n in c.json("nodes")} == {"n1": "ready", "n2": "ready"}
    n = c.logs(name).count("\n")
    c.wait_lines(name, n + 10)


def test_nats_killed_is_started_again_and_nothing_fails_over(small_cluster: Cluster) -> None:
    c = small_cluster
    job = c.json("run", "--name", "bus-kill", "--node", "n1", "--", *COUNTER)
    c.wait_lines("bus-kill", 5)
    pid = workload_pid(c, "n1", job["id"])
    kill_service(c, "nats")
    wait_until(lambda: c.ferry("ps", check=False, timeout=30).returncode == 0, 60, "the cluster to answer again")
    time.sleep(2 * TIMEOUT_S)  # long enough for a wrong loss verdict to be acted on
    assert_untouched(c, "bus-kill", job["id"], pid)
    ck = c.json("checkpoint", "bus-kill")  # the restarted bus carries new work
    assert ck["state"] == "committed"


@pytest.mark.parametrize("end", ["resumed", "killed"])
def test_nats_down_past_the_heartbeat_timeout_loses_no_node(small_cluster: Cluster, end: str) -> None:
    """Paused (hung), then resumed or killed and started again: with a kill the heartbeats the nodes
    queued meanwhile are lost, and the restarted server holds only ones older than the timeout."""
    c = small_cluster
    name = f"bus-{end}"
    job = c.json("run", "--name", name, "--node", "n1", "--", *COUNTER)
    c.wait_lines(name, 5)
    pid = workload_pid(c, "n1", job["id"])
    nats = c.service_pid("nats")
    os.kill(nats, signal.SIGSTOP)
    try:
        time.sleep(3 * TIMEOUT_S)  # every heartbeat in KV is now older than the timeout
    finally:
        os.kill(nats, signal.SIGKILL if end == "killed" else signal.SIGCONT)
    if end == "killed":
        wait_until(lambda: c.service_pid("nats") != nats, 30, "nats to be started again")
    wait_until(lambda: c.ferry("ps", check=False, timeout=30).returncode == 0, 60, "the cluster to answer again")
    time.sleep(2 * TIMEOUT_S)
    assert_untouched(c, name, job["id"], pid)
