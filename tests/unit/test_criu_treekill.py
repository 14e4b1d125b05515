"""`kill_tree` returns only once every process of the tree has exited, not when the signal is sent."""

import asyncio
import os
import signal
import subprocess
import sys
import time

from ferry.criu.linux import is_gone, process_tree
from ferry.criu.treekill import kill_tree

# Each child holds 256 MiB it has touched: the kernel takes tens of milliseconds to tear that down,
# so a caller that only sent SIGKILL would still see the processes there.
CHILD = ("b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
         "print(flush=True)\nimport time; time.sleep(60)")
PARENT = f"""
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", {CHILD!r}], stdout=subprocess.PIPE) for _ in range(2)]
for k in kids: k.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


def test_a_stopped_tree_has_exited_when_kill_tree_returns() -> None:
    root = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE)
    try:
        assert root.stdout is not None and root.stdout.readline() == b"ready\n"
        pids = process_tree(root.pid)
        assert len(pids) == 3
        for p in pids:  # as a final checkpoint leaves it (--leave-stopped)
            os.kill(p, signal.SIGSTOP)
        t0 = time.monotonic()
        assert asyncio.run(kill_tree(root.pid)) == []
        assert time.monotonic() - t0 < 10
        assert all(is_gone(p) for p in pids), [(p, is_gone(p)) for p in pids]
    finally:
        root.kill()
        root.wait()


def test_a_tree_already_gone_is_no_error() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid names nothing
    assert asyncio.run(kill_tree(proc.pid)) == []


def test_a_zombie_counts_as_ended() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while not is_gone(proc.pid):  # exited, not reaped: a zombie of this process
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert asyncio.run(kill_tree(proc.pid, timeout_s=5)) == []
    finally:
        proc.wait()
