"""How many copies of a job run at once, sampled from /proc: what "a job never runs twice" is
checked against (the end-to-end tests, ``bench/chaos.py``).

A copy is a process whose command line is exactly the job's, and whose parent's is not (a
shell's child has the shell's command line between its fork and its exec: it is part of that
copy). It runs unless it is stopped or traced (held, or frozen by CRIU), a zombie, or has SIGKILL
pending: a stopped process killed on a loaded machine shows "running" for a while (tens of ms
measured here, more under load) until the kernel gets to tear it down, and a copy the fence is
killing is not a second copy running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SIGKILL_BIT = 1 << 8  # in /proc/PID/status SigPnd and ShdPnd


@dataclass(frozen=True)
class Copy:
    pid: int
    ppid: int
    state: str  # /proc/PID/stat's letter
    started: int  # clock ticks after boot
    dying: bool  # SIGKILL pending

    @property
    def running(self) -> bool:
        return self.state not in ("T", "t", "Z", "X") and not self.dying

    def describe(self) -> str:
        return f"pid {self.pid} ppid {self.ppid} state {self.state} started {self.started}"


def _dying(proc: Path) -> bool:
    try:
        fields = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
        return bool((int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)) & SIGKILL_BIT)
    except (OSError, KeyError, ValueError):
        return True  # gone


def copies_of(argv: Sequence[str], not_children_of: int | None = None) -> list[Copy]:
    """The processes whose command line is exactly `argv` now, but for their children with the same
    one; `not_children_of`: and for that process's own children (a reference run, say)."""
    want = "\0".join(argv).encode() + b"\0"
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "cmdline").read_bytes() != want:
                continue
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == not_children_of:
            continue
        found.append(Copy(int(d.name), ppid, state, int(fields[19]), _dying(d)))
    pids = {c.pid for c in found}
    return [c for c in found if c.ppid not in pids]  # a copy's own child (a fork before its exec) is part of it


class CopyCounter(threading.Thread):
    """The most running copies of `argv` seen at once, sampled every `interval_s` until ``stop``;
    ``first_many`` describes the copies of the first sample with more than one."""

    def __init__(self, argv: Sequence[str], interval_s: float = 0.05, not_children_of: int | None = None,
                 t0: float | None = None) -> None:
        super().__init__(daemon=True)
        self.argv, self.interval_s, self.not_children_of = list(argv), interval_s, not_children_of
        self.most, self.done = 0, threading.Event()
        self.first_many: list[str] = []
        self.t0 = time.monotonic() if t0 is None else t0  # the clock `first_many` says its time on

    def running(self) -> list[Copy]:
        return [c for c in copies_of(self.argv, self.not_children_of) if c.running]

    def run(self) -> None:
        while not self.done.wait(self.interval_s):
            found = self.running()
            if len(found) > 1 and not self.first_many:
                self.first_many = [f"at {time.monotonic() - self.t0:.1f}s", *(c.describe() for c in found)]
            self.most = max(self.most, len(found))

    def stop(self) -> None:
        self.done.set()
        self.join()
