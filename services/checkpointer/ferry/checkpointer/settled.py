"""Which job folders on a node have settled: their job ended, its exit was reported, and nothing
in the folder changed since. The checkpointer looks for exits every 2 s and for running jobs on
every heartbeat; reading every folder's records each time made an idle node's CPU grow with the
number of jobs it had ever run (13% of a core at 418 finished jobs). A settled folder is skipped
until an entry in it is made, deleted or renamed: a restore of the job there, or a new exit, adds
or replaces files in it (records are written by rename).

Those changes are watched with inotify (``ferry.criu.inotify``): a watch on the jobs folder keeps
the list of job folders, and one on each settled folder ends its settling. A look then costs what
changed since the last, not a ``stat`` of every folder (which still made idle CPU grow with
history: 1.9 ms per look at 500 folders, 1.5 looks a second). A folder that cannot be watched
(``fs.inotify.max_user_watches``) is simply never taken as settled, nothing settles while no
inotify instance can be made (``max_user_instances``; tried again each ``RETRY_S``), and a queue
that overflowed unsettles every folder: the scans may read more, never less.

A folder changed within the last ``FRESH_S`` is not taken as settled: a change after the caller
looked at its records and before the watch began would go unseen (its modification time tells,
though file systems stamp times with a coarse clock)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ferry.criu.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Event,
    Inotify,
)

log = logging.getLogger(__name__)

FRESH_S = 2.0
RETRY_S = 60.0
_ENTRIES = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO  # what changes a folder's list of entries
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_ADDED = IN_CREATE | IN_MOVED_TO
_REMOVED = IN_DELETE | IN_MOVED_FROM


class SettledDirs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._ino: Inotify | None = None
        self._retry_at = 0.0  # when to try again to make the inotify instance, after a failure
        self._root_wd: int | None = None
        self._names: set[str] | None = None  # the job folders, kept by the root's watch (None: listed on each look)
        self._settled: dict[str, int] = {}  # folder name -> the watch on it
        self._by_wd: dict[int, str] = {}

    def unsettled(self) -> Iterator[Path]:
        """The job folders that may have changed since they settled (all, at first), by name."""
        names = self._current()
        if names is None:
            return
        for name in sorted(names - self._settled.keys()):
            yield self.root / name

    def settle(self, folder: Path) -> None:
        """``folder``'s job has ended and been reported: skip it until it changes."""
        name = folder.name
        ino = self._inotify()
        if ino is None or folder.parent != self.root or name in self._settled:
            return
        try:
            wd = ino.add(folder, _ENTRIES | _GONE | IN_ONLYDIR)  # first the watch, then the look at its age
        except OSError:
            return  # gone, or past inotify's limits: looked at on every scan
        if wd in self._by_wd:
            return  # the same folder, watched under another name already
        try:
            mtime = folder.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = time.time_ns()
        if time.time_ns() - mtime < FRESH_S * 1e9:
            with contextlib.suppress(OSError):
                ino.remove(wd)
            return
        self._settled[name] = wd
        self._by_wd[wd] = name

    def __len__(self) -> int:
        return len(self._settled)

    def close(self) -> None:
        if self._ino is not None:
            self._ino.close()
            self._ino = None
        self._root_wd, self._names = None, None
        self._settled.clear()
        self._by_wd.clear()

    # ---- keeping up ----------------------------------------------------------------------------

    def _inotify(self) -> Inotify | None:
        if self._ino is None and time.monotonic() >= self._retry_at:
            try:
                self._ino = Inotify.open()
            except OSError as exc:  # none left (fs.inotify.max_user_instances): nothing settles meanwhile
                log.warning("no inotify instance for the job folders (%s): every look reads every folder; "
                            "trying again in %.0f s", exc, RETRY_S)
                self._retry_at = time.monotonic() + RETRY_S
        return self._ino

    def _current(self) -> set[str] | None:
        """The job folders now (None when the jobs folder is not there), after the changes the
        watches saw since the last look."""
        ino = self._inotify()
        if ino is not None:
            if self._root_wd is None:
                try:
                    self._root_wd = ino.add(self.root, _ENTRIES | _GONE | IN_ONLYDIR)
                except OSError:
                    self._root_wd = None  # not there yet (or past the limits): listed on each look
                else:
                    self._names = self._list()  # after the watch began: nothing made meanwhile is missed
            for event in ino.read():
                self._apply(event)
        if self._names is not None:
            return self._names
        return self._list()

    def _list(self) -> set[str] | None:
        try:
            return {e.name for e in os.scandir(self.root)}
        except FileNotFoundError:
            return None

    def _apply(self, event: Event) -> None:
        if event.wd == -1 and event.mask & IN_Q_OVERFLOW:  # changes went unseen: look at everything again
            self._unsettle_all()
            self._names = self._list() if self._root_wd is not None else None
        elif event.wd == self._root_wd:
            if event.mask & _GONE:  # the jobs folder itself went: start again when it is back
                self._root_wd, self._names = None, None
                self._unsettle_all()
            elif self._names is not None and event.mask & _ADDED:
                self._names.add(event.name)
            elif self._names is not None and event.mask & _REMOVED:
                self._names.discard(event.name)
                self._unsettle(event.name)
        elif (folder := self._by_wd.get(event.wd)) is not None:
            self._unsettle(folder)  # something in it changed, or it went

    def _unsettle_all(self) -> None:
        for name in list(self._settled):
            self._unsettle(name)

    def _unsettle(self, name: str) -> None:
        wd = self._settled.pop(name, None)
        if wd is None:
            return
        self._by_wd.pop(wd, None)
        if self._ino is not None:
            with contextlib.suppress(OSError):
                self._ino.remove(wd)  # one the kernel ended already is no error
