"""`ferry up --nats-cluster 3`: three NATS servers, R3 streams and KV. One server killed in the
middle of a checkpoint, a move and a failover loses nothing, and no job runs twice."""

import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.sim.copies import CopyCounter
from tests.conftest import BIN, PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster, wait_until
from tests.e2e.test_control import FAST, SMALL

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

# long enough (about 40 s) to be still running after a checkpoint and a move that each wait out an
# election: with 400 steps it sometimes ended before the move did
ARGV = [PY, str(WORKLOADS / "train.py"), "--steps", "900", "--sleep", "0.03", "--width", "512"]


@pytest.fixture
def r3_cluster(criu_bin: str) -> Iterator[Cluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-r3-"))
    spec = data_dir.parent / f"{data_dir.name}.yaml"
    spec.write_text(SMALL)
    # the default heartbeat timeout (5 s): a node whose server died is silent until its client retries (2 s)
    c = start_cluster(data_dir, extra=["--cluster", str(spec), "--nats-cluster", "3"],
                      env={**FAST, "FERRY_HEARTBEAT_TIMEOUT_S": "5"})
    yield c
    stop_cluster(c)


def status(c: Cluster) -> dict[str, Any] | None:
    """The job's status, or None while the API says the bus is unavailable (a server just died)."""
    out = c.ferry("status", "r3", "-o", "json", check=False)
    if out.returncode != 0:
        assert "unavailable" in out.stderr, out.stderr
        return None
    return dict(json.loads(out.stdout))


def kill_nats_during(c: Cluster, member: str, *ferry_args: str) -> subprocess.CompletedProcess[str]:
    """Runs `ferry ARGS` and SIGKILLs NATS server `member` half a second in."""
    cmd = subprocess.Popen([str(BIN / "ferry"), *ferry_args], env=c.env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    old = c.service_pid(member)
    threading.Timer(0.5, lambda: os.kill(old, signal.SIGKILL)).start()
    out, err = cmd.communicate(timeout=240)
    wait_until(lambda: c.service_pid(member) != old, 30, f"{member} to be started again")
    return subprocess.CompletedProcess(cmd.args, cmd.returncode, out, err)


def test_one_nats_server_killed_midway_loses_nothing(r3_cluster: Cluster) -> None:
    c, want = r3_cluster, reference_output(ARGV)
    copies = CopyCounter(ARGV)
    copies.start()
    try:
        c.json("run", "--name", "r3", "--node", "n1", "--checkpoint-every", "2s", "--", *ARGV)
        c.wait_lines("r3", 30)
        ck = kill_nats_during(c, "nats-1", "checkpoint", "r3", "-o", "json")
        c.wait_lines("r3", 90)
        moved = kill_nats_during(c, "nats-2", "migrate", "r3", "--to", "n2")
        wait_until(lambda: (s := status(c)) and s["state"] == "running", 60, "the job to run after the move")
        if status(c)["node"] != "n2":  # type: ignore[index]  # refused while the bus re-elected: as a user, again
            assert moved.returncode != 0 and moved.stderr.count("\n") == 1, moved.stderr

            def again() -> bool:  # as a user would, until the bus has settled: a periodic checkpoint
                # (every 2 s) may hold the job, a node whose server died may not have beaten yet.
                # n1 may also miss its beats for 5 s while the streams elect (CI, stop 44): health
                # then declares it lost and the job fails over to n2, the move's target anyway
                if (s := status(c)) and s["node"] == "n2" and s["state"] == "running":
                    return True
                out = c.ferry("migrate", "r3", "--to", "n2", check=False)
                assert out.returncode == 0 or out.stderr.count("\n") == 1, out.stderr
                return out.returncode == 0

            wait_until(again, 60, "the move to be accepted", interval=0.5)
        c.wait_lines("r3", 150)
        c.ferry("chaos", "kill-node", "n2")
        old = c.service_pid("nats-3")
        os.kill(old, signal.SIGKILL)  # the bus loses a server while the scheduler fails the job over
        # 90 s was not always enough on CI's 2 loaded cores (the whole test ran 177 s there, 117 s idle)
        back = wait_until(lambda: (s := status(c)) and s["node"] == "n1" and s["state"] == "running" and s,
                          150, "the job to run on n1 again")
        assert back["restarts"] >= 2
        assert c.ferry("wait", "r3", "--timeout", "300").returncode == 0
    except AssertionError as exc:  # CI removes the data dir: say what the services said
        raise AssertionError(f"{exc}\nstatus: {c.ferry('status', 'r3', check=False).stdout}\n" + c.log_tails(
            "health", "scheduler", "api", "migrator-n1", "migrator-n2", "checkpointer-n1", "checkpointer-n2")) from None
    finally:
        copies.stop()
    assert c.logs("r3") == want
    # rare here (suite runs, never alone yet): the logs are the only trace CI keeps of how it came about
    assert copies.most == 1, f"{copies.most} copies ran at once: {copies.first_many}\n" + c.log_tails(
        "scheduler", "checkpointer-n1", "checkpointer-n2", "migrator-n1", "migrator-n2", lines=80)
    committed = [k for k in c.json("checkpoints", "r3") if k["state"] == "committed"]
    assert committed
    if ck.returncode == 0:  # the checkpoint taken while a server died is one that stayed committed
        assert any(k["id"] in ck.stdout for k in committed)
    else:
        assert ck.stderr.count("\n") == 1, ck.stderr
