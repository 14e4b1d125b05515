"""Near-live moves with CRIU post-copy: the final freeze dumps everything but memory, the target
restores at once, and the memory follows over CRIU's page server while the job runs on the target.

    ensure_pipe_limits()          raise fs.pipe-max-size for CRIU's page pipes (at node start)
    kerndat_cache_problem()       why each CRIU start re-probes the kernel (~25 ms), if it does
    LiveMove(...).switch()        freeze, dump what is not memory, copy it, restore with lazy pages:
                                  when it returns the workload runs on the target (degraded)
    LiveMove.complete()           wait until every page is local, then end the source
    LiveMove.abort()              before complete() succeeded: kill the target, resume the source
    live_move(...)                switch() then complete()

Processes (one machine here; between machines the source's page server is reached over TCP):

    source  criu dump --lazy-pages --address A --port P -t PID -D SRC --leave-running --status-fd W
    target  criu lazy-pages --page-server --address A --port P -D TGT --status-fd W
            python -m ferry.criu.lazy_shim restore ... --criu-arg=--lazy-pages   (criu restore -d)

What CRIU 4.1.1 does, read in its source (criu/cr-dump.c ``cr_dump_finish``, ``cr_lazy_mem_dump``;
criu/page-xfer.c ``cr_page_server``, ``page_server_serve``; criu/util.c ``run_tcp_server``;
criu/uffd.c ``cr_lazy_pages``, ``prepare_uffds``, ``setup_uffd``; compel ``compel_resume_task_sig``)
and checked on this kernel:

- ``dump --lazy-pages`` writes and flushes every image, runs the post-dump action script, then runs
  its page server in the foreground: it binds A:P (``--port 0`` is refused, so Ferry picks a free
  port), writes one byte to ``--status-fd`` once it listens, accepts one connection and serves page
  requests until the peer sends PS_IOV_CLOSE or closes the socket. Only then does the dump process
  exit. The tree stays frozen (ptrace-seized) all along; the parasite left it before.
- Memory that cannot be served lazily (only private anonymous mappings are lazy: not file-backed,
  locked, hugetlb, vdso/vvar/vsyscall; criu/include/vma.h ``vma_entry_can_be_lazy``) is written to
  ``pages-<id>.img`` at the freeze, so that file travels with the others (1.5 MB for a Python
  process). Only the dump's log and the scripts Ferry put there stay behind.
- After the transfer the tree is killed, or resumed when the transfer failed or with
  ``--leave-running``. A failed transfer is only one that the page server sees fail: an unknown
  command, say. A peer that closes the socket, or sends PS_IOV_CLOSE, counts as success, and the
  lazy-pages daemon sends PS_IOV_CLOSE even when it gives up because the restore failed after
  handing over its userfaultfds. If it dies midway, the target's missing pages read as zeros (a
  memhog whose daemon was killed died of SIGSEGV 0.1 s later) and CRIU's default kills the source. So
  Ferry never lets CRIU kill the source: it dumps with ``--leave-running`` and, once the dump
  listens, queues SIGSTOP to every process of the tree (as compel does for a tree that was stopped):
  when CRIU detaches, the tree stops before running a single instruction. Ferry then kills it when
  the lazy-pages daemon exited 0 (every page is on the target), or kills the target and sends
  SIGCONT when not.
- To give up before the target connected, Ferry sends the page server an unknown command: the dump
  fails ("Unknown command", "Lazy pages transfer FAILED") and resumes the tree. Killing the dump
  process also releases the tree (the kernel detaches a dead tracer's tracees; measured).
- The lazy-pages daemon listens on ``lazy-pages.socket`` in its work directory (its ``-D``, which
  must be the restore's too) and signals ``--status-fd`` once it does. It takes one userfaultfd per
  task from the restore, sent just before each task enters CRIU's restorer; only then does it
  connect to the page server. It serves faults first and pushes the other pages in the background,
  logs ``UFFD transferred pages: (copied/total)`` per task (at -v4) and exits 0 when every page is
  copied. ``restore --lazy-pages -d`` returns once the tree runs.

If the caller dies between ``switch()`` and ``complete()``, the transfer still finishes (the CRIU
processes run in their own sessions) but the source is left stopped: a node service that restarts
must look for it (the source job directory's ``shim.json``) and end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict

from ferry.criu.binary import SETUP_HINT, find_criu
from ferry.criu.errors import CriuError, DumpFailed, RestoreFailed
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import DEFAULT_TIMEOUT_S
from ferry.criu.lazy_shim import ArmedRestore
from ferry.criu.linux import is_gone
from ferry.criu.logs import failure_summary
from ferry.criu.progress import FirstWrite, last_write
from ferry.criu.runner import DUMP_LOG, kill_tree
from ferry.criu.sizes import SIZES_FILE, read_sizes, write_size_script

__all__ = [
    "LAZY_LOG",
    "PIPE_MAX_BYTES",
    "LiveMove",
    "LiveMoveFailed",
    "LiveMoveResult",
    "copy_images",
    "ensure_pipe_limits",
    "free_port",
    "kerndat_cache_problem",
    "live_move",
    "tree_pids",
]

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
_PS_IOV = struct.Struct("=IIQQ")  # struct page_server_iov: cmd, nr_pages, vaddr, dst_id
_PS_UNKNOWN_CMD = 0xFFFF
_SEIZED = re.compile(r"\((\d+\.\d+)\) Seized task ")
_SERVING = re.compile(r"\((\d+\.\d+)\) Starting page server ")
_TRANSFERRED = re.compile(r"UFFD transferred pages: \((\d+)/(\d+)\)")
_END_TIMEOUT_S = 30.0

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


class LiveMoveResult(BaseModel):
    """One finished live move. Durations in ms; ``*_at`` are wall-clock times (``time.time()``)."""

    model_config = ConfigDict(frozen=True)

    source_pid: int
    pid: int
    shim: ShimInfo
    port: int
    dump_ms: float
    """Starting ``criu dump`` until every image but the memory is written (CRIU's start-up included,
    while the source still runs)."""
    freeze_ms: float
    """The frozen part of that, from CRIU's log: the tree seized until the images are written."""
    copy_ms: float
    restore_ms: float
    """The target side until the workload runs: lazy-pages daemon start plus ``criu restore``."""
    lazy_start_ms: float
    """Of ``restore_ms``: starting the lazy-pages daemon until it listens."""
    switch_ms: float
    """The source frozen until the target runs (freeze + copy + restore): the downtime as CRIU's
    log and Ferry's clock see it."""
    downtime_ms: float | None
    """Measured: the source's last write to its output until the target's first (None: unseen)."""
    degraded_ms: float
    """The target runs until its last page is local (the lazy-pages daemon exits)."""
    total_ms: float
    """Dump start until the source is gone."""
    bytes_final: int
    """Image bytes copied at the freeze (everything but the lazily served memory)."""
    pages_lazy: int | None
    bytes_lazy: int | None
    started_at: float
    frozen_at: float
    running_at: float
    pages_local_at: float
    last_source_write_at: float | None
    first_target_write_at: float | None


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


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (CRIU refuses --port 0)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (for a workload that is PID 1 of its namespace: all of it)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parent = _ppid(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    if _ppid(root) is None:
        return []
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


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


async def _status_byte(fd: int, timeout_s: float) -> bool:
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


class _Criu:
    """One CRIU process run by a live move: its own session, output in a file, a status pipe."""

    def __init__(self, what: str, log_path: Path) -> None:
        self.what = what
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self._out: IO[bytes] | None = None
        self._status = -1

    async def start(self, argv: list[str], timeout_s: float) -> bool:
        """Start it; wait for its status byte. False when it exited first."""
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
            return await _status_byte(r, timeout_s)
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
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
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


async def _finish(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even when the caller is cancelled (the cancellation still wins)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _rebuild_outputs(src: JobDir, tgt: JobDir, sizes: dict[str, int]) -> None:
    """The target's stdout/stderr as the source's were at the freeze."""
    tgt.create()
    for name, path in (("stdout", src.stdout), ("stderr", src.stderr)):
        with open(path, "rb") as fin, open(tgt.path / name, "wb") as fout:
            fout.write(fin.read(sizes[str(path)]))


def _frozen_ms(log_path: Path) -> float | None:
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


def _transferred_pages(log_path: Path) -> int | None:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    found = _TRANSFERRED.findall(text)
    return sum(int(copied) for copied, _total in found) if found else None


# -- the move ------------------------------------------------------------------------------------


class LiveMove:
    """Move the workload rooted at host pid ``pid`` (PID 1 of its namespace, launched by
    ``ferry.criu.launch.launch`` into ``source``) to ``target`` with CRIU post-copy.

    ``source_images`` and ``target_images`` must be absent or empty. ``copy`` moves the images
    that are not memory between them (a local copy by default; a migrator sends them to the other
    node). ``address``/``port``: where the source's page server listens (a free port by default).
    """

    def __init__(
        self,
        source: JobDir,
        pid: int,
        target: JobDir,
        *,
        source_images: Path,
        target_images: Path,
        incarnation: int,
        criu_bin: str = "criu",
        address: str = "127.0.0.1",
        port: int | None = None,
        copy: CopyImages = copy_images,
        python: str = sys.executable,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.source = source
        self.pid = pid
        self.target = target
        self.source_images = Path(source_images).absolute()
        self.target_images = Path(target_images).absolute()
        self.incarnation = incarnation
        self.criu_bin = criu_bin
        self.address = address
        self.port = port
        self.copy = copy
        self.python = python
        self.timeout_s = timeout_s
        self._dump = _Criu("criu dump --lazy-pages", self.source_images / DUMP_LOG)
        self._lazy = _Criu("criu lazy-pages", self.target_images / LAZY_LOG)
        self._stopped: list[int] = []
        self._watch: FirstWrite | None = None
        self._shim: ShimInfo | None = None
        self._restore: ArmedRestore | None = None
        self._switched = False
        self._done = False
        self._t: dict[str, float] = {}
        self._wall: dict[str, float] = {}
        self._bytes_final = 0
        self._last_source_write: float | None = None

    def _mark(self, name: str) -> None:
        self._t[name] = time.monotonic()
        self._wall[name] = time.time()

    def _ms(self, a: str, b: str) -> float:
        return (self._t[b] - self._t[a]) * 1000

    # -- phase 1 ---------------------------------------------------------------------------------

    async def switch(self) -> ShimInfo:
        """Freeze the source, restore on the target; return once the target runs (its pages follow).

        On failure everything started is undone (the source runs again) and LiveMoveFailed raised.
        """
        if self._switched:
            raise RuntimeError("LiveMove.switch() runs once")
        self._switched = True
        problem = ensure_pipe_limits()
        if problem is not None:
            raise LiveMoveFailed(problem, source_running=not is_gone(self.pid))
        criu = find_criu(self.criu_bin)
        if criu is None:
            raise LiveMoveFailed(f"criu binary {self.criu_bin!r} not found: {SETUP_HINT}", source_running=True)
        for d in (self.source_images, self.target_images):
            d.mkdir(parents=True, exist_ok=True)
            if any(d.iterdir()):
                raise LiveMoveFailed(f"images directory {d} is not empty", source_running=True)
        port = self.port if self.port is not None else free_port(self.address)
        self.port = port
        try:
            return await self._switch(criu, port)
        except BaseException as exc:
            try:
                await self._rollback_shielded()
            finally:
                self._done = True
                self._close()
            if isinstance(exc, LiveMoveFailed):
                exc.source_running = self._source_running()
                exc.target_killed = self._shim is not None
                raise
            if isinstance(exc, CriuError):
                raise LiveMoveFailed(
                    str(exc),
                    source_running=self._source_running(),
                    target_killed=self._shim is not None,
                    log_excerpt=exc.log_excerpt,
                    log_path=exc.log_path,
                ) from exc
            if isinstance(exc, OSError):
                raise LiveMoveFailed(
                    f"live move failed: {exc}",
                    source_running=self._source_running(),
                    target_killed=self._shim is not None,
                ) from exc
            raise

    async def _switch(self, criu: str, port: int) -> ShimInfo:
        src, tgt = self.source, self.target
        outputs = [src.stdout, src.stderr]
        script = write_size_script(self.source_images, self.source_images, outputs)
        dump_argv = [criu, "dump", "--lazy-pages", "--address", self.address, "--port", str(port)]
        dump_argv += ["-t", str(self.pid), "-D", str(self.source_images), "-o", DUMP_LOG, "-v4"]
        dump_argv += ["--leave-running", "--action-script", str(script)]
        inherit = {"stdout": str(src.stdout), "stderr": str(src.stderr)}
        self._restore = ArmedRestore(
            tgt,
            self.target_images,
            inherit=inherit,
            incarnation=self.incarnation,
            criu_args=["--lazy-pages"],
            criu_bin=criu,
            python=self.python,
        )
        await self._restore.arm(self.timeout_s)  # Python's start-up, before the freeze
        self._mark("start")
        ready = await self._dump.start(dump_argv, self.timeout_s)
        if not ready:
            rc = await self._dump.wait(_END_TIMEOUT_S)
            excerpt, reason = self._dump.failure()
            raise DumpFailed(
                f"criu dump --lazy-pages of pid {self.pid} failed (exit {rc}): {reason}",
                log_excerpt=excerpt,
                log_path=str(self._dump.log_path),
            )
        self._mark("ready")
        # The tree is frozen: its output files have their final sizes and times.
        self._stopped = tree_pids(self.pid)
        _signal_all(self._stopped, signal.SIGSTOP)  # takes effect when CRIU detaches (see above)
        script.unlink(missing_ok=True)
        sizes = read_sizes(self.source_images, outputs)
        self._last_source_write = last_write(outputs)

        self._bytes_final = await self.copy(self.source_images, self.target_images)
        await asyncio.to_thread(_rebuild_outputs, src, tgt, sizes)
        self._mark("copied")

        lazy_argv = [criu, "lazy-pages", "--page-server", "--address", self.address, "--port", str(port)]
        lazy_argv += ["-D", str(self.target_images), "-o", LAZY_LOG, "-v4"]
        if not await self._lazy.start(lazy_argv, self.timeout_s):
            rc = await self._lazy.wait(_END_TIMEOUT_S)
            excerpt, reason = self._lazy.failure()
            raise RestoreFailed(
                f"criu lazy-pages failed to start (exit {rc}): {reason}",
                log_excerpt=excerpt,
                log_path=str(self._lazy.log_path),
            )
        self._mark("lazy_ready")
        self._watch = FirstWrite([tgt.stdout, tgt.stderr])
        self._watch.start()
        self._shim = await self._restore.go(self.timeout_s)
        self._mark("running")
        await self._restore.reap()
        log.info(
            "live move: pid %d runs on the target as pid %d after %.0f ms",
            self.pid,
            self._shim.pid,
            self._ms("start", "running"),
        )
        return self._shim

    # -- phase 2 ---------------------------------------------------------------------------------

    async def complete(self, timeout_s: float | None = 600.0) -> LiveMoveResult:
        """Wait until every page is on the target, then kill the source; return the measurements.

        When the transfer fails (or takes longer than ``timeout_s``) the target is killed, the
        source resumes, and LiveMoveFailed is raised.
        """
        if self._shim is None or "running" not in self._t:
            raise RuntimeError("LiveMove.complete() needs a successful switch()")
        if self._done:
            raise RuntimeError("LiveMove.complete() runs once")
        shim = self._shim
        try:
            try:
                rc = await self._lazy.wait(timeout_s)
            except TimeoutError:
                raise LiveMoveFailed(
                    f"the memory did not reach the target within {timeout_s:.0f} s; see {self._lazy.log_path}",
                    source_running=False,
                ) from None
            self._mark("local")
            if rc != 0:
                excerpt, reason = self._lazy.failure()
                raise LiveMoveFailed(
                    f"criu lazy-pages failed (exit {rc}) while the target ran: {reason}",
                    source_running=False,
                    log_excerpt=excerpt,
                    log_path=str(self._lazy.log_path),
                )
        except BaseException as exc:
            try:
                await self._rollback_shielded()
            finally:
                self._done = True
                self._close()
            if isinstance(exc, LiveMoveFailed):
                exc.source_running = self._source_running()
                exc.target_killed = True
            raise
        # Every page is local: from here on the move is done, whatever happens to the caller.
        try:
            await _finish(self._end_source())
        finally:
            self._done = True
            self._close()
        pages = _transferred_pages(self._lazy.log_path)
        first = self._watch.at if self._watch is not None else None
        last = self._last_source_write
        freeze_ms = _frozen_ms(self._dump.log_path)
        if freeze_ms is None:
            freeze_ms = self._ms("start", "ready")
        frozen_at = self._wall["ready"] - freeze_ms / 1000
        return LiveMoveResult(
            source_pid=self.pid,
            pid=shim.pid,
            shim=shim,
            port=self.port or 0,
            dump_ms=self._ms("start", "ready"),
            freeze_ms=freeze_ms,
            copy_ms=self._ms("ready", "copied"),
            restore_ms=self._ms("copied", "running"),
            lazy_start_ms=self._ms("copied", "lazy_ready"),
            switch_ms=(self._wall["running"] - frozen_at) * 1000,
            downtime_ms=(first - last) * 1000 if first is not None and last is not None else None,
            degraded_ms=self._ms("running", "local"),
            total_ms=self._ms("start", "end"),
            bytes_final=self._bytes_final,
            pages_lazy=pages,
            bytes_lazy=pages * PAGE_SIZE if pages is not None else None,
            started_at=self._wall["start"],
            frozen_at=frozen_at,
            running_at=self._wall["running"],
            pages_local_at=self._wall["local"],
            last_source_write_at=last,
            first_target_write_at=first,
        )

    async def _end_source(self) -> None:
        try:
            dump_rc = await self._dump.wait(_END_TIMEOUT_S)
        except TimeoutError:
            dump_rc = None
            await self._dump.kill()
        if dump_rc != 0:
            log.warning("criu dump exited %s after the transfer; see %s", dump_rc, self._dump.log_path)
        await self._kill_source()
        self._mark("end")

    async def run(self) -> LiveMoveResult:
        await self.switch()
        return await self.complete()

    async def abort(self) -> bool:
        """Undo a switched move that will not be completed: kill the target, resume the source.

        Returns whether the source runs again.
        """
        if self._done:
            raise RuntimeError("the live move already ended")
        await self._rollback_shielded()
        self._done = True
        self._close()
        return self._source_running()

    # -- undoing ---------------------------------------------------------------------------------

    async def _rollback_shielded(self) -> None:
        await _finish(self._rollback())

    async def _rollback(self) -> None:
        if self._restore is not None:
            await self._restore.cancel()
        if self._shim is not None:
            log.warning("live move: killing the target (pid %d)", self._shim.pid)
            await kill_tree(self._shim.pid, grace_s=0)
        await self._lazy.kill()
        deadline = time.monotonic() + _END_TIMEOUT_S
        while self._dump.running:
            if time.monotonic() > deadline:
                log.warning("live move: criu dump did not end; killing it (the kernel releases the tree)")
                await self._dump.kill()
                break
            await self._abort_page_server()  # refused until it listens, and once a client connected
            with contextlib.suppress(TimeoutError):
                await self._dump.wait(0.1)
        if self._stopped:
            _signal_all(self._stopped, signal.SIGCONT)
            deadline = time.monotonic() + 2.0
            while _state(self.pid) in ("T", "t"):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
        if self._watch is not None:
            self._watch.stop()
        log.warning(
            "live move of pid %d undone; the source %s", self.pid, "runs again" if self._source_running() else "is gone"
        )

    async def _abort_page_server(self) -> None:
        """Make a page server nobody has connected to fail, so that CRIU resumes the tree."""
        if self.port is None:
            return
        try:
            async with asyncio.timeout(5.0):
                reader, writer = await asyncio.open_connection(self.address, self.port)
                try:
                    writer.write(_PS_IOV.pack(_PS_UNKNOWN_CMD, 0, 0, 0))
                    await writer.drain()
                    await reader.read()  # until CRIU closes its end
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            pass  # not listening: the lazy-pages daemon got there first, or the dump ended

    async def _kill_source(self) -> None:
        pids = tree_pids(self.pid) or [self.pid]
        _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + _END_TIMEOUT_S
        while not is_gone(self.pid):
            if time.monotonic() > deadline:
                raise LiveMoveFailed(f"the source pid {self.pid} did not end after SIGKILL", source_running=True)
            await asyncio.sleep(0.005)

    def _source_running(self) -> bool:
        state = _state(self.pid)
        return state is not None and state not in ("Z", "X", "T", "t")

    def _close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        (self.target_images / LAZY_SOCKET).unlink(missing_ok=True)
        self._dump.close()
        self._lazy.close()


async def live_move(
    source: JobDir,
    pid: int,
    target: JobDir,
    *,
    source_images: Path,
    target_images: Path,
    incarnation: int,
    criu_bin: str = "criu",
    address: str = "127.0.0.1",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    transfer_timeout_s: float | None = 600.0,
) -> LiveMoveResult:
    """``LiveMove(...).switch()`` then ``complete()``."""
    move = LiveMove(
        source,
        pid,
        target,
        source_images=source_images,
        target_images=target_images,
        incarnation=incarnation,
        criu_bin=criu_bin,
        address=address,
        timeout_s=timeout_s,
    )
    await move.switch()
    return await move.complete(transfer_timeout_s)
