"""What a moved process's own output says: memhog under a wrapper that stamps a heartbeat every
10 ms and each round it prints; from those, the downtime (the heartbeat gap around the move), the
longest gaps and the rounds per second (bench/migrate.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchkit import BenchError, read_bytes

ROOT = Path(__file__).resolve().parents[2]
MEMHOG = ROOT / "examples" / "memhog.py"
PY = sys.executable
FERRY = str(Path(sys.executable).parent / "ferry")
MODES = ("naive", "live", "ferry")
GOAL = 0.10
ROUNDS_BEFORE = 6  # rounds a process runs before it is moved
ROUNDS_AFTER = 4  # rounds it runs on the target once all its memory is there
WRAPPER = """\
import os, runpy, sys, threading, time
def beat():
    while True:
        os.write(2, b"hb %d\\n" % time.time_ns())
        time.sleep(0.01)
class Out:
    def __init__(self, f):
        self.f = f
    def write(self, s):
        n = self.f.write(s)
        if "\\n" in s:
            os.write(2, b"r %d\\n" % time.time_ns())
        return n
    def __getattr__(self, name):
        return getattr(self.f, name)
sys.stdout = Out(sys.stdout)
threading.Thread(target=beat, daemon=True).start()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""



# ---- reading a workload's output ---------------------------------------------------------------


def round_lines(stdout: Path) -> list[bytes]:
    return [line for line in read_bytes(stdout).splitlines(keepends=True)[1:] if line.endswith(b"\n")]


def stamps(stderr: Path) -> tuple[list[float], list[float]]:
    """(heartbeat times, round times), wall clock in seconds, from the wrapper's stderr lines."""
    return stamps_of(read_bytes(stderr))


def stamps_of(data: bytes) -> tuple[list[float], list[float]]:
    beats: list[float] = []
    rounds: list[float] = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            continue  # a line being written
        kind, _, value = line.rstrip(b"\n").partition(b" ")
        if not value.isdigit():
            continue
        if kind == b"hb":
            beats.append(int(value) / 1e9)
        elif kind == b"r":
            rounds.append(int(value) / 1e9)
    return beats, rounds[1:]  # the first "r" is memhog's "ready" line


def gap_around(beats: list[float], moment: float) -> float:
    """Seconds between the last heartbeat before ``moment`` and the first one after it."""
    before = [t for t in beats if t <= moment]
    after = [t for t in beats if t > moment]
    if not before or not after:
        raise BenchError("no heartbeat on one side of the move")
    return after[0] - before[-1]


def longest_gap(beats: list[float], start: float, end: float) -> float | None:
    """The longest time between two consecutive heartbeats, both in [start, end]."""
    inside = [t for t in beats if start <= t <= end]
    return max((b - a for a, b in itertools.pairwise(inside)), default=None)


def rate(rounds: list[float], start: float, end: float) -> tuple[float | None, int]:
    """Rounds per second from consecutive rounds both printed in [start, end]; and how many gaps."""
    inside = [t for t in rounds if start <= t <= end]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    return (1 / statistics.mean(gaps) if gaps else None), len(gaps)


async def await_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


def mem_available() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0
