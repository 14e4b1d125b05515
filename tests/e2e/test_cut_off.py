"""A node cut off from the bus, or whose checkpointer is paused, holds its jobs before anyone may
declare it lost.

Its checkpointer's connection to NATS is cut with nftables (packets dropped both ways, the socket
kept: the client sees no error, its writes just never arrive), so the node falls silent while its
job runs on. The other node keeps beating, health declares the silent one lost and the scheduler
restores the job on n2 from its last checkpoint. Without the hold the old copy ran beside the new
one until the node heard the bus again; with it the old copy is stopped before the loss can be
declared, and killed once the node is back and reads that the job moved on. A paused checkpointer
can stop nothing itself: the job's own monitor holds it when the lease the checkpointer no longer
renews runs out."""

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from ferry.sim.copies import CopyCounter
from tests.conftest import Cluster, wait_until
from tests.e2e.test_frozen import proc_state, workload_pid
from tests.e2e.test_resilience import kill_service

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

# a counter with a command line of its own, for the copy count
ARGV = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done # cut-off"]
TABLE = f"ferry_test_cut_off_{os.getpid()}"  # one per test process: two never remove each other's


@contextlib.contextmanager
def cut_off(pid: int) -> Iterator[list[int]]:
    """Drops every packet of the TCP connections process `pid` has now, both ways, while inside."""
    ports = sorted({c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                    if c.raddr and c.status == psutil.CONN_ESTABLISHED})
    assert ports, f"process {pid} has no TCP connection to cut"
    listed = ", ".join(map(str, ports))
    rules = (f"table inet {TABLE} {{\n chain out {{ type filter hook output priority 0; policy accept;\n"
             f"  tcp sport {{ {listed} }} drop\n  tcp dport {{ {listed} }} drop\n }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield ports
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


def test_a_node_cut_off_from_the_bus_never_runs_a_job_beside_its_restored_copy(small_cluster: Cluster) -> None:
    c = small_cluster
    job = c.json("run", "--name", "cut", "--node", "n1", "--checkpoint-every", "1s", "--", *ARGV)
    c.wait_lines("cut", 10)
    wait_until(lambda: c.json("status", "cut")["last_checkpoint"], 30, "a periodic checkpoint")
    old = workload_pid(c, "n1", job["id"])
    copies = CopyCounter(ARGV)
    copies.start()
    try:
        with cut_off(c.service_pid("checkpointer@n1")):
            moved = wait_until(lambda: (s := c.json("status", "cut"))["node"] == "n2" and s["state"] == "running"
                               and s, 60, "the job to be restored on n2")
            # the window in which both copies ran before: the cut node cannot fence what it cannot read
            c.wait_lines("cut", c.logs("cut").count("\n") + 20)
            assert proc_state(old) == "T", f"the cut-off copy {old} is {proc_state(old)}, not held"
        # back on the bus, the node reads that the job moved on and ends its stale copy
        wait_until(lambda: not psutil.pid_exists(old) or proc_state(old) == "Z", 30, "the stale copy to be killed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + c.log_tails("health", "scheduler", "checkpointer-n1", "checkpointer-n2",
                                                      lines=40)) from None
    finally:
        copies.stop()
    assert copies.most == 1, f"{copies.most} copies ran at once: {copies.first_many}\n" + c.log_tails(
        "health", "scheduler", "checkpointer-n1", "checkpointer-n2", lines=40)
    assert moved["restarts"] >= 1
    status = c.json("status", "cut")
    assert status["node"] == "n2" and status["state"] == "running", status
    # its beats land again (after the cut, TCP's retransmissions may take a few seconds to catch up)
    wait_until(lambda: [n["state"] for n in c.json("nodes")] == ["ready", "ready"], 30, "n1 to be ready again")


def test_a_checkpointer_killed_while_it_holds_a_job_leaves_nothing_stopped(small_cluster: Cluster) -> None:
    """Held, then its checkpointer SIGKILLed and started again by `ferry up` (with connections the
    cut does not reach): the new one finds the hold in the job's folder and, once its beats land,
    either resumes the copy or, if the job was restored elsewhere meanwhile, kills it. Either
    way exactly one copy runs in the end, none stays stopped, and never two at once."""
    c = small_cluster
    job = c.json("run", "--name", "cut-kill", "--node", "n1", "--checkpoint-every", "1s", "--", *ARGV)
    c.wait_lines("cut-kill", 10)
    wait_until(lambda: c.json("status", "cut-kill")["last_checkpoint"], 30, "a periodic checkpoint")
    old = workload_pid(c, "n1", job["id"])
    copies = CopyCounter(ARGV)
    copies.start()
    try:
        with cut_off(c.service_pid("checkpointer@n1")):
            wait_until(lambda: proc_state(old) == "T", 30, "the cut-off copy to be held")
            kill_service(c, "checkpointer@n1")

        def one_running() -> bool:
            s = c.json("status", "cut-kill")
            return s["state"] == "running" and len(copies.running()) == 1
        wait_until(one_running, 60, "exactly one copy to run")
        n = c.logs("cut-kill").count("\n")
        c.wait_lines("cut-kill", n + 20)  # it makes progress: not left stopped
        stopped = [p.pid for p in psutil.process_iter(["cmdline", "status"])
                   if p.info["cmdline"] == ARGV and p.info["status"] == psutil.STATUS_STOPPED]
        assert stopped == [], f"copies left stopped: {stopped}"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + c.log_tails("health", "scheduler", "checkpointer-n1", "checkpointer-n2",
                                                      lines=40)) from None
    finally:
        copies.stop()
    assert copies.most == 1, f"{copies.most} copies ran at once: {copies.first_many}"


def test_a_paused_checkpointer_never_lets_a_job_run_beside_its_restored_copy(small_cluster: Cluster) -> None:
    """SIGSTOP to n1's checkpointer: no beat, no lease, health declares n1 lost and the job is restored
    on n2. The old copy's monitor holds it when the lease runs out; SIGCONT, and the checkpointer
    reads that the job moved on and kills the copy."""
    c = small_cluster
    job = c.json("run", "--name", "paused", "--node", "n1", "--checkpoint-every", "1s", "--", *ARGV)
    c.wait_lines("paused", 10)
    wait_until(lambda: c.json("status", "paused")["last_checkpoint"], 30, "a periodic checkpoint")
    old = workload_pid(c, "n1", job["id"])
    copies = CopyCounter(ARGV)
    copies.start()
    checkpointer = c.service_pid("checkpointer@n1")
    try:
        os.kill(checkpointer, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(old) == "T", 30, "the old copy to be held by its monitor")
            moved = wait_until(lambda: (s := c.json("status", "paused"))["node"] == "n2" and s["state"] == "running"
                               and s, 60, "the job to be restored on n2")
            c.wait_lines("paused", c.logs("paused").count("\n") + 20)
            assert proc_state(old) == "T", f"the copy {old} on the silent node is {proc_state(old)}, not held"
        finally:
            os.kill(checkpointer, signal.SIGCONT)
        wait_until(lambda: not psutil.pid_exists(old) or proc_state(old) == "Z", 30, "the stale copy to be killed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + c.log_tails("health", "scheduler", "checkpointer-n1", "checkpointer-n2",
                                                      lines=40)) from None
    finally:
        copies.stop()
    assert copies.most == 1, f"{copies.most} copies ran at once: {copies.first_many}"
    assert moved["restarts"] >= 1
    wait_until(lambda: [n["state"] for n in c.json("nodes")] == ["ready", "ready"], 30, "n1 to be ready again")
