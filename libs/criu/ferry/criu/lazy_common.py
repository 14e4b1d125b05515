"""What both halves of a CRIU post-copy move share: limits, CRIU child processes, process trees.

See ``ferry.criu.lazy`` for how a live move works and what CRIU does at each step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO

from ferry.criu.errors import CriuError
from ferry.criu.jobdir import JobDir
from ferry.criu.linux import process_tree
from ferry.criu.logs import failure_summary
from ferry.criu.runner import DUMP_LOG
from ferry.criu.sizes import SIZES_FILE

log = logging.getLogger("ferry.criu.lazy")

PIPE_MAX_BYTES = 16 << 20
"""fs.pipe-max-size that CRIU's post-copy needs (see DESIGN: below it the page server reads short)."""
LAZY_LOG = "lazy-pages.log"
LAZY_SOCKET = "lazy-pages.socket"
STAYS_BEHIND = frozenset({DUMP_LOG, "stats-dump", ".ferry-action.sh", SIZES_FILE})
"""Files of the source's images dir that are not copied to the target."""
PAGE_SIZE = 4096

_PIPE_MAX = Path("/proc/sys/fs/pipe-max-size")
_PIPE_SOFT = Path("/proc/sys/fs/pipe-user-pages-soft")
_CAP_SYS_RESOURCE = 24
_CAP_SYS_ADMIN = 21
PS_IOV = struct.Struct("=IIQQ")  # struct page_server_iov: cmd, nr_pages, vaddr, dst_id
PS_UNKNOWN_CMD = 0xFFFF
_SEIZED = re.compile(r"\((\d+\.\d+)\) Seized task ")
_SERVING = re.compile(r"\((\d+\.\d+)\) Starting page server ")
_TRANSFERRED = re.compile(r"UFFD transferred pages: \((\d+)/(\d+)\)")
END_TIMEOUT_S = 30.0

CopyImages = Callable[[Path, Path], Awaitable[int]]


class LiveMoveFailed(CriuError):
    """A live move failed. ``source_running``: the source runs again (it was resumed or never
    stopped); ``target_killed``: a target had started and was killed."""

    def __init__(
        self,
        message: str,
        *,
        source_running: bool,
        target_killed: bool = False,
        log_excerpt: Sequence[str] = (),
        log_path: str | None = None,
    ) -> None:
        super().__init__(message, log_excerpt=log_excerpt, log_path=log_path)
        self.source_running = source_running
        self.target_killed = target_killed



# -- limits --------------------------------------------------------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _has_cap(bit: int) -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << bit))
    except (OSError, ValueError):
        pass
    return False


def ensure_pipe_limits(min_bytes: int = PIPE_MAX_BYTES) -> str | None:
    """Raise fs.pipe-max-size to ``min_bytes`` if lower; return what still stops post-copy, or None.

    Without CAP_SYS_RESOURCE (containers rarely grant it) CRIU cannot grow its page pipes past
    fs.pipe-max-size. Without CAP_SYS_ADMIN as well, fs.pipe-user-pages-soft caps all of a user's
    pipes together, which a large lazy dump exceeds.
    """
    current = _read_int(_PIPE_MAX)
    if current is None:
        return f"cannot read {_PIPE_MAX}: is /proc mounted?"
    privileged = _has_cap(_CAP_SYS_RESOURCE)
    if current < min_bytes and not privileged:
        try:
            _PIPE_MAX.write_text(f"{min_bytes}\n")
        except OSError as exc:
            return (
                f"fs.pipe-max-size is {current} and CRIU's post-copy needs {min_bytes}; raising it failed "
                f"({exc.strerror}): run `sysctl -w fs.pipe-max-size={min_bytes}` as root on the node"
            )
        current = _read_int(_PIPE_MAX) or 0
        if current < min_bytes:
            return f"fs.pipe-max-size stayed at {current} after writing {min_bytes}"
        log.info("raised fs.pipe-max-size to %d for CRIU post-copy", current)
    if not privileged and not _has_cap(_CAP_SYS_ADMIN):
        soft = _read_int(_PIPE_SOFT)
        if soft:
            return (
                f"without CAP_SYS_RESOURCE or CAP_SYS_ADMIN all pipes of a user hold at most "
                f"fs.pipe-user-pages-soft={soft} pages, too few for a lazy dump: run Ferry's node as root, "
                f"or `sysctl -w fs.pipe-user-pages-soft=0`"
            )
    return None


def _fs_type(path: str) -> str | None:
    """The type of the filesystem mounted at ``path`` or above it (from /proc/self/mounts)."""
    best, kind = "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mnt = fields[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        return None
    return kind


def kerndat_cache_problem(run_dir: str = "/run") -> str | None:
    """Why CRIU probes the kernel afresh at every start, or None when it can keep its probe.

    CRIU saves its kernel probe to /run/criu.kdat only when /run is a tmpfs, through a
    ``criu.kdat.tmp`` created with O_EXCL (criu/kerndat.c ``kerndat_save_cache``). Without it each
    CRIU start costs about 25 ms more here (mostly a test network namespace); a live move has two
    of them inside its downtime (the lazy-pages daemon and the restore).
    """
    kind = _fs_type(run_dir)
    if kind != "tmpfs":
        return f"{run_dir} is {kind or 'unknown'}, not tmpfs: CRIU cannot cache its kernel probe (criu.kdat)"
    if not os.path.exists(f"{run_dir}/criu.kdat") and os.path.exists(f"{run_dir}/criu.kdat.tmp"):
        return f"a stale {run_dir}/criu.kdat.tmp keeps CRIU from caching its kernel probe: remove it"
    return None


