"""When did a workload last, or first, write to its output files: progress observed from outside.

A live move's downtime runs from the moment the workload stops making progress on the source to the
moment it makes progress on the target. Ferry sees a workload's progress only through its output
files, so both ends are taken from them, and both err on the long side:

- the source's last write is the file's modification time once the tree is frozen (the kernel
  stamps it at or before the write, never after);
- the target's first write is the wake-up of a thread blocked on inotify ``IN_MODIFY`` for the
  target's files (at or after the write); where inotify is missing the thread polls the sizes
  every millisecond instead.

Times are wall-clock (``time.time()``), the clock file timestamps use.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ferry.criu.inotify import IN_MODIFY, Inotify

__all__ = ["FirstWrite", "last_write"]

_POLL_S = 0.001


def last_write(paths: Sequence[Path]) -> float | None:
    """The latest modification time of ``paths`` (wall clock); None when none exists."""
    times = []
    for path in paths:
        try:
            times.append(path.stat().st_mtime_ns / 1e9)
        except FileNotFoundError:
            continue
    return max(times) if times else None


class FirstWrite:
    """Watches files from ``start()`` on and records the wall-clock time of the first write to any.

    Use as a context manager, or call ``start()`` and ``stop()``. ``at`` is None until a write is
    seen; ``wait(timeout_s)`` blocks a thread until then.
    """

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p) for p in paths]
        self.at: float | None = None
        self.method = "inotify"
        self._seen = threading.Event()
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None
        self._ino: Inotify | None = None

    def __enter__(self) -> FirstWrite:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("FirstWrite already started")
        self._ino = self._inotify()
        if self._ino is None:
            self.method = "poll"
            sizes = [self._size(p) for p in self.paths]
            self._thread = threading.Thread(target=self._poll_sizes, args=(sizes,), name="ferry-first-write")
        else:
            self._thread = threading.Thread(target=self._read_events, name="ferry-first-write")
        self._thread.daemon = True
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join()
        self._thread = None
        for fd in (self._stop_r, self._stop_w):
            if fd >= 0:
                os.close(fd)
        self._stop_r = self._stop_w = -1
        if self._ino is not None:
            self._ino.close()
            self._ino = None

    def wait(self, timeout_s: float) -> float | None:
        self._seen.wait(timeout_s)
        return self.at

    # -- the watching thread ---------------------------------------------------------------------

    def _inotify(self) -> Inotify | None:
        try:
            ino = Inotify.open()
        except OSError:
            return None
        try:
            for path in self.paths:
                ino.add(path, IN_MODIFY)
        except OSError:
            ino.close()
            return None
        return ino

    def _record(self) -> None:
        if self.at is None:
            self.at = time.time()
            self._seen.set()

    def _read_events(self) -> None:
        assert self._ino is not None
        ino = self._ino
        poller = select.poll()
        poller.register(ino.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if ino.fileno() in ready:
                now = time.time()
                if self.at is None and any(e.mask & IN_MODIFY for e in ino.read()):
                    self.at = now
                    self._seen.set()
            if self._stop_r in ready:
                return

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return -1

    def _poll_sizes(self, sizes: list[int]) -> None:
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        while not poller.poll(_POLL_S * 1000):
            if self.at is None and [self._size(p) for p in self.paths] != sizes:
                self._record()

