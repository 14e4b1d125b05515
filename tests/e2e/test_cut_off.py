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
from typing import Any

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


LOGS = ("health", "scheduler", "checkpointer-n1", "checkpointer-n2")


def start_on_n1(c: Cluster, name: str) -> int:
    """The counter on n1 with a periodic checkpoint to be restored from; its workload's pid."""
    job = c.json("run", "--name", name, "--node", "n1", "--checkpoint-every", "1s", "--", *ARGV)
    c.wait_lines(name, 10)
    wait_until(lambda: c.json("status", name)["last_checkpoint"], 30, "a periodic checkpoint")
    return workload_pid(c, "n1", job["id"])


@contextlib.contextmanager
def one_copy_at_most(c: Cluster) -> Iterator[CopyCounter]:
    """Counts the counter's running copies while inside; fails if two ever ran at once, and puts
    the services' logs under any failure inside."""
    copies = CopyCounter(ARGV)
    copies.start()
    try:
        yield copies
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + c.log_tails(*LOGS, lines=40)) from None
    finally:
        copies.stop()
    assert copies.most == 1, f"{copies.most} copies ran at once: {copies.first_many}\n" + c.log_tails(*LOGS, lines=40)


def restored_on_n2(c: Cluster, name: str) -> dict[str, Any]:
    """Once the job runs on n2 (health declared n1 lost), after 20 more lines of it: the window in
    which both copies ran before, the silent node unable to fence what it cannot read."""
    moved: dict[str, Any] = wait_until(lambda: (s := c.json("status", name))["node"] == "n2"
                                       and s["state"] == "running" and s, 60, "the job to be restored on n2")
    c.wait_lines(name, c.logs(name).count("\n") + 20)
    assert moved["restarts"] >= 1
    return moved


def killed(pid: int) -> None:
    wait_until(lambda: not psutil.pid_exists(pid) or proc_state(pid) == "Z", 30, "the stale copy to be killed")


def test_a_node_cut_off_from_the_bus_never_runs_a_job_beside_its_restored_copy(small_cluster: Cluster) -> None:
    c = small_cluster
    old = start_on_n1(c, "cut")
    with one_copy_at_most(c):
        with cut_off(c.service_pid("checkpointer@n1")):
            restored_on_n2(c, "cut")
            assert proc_state(old) == "T", f"the cut-off copy {old} is {proc_state(old)}, not held"
        killed(old)  # back on the bus, the node reads that the job moved on and ends its stale copy
    status = c.json("status", "cut")
    # it runs on n2; its periodic checkpoint (each second) leaves it running while it is taken
    assert status["node"] == "n2" and status["state"] in ("running", "checkpointing"), status
    # its beats land again (after the cut, TCP's retransmissions may take a few seconds to catch up)
    wait_until(lambda: [n["state"] for n in c.json("nodes")] == ["ready", "ready"], 30, "n1 to be ready again")


def test_a_checkpointer_killed_while_its_node_holds_a_job_leaves_nothing_stopped(small_cluster: Cluster) -> None:
    """Held, then its checkpointer SIGKILLed and started again by `ferry up` (with connections the
    cut does not reach): once the new one's beats land it grants the lease again, after its fence.
    Either the monitor resumes the copy or, if the job was restored elsewhere meanwhile, the fence
    kills it. Either way exactly one copy runs in the end, none stays stopped, and never two at once."""
    c = small_cluster
    old = start_on_n1(c, "cut-kill")
    with one_copy_at_most(c) as copies:
        with cut_off(c.service_pid("checkpointer@n1")):
            wait_until(lambda: proc_state(old) == "T", 30, "the cut-off copy to be held")
            kill_service(c, "checkpointer@n1")

        def one_running() -> bool:
            return c.json("status", "cut-kill")["state"] == "running" and len(copies.running()) == 1
        wait_until(one_running, 60, "exactly one copy to run")
        c.wait_lines("cut-kill", c.logs("cut-kill").count("\n") + 20)  # it makes progress: not left stopped
        # the held copy stays held until n1's new checkpointer is up (on a loaded machine its start
        # may take longer than the restore on n2): then its fence ends it, or its monitor resumes it
        log = c.data_dir / "logs" / "checkpointer-n1.log"
        wait_until(lambda: log.read_text(errors="replace").count("checkpointer n1 ready") >= 2, 60,
                   "n1's restarted checkpointer to be ready")

        def stopped() -> list[int]:
            return [p.pid for p in psutil.process_iter(["cmdline", "status"])
                    if p.info["cmdline"] == ARGV and p.info["status"] == psutil.STATUS_STOPPED]
        wait_until(lambda: not stopped(), 30, "no copy to be left stopped",
                   explain=lambda: f"copies left stopped: {stopped()}")


def test_a_paused_checkpointer_never_lets_a_job_run_beside_its_restored_copy(small_cluster: Cluster) -> None:
    """SIGSTOP to n1's checkpointer: no beat, no lease, health declares n1 lost and the job is restored
    on n2. The old copy's monitor holds it when the lease runs out; SIGCONT, and the checkpointer
    reads that the job moved on and kills the copy."""
    c = small_cluster
    old = start_on_n1(c, "paused")
    checkpointer = c.service_pid("checkpointer@n1")
    with one_copy_at_most(c):
        os.kill(checkpointer, signal.SIGSTOP)
        try:
            wait_until(lambda: proc_state(old) == "T", 30, "the old copy to be held by its monitor")
            restored_on_n2(c, "paused")
            assert proc_state(old) == "T", f"the copy {old} on the silent node is {proc_state(old)}, not held"
        finally:
            os.kill(checkpointer, signal.SIGCONT)
        killed(old)
    wait_until(lambda: [n["state"] for n in c.json("nodes")] == ["ready", "ready"], 30, "n1 to be ready again")