# -- helpers -------------------------------------------------------------------------------------


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (for a workload that is PID 1 of its namespace: all of it)."""
    return process_tree(root)


def signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def copy_images(src: Path, dst: Path) -> int:
    """Copy every image file of ``src`` (all but ``STAYS_BEHIND``) into ``dst``; return the bytes."""

    def copy() -> int:
        total = 0
        for path in sorted(src.iterdir()):
            if path.name in STAYS_BEHIND or not path.is_file():
                continue
            shutil.copyfile(path, dst / path.name)
            total += path.stat().st_size
        return total

    return await asyncio.to_thread(copy)


async def status_byte(fd: int, timeout_s: float) -> bool:
    """Wait for CRIU's ``--status-fd`` byte: True when it came, False at EOF (CRIU exited)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 1)
        except BlockingIOError:
            return
        if not done.done():
            done.set_result(bool(data))

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        async with asyncio.timeout(timeout_s):
            return await done
    finally:
        loop.remove_reader(fd)


_RECORD_EXIT = 'rc=0; "$@" || rc=$?; echo "$rc" > "$0.tmp" && mv -f "$0.tmp" "$0"; exit "$rc"'
"""sh -c script for ``exit_file``: $0 is the file, "$@" the command."""


class CriuProcess:
    """One CRIU process run by a live move: its own session, output in a file, a status pipe.

    With ``exit_file`` it runs under a shell that writes its exit status there when it ends, so that
    a successor of the service that started it (which cannot wait for it) learns how it ended."""

    def __init__(self, what: str, log_path: Path, exit_file: Path | None = None) -> None:
        self.what = what
        self.log_path = log_path
        self.exit_file = exit_file
        self.proc: asyncio.subprocess.Process | None = None
        self._out: IO[bytes] | None = None
        self._status = -1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def start(self, argv: list[str], timeout_s: float) -> bool:
        """Start it; wait for its status byte. False when it exited first."""
        if self.exit_file is not None:
            self.exit_file.unlink(missing_ok=True)
            argv = ["/bin/sh", "-c", _RECORD_EXIT, str(self.exit_file), *argv]
        r, w = os.pipe2(os.O_CLOEXEC)
        self._status = r
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close(), after the process ended)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                "--status-fd",
                str(w),
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=subprocess.STDOUT,
                pass_fds=[w],
                start_new_session=True,  # a Ctrl-C meant for the caller must not kill it midway
            )
        finally:
            os.close(w)
        try:
            return await status_byte(r, timeout_s)
        except TimeoutError:
            raise CriuError(f"{self.what} did not get ready within {timeout_s:.0f} s; see {self.log_path}") from None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self, timeout_s: float | None = None) -> int:
        assert self.proc is not None
        async with asyncio.timeout(timeout_s):
            return await self.proc.wait()

    async def kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # its session's group: the shell and CRIU
            os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()

    def failure(self) -> tuple[list[str], str]:
        output = ""
        if self._out is not None:
            self._out.seek(0)
            output = self._out.read().decode(errors="replace")
        return failure_summary(self.log_path, output)

    def close(self) -> None:
        if self._status >= 0:
            os.close(self._status)
            self._status = -1
        if self._out is not None:
            self._out.close()
            self._out = None


async def finish_anyway(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even when the caller is cancelled (the cancellation still wins)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def rebuild_outputs(src: JobDir, tgt: JobDir, sizes: dict[str, int]) -> None:
    """The target's stdout/stderr as the source's were at the freeze."""
    tgt.create()
    for name, path in (("stdout", src.stdout), ("stderr", src.stderr)):
        with open(path, "rb") as fin, open(tgt.path / name, "wb") as fout:
            fout.write(fin.read(sizes[str(path)]))


def frozen_ms_from_log(log_path: Path) -> float | None:
    """From a lazy dump's log: the first task seized until the page server starts (images done)."""
    seized = serving = None
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                if seized is None and (m := _SEIZED.match(line)):
                    seized = float(m.group(1))
                elif m := _SERVING.match(line):
                    serving = float(m.group(1))
                    break
    except OSError:
        return None
    if seized is None or serving is None:
        return None
    return (serving - seized) * 1000


def transferred_pages(log_path: Path) -> int | None:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    found = _TRANSFERRED.findall(text)
    return sum(int(copied) for copied, _total in found) if found else None


def tls_args(ca: Path | None, cert: Path | None, key: Path | None) -> tuple[str, ...]:
    """CRIU's flags for a page server (and its client) that speak only TLS, each side presenting
    its certificate and trusting only ``ca``; () without a certificate: plain text."""
    if cert is None or key is None or ca is None:
        return ()
    return ("--tls", "--tls-cacert", str(ca), "--tls-cert", str(cert), "--tls-key", str(key))
