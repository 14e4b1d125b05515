"""Which jobs' monitors have ended: a pidfd per running job's monitor, read by the event loop.

A job's monitor writes the job's exit record and then ends; its pidfd becomes readable then. The
checkpointer reports that job's exit at once, instead of finding it on a look at every job folder
four times a second (a tenth of its CPU in a burst of short jobs, and up to 250 ms late). A slow
sweep of every folder stays, for what a pidfd cannot tell: a monitor that ended before it was
followed (``follow`` says so), one this service did not start (a restore, or any job after a
restart of the service).
"""

from __future__ import annotations

import asyncio
import contextlib
import os

__all__ = ["MonitorWatch"]


class MonitorWatch:
    def __init__(self) -> None:
        self._followed: dict[str, tuple[int, int]] = {}  # job folder name -> (monitor pid, pidfd)
        self._ended: set[str] = set()
        self.woken = asyncio.Event()  # set when a followed monitor ends

    def follows(self, name: str, pid: int | None = None) -> bool:
        """Whether job ``name``'s monitor (``pid``, if given) is followed."""
        found = self._followed.get(name)
        return found is not None and (pid is None or found[0] == pid)

    def follow(self, name: str, pid: int) -> bool:
        """Watches job ``name``'s monitor ``pid``; False when it has ended already (or is not
        ours to watch): the caller looks at the folder itself."""
        if self.follows(name, pid):
            return True
        self.forget(name)
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already (ESRCH), or no pidfds here: the sweep finds its exit
            return False
        self._followed[name] = (pid, fd)
        asyncio.get_running_loop().add_reader(fd, self._ended_one, name)
        return True

    def _ended_one(self, name: str) -> None:
        self.forget(name)
        self.ended(name)

    def ended(self, name: str) -> None:
        """Job ``name``'s monitor has ended (a caller that saw it end before it was followed)."""
        self._ended.add(name)
        self.woken.set()

    def take(self) -> set[str]:
        """The folders whose monitors ended since the last call."""
        ended, self._ended = self._ended, set()
        self.woken.clear()
        return ended

    def forget(self, name: str) -> None:
        found = self._followed.pop(name, None)
        if found is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(found[1])
            os.close(found[1])

    def close(self) -> None:
        for name in list(self._followed):
            self.forget(name)

    def __len__(self) -> int:
        return len(self._followed)
