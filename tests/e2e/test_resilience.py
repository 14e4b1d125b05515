"""Every service survives being killed (SIGKILL) and started again: no job, node or checkpoint is lost."""

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import Cluster, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"]


def kill_service(cluster: Cluster, name: str) -> None:
    old = cluster.service_pid(name)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: cluster.service_pid(name) != old, 30, f"{name} to be started again")


def test_scheduler_killed_loses_nothing(cluster: Cluster) -> None:
    cluster.json("run", "--name", "res-sched", "--node", "node-1", "--", *COUNTER)
    ck = cluster.json("checkpoint", "res-sched")
    kill_service(cluster, "scheduler")
    status = cluster.json("status", "res-sched")
    assert status["state"] == "running" and status["last_checkpoint"] == ck["id"]
    assert [c["id"] for c in cluster.json("checkpoints", "res-sched")] == [ck["id"]]
    # the restarted scheduler takes new work
    moved = cluster.json("migrate", "res-sched", "--to", "node-2")
    assert moved["node"] == "node-2"
    cluster.ferry("kill", "res-sched")


def test_checkpointer_killed_still_reports_exit_codes(cluster: Cluster) -> None:
    cluster.json("run", "--name", "res-ckpt", "--node", "node-1", "--", "sh", "-c", "sleep 2; exit 3")
    kill_service(cluster, "checkpointer@node-1")
    result = cluster.ferry("wait", "res-ckpt", "--timeout", "60", check=False)
    assert result.returncode == 3
    assert cluster.json("status", "res-ckpt")["state"] == "failed"


def test_checkpointer_killed_keeps_the_workload_running(cluster: Cluster) -> None:
    cluster.json("run", "--name", "res-ckpt2", "--node", "node-2", "--", *COUNTER)
    cluster.wait_lines("res-ckpt2", 3)
    kill_service(cluster, "checkpointer@node-2")
    n = cluster.logs("res-ckpt2").count("\n")
    cluster.wait_lines("res-ckpt2", n + 10)
    ck = cluster.json("checkpoint", "res-ckpt2")
    assert ck["state"] == "committed"
    cluster.ferry("kill", "res-ckpt2")


def test_api_and_migrator_killed(cluster: Cluster) -> None:
    cluster.json("run", "--name", "res-api", "--node", "node-1", "--", *COUNTER)
    kill_service(cluster, "api")
    wait_until(lambda: cluster.ferry("ps", check=False).returncode == 0, 30, "the API to answer again")
    kill_service(cluster, "migrator@node-2")
    moved = cluster.json("migrate", "res-api", "--to", "node-2")
    assert moved["node"] == "node-2" and moved["state"] == "running"
    nodes = {n["id"] for n in cluster.json("nodes")}
    assert {"node-1", "node-2"} <= nodes
    cluster.ferry("kill", "res-api")


def test_services_answer_check_probes(cluster: Cluster) -> None:
    base = {**cluster.env, "FERRY_NATS_URL": cluster.up_state()["nats_url"]}

    def env(user: str) -> dict[str, str]:  # each probe with its service's NATS user, as in a pod
        return {**base, "FERRY_NATS_CREDS": str(cluster.data_dir / "secrets" / "nats" / f"{user}.json")}

    for args, user in ((["ferry.scheduler"], "scheduler"), (["ferry.api"], "api"), (["ferry.health"], "health"),
                       (["ferry.checkpointer", "--node", "node-1"], "checkpointer@node-1"),
                       (["ferry.migrator", "--node", "node-2"], "migrator@node-2")):
        probe = subprocess.run([sys.executable, "-m", *args, "--check"], env=env(user), capture_output=True,
                               timeout=60)
        assert probe.returncode == 0, (args, probe.stderr)
    missing = subprocess.run([sys.executable, "-m", "ferry.checkpointer", "--node", "node-77", "--check"],
                             env=env("checkpointer@node-1"), capture_output=True, timeout=60)
    assert missing.returncode == 1
