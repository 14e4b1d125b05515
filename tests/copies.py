"""How many copies of a job run at once, sampled from /proc: what "a job never runs twice" is
checked against in the end-to-end tests."""

import threading
import time
from collections.abc import Sequence

import psutil

NOT_RUNNING = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE)
SIGKILL_BIT = 1 << 8


def dying(pid: int) -> bool:
    """SIGKILL is pending for `pid`: it runs no more of its own code. A stopped process killed on a
    loaded machine shows "running" for a while (tens of ms measured here, more under load) until
    the kernel gets to tear it down; a copy the fence is killing is not a second copy running."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return bool((int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)) & SIGKILL_BIT)
    except (OSError, KeyError, ValueError):
        return True  # gone


class Copies(threading.Thread):
    """The most running (not stopped) processes with command line `argv` seen at once, sampled
    every 0.05 s until `done` is set."""

    def __init__(self, argv: Sequence[str]) -> None:
        super().__init__(daemon=True)
        self.argv = list(argv)
        self.most, self.done = 0, threading.Event()
        self.seen: list[str] = []  # the copies at the first sample with more than one: what a failure says

    def running(self) -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline", "status", "ppid", "create_time"])
                if p.info["cmdline"] == self.argv and p.info["status"] not in NOT_RUNNING and not dying(p.pid)]

    def run(self) -> None:
        while not self.done.wait(0.05):
            found = self.running()
            if len(found) > 1 and not self.seen:
                self.seen = [f"pid {p.pid} ppid {p.info['ppid']} {p.info['status']} started "
                             f"{p.info['create_time']:.2f} at {time.time():.2f}" for p in found]
            self.most = max(self.most, len(found))

    def stop(self) -> None:
        self.done.set()
        self.join()
