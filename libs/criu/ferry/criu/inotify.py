"""inotify(7) from Python: one instance and its watches (``Inotify``), and its events as a pure
parse of what a read returns (``parse``). The standard library has no binding; libc's three calls
are reached through ctypes.

    ino = Inotify.open()                    # non-blocking, closed on exec; OSError if it cannot be made
    wd = ino.add(path, IN_CREATE | IN_DELETE)
    for event in ino.read():                # what has happened since the last read; [] when nothing
        ...
    ino.close()

A watch the kernel drops (its folder deleted, or ``remove``) ends with an ``IN_IGNORED`` event; a
queue that overflowed gives one event with ``wd`` -1 and ``IN_Q_OVERFLOW``: whatever it watched may
have changed unseen.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000

_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)
_READ = 1 << 16


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    name: str = ""  # the entry's name, for an event in a watched folder


def parse(data: bytes) -> list[Event]:
    """The events in ``data``, as read from an inotify descriptor (a partial last one is left out)."""
    events = []
    pos = 0
    while pos + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
        start = pos + _EVENT.size
        if start + length > len(data):
            break
        name = data[start:start + length].split(b"\0", 1)[0]
        events.append(Event(int(wd), int(mask), os.fsdecode(name)))
        pos = start + length
    return events


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _error(what: str, path: Path | None = None) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}", None if path is None else str(path))


class Inotify:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls) -> Inotify:
        fd = int(_libc().inotify_init1(ctypes.c_int(os.O_NONBLOCK | os.O_CLOEXEC)))
        if fd < 0:
            raise _error("inotify_init1")
        return cls(fd)

    def fileno(self) -> int:
        return self.fd

    def add(self, path: Path, mask: int) -> int:
        """Watches ``path`` for ``mask``; its watch descriptor (the same one again for a path
        already watched, its mask replaced)."""
        wd = int(_libc().inotify_add_watch(ctypes.c_int(self.fd), os.fsencode(path), ctypes.c_uint32(mask)))
        if wd < 0:
            raise _error("inotify_add_watch", path)
        return wd

    def remove(self, wd: int) -> None:
        """Ends watch ``wd``; one the kernel ended already (its folder gone) is no error."""
        failed = int(_libc().inotify_rm_watch(ctypes.c_int(self.fd), ctypes.c_int(wd))) < 0
        if failed and ctypes.get_errno() != errno.EINVAL:
            raise _error("inotify_rm_watch")

    def read(self) -> list[Event]:
        """Every event queued now; [] when there is none (it never blocks)."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return events
            if not data:
                return events
            events += parse(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
