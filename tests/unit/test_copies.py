"""The copy count "a job never runs twice" is checked against (ferry.sim.copies), on real processes."""

import os
import signal
import subprocess
import time
import uuid

from ferry.sim.copies import CopyCounter, copies_of


def test_copies_are_counted_by_exact_command_line_and_a_stopped_one_does_not_run() -> None:
    argv = ["sleep", f"60.{uuid.uuid4().int % 10**6}"]  # a command line no other process has
    procs = [subprocess.Popen(argv) for _ in range(2)]
    other = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.1)
        found = copies_of(argv)
        assert sorted(c.pid for c in found) == sorted(p.pid for p in procs)
        assert all(c.running and c.ppid == os.getpid() and not c.dying for c in found)
        assert copies_of(argv, not_children_of=os.getpid()) == []  # a reference run of our own
        counter = CopyCounter(argv, interval_s=0.02)
        counter.start()
        time.sleep(0.1)
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert [c.pid for c in counter.running()] == [procs[0].pid]
        counter.stop()
        assert counter.most == 2 and len(counter.first_many) == 3  # when, then the two copies
        assert {c.state for c in copies_of(argv)} == {"S", "T"}
    finally:
        for p in [*procs, other]:
            p.kill()
            p.wait()
    assert copies_of(argv) == []


def test_a_copys_child_before_its_exec_is_part_of_that_copy() -> None:
    """A shell's fork has the shell's command line until it execs: one copy, not two."""
    argv = ["python3", "-c", "import os, time; os.fork() or time.sleep(60); time.sleep(60)", str(uuid.uuid4())]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 5
        while len([p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == argv]) < 2:
            assert time.monotonic() < deadline, "the fork did not show"
            time.sleep(0.02)
        assert [c.pid for c in copies_of(argv)] == [proc.pid]
    finally:
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == argv]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()


def _cmdline(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")[:-1]
    except OSError:
        return []
