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
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ferry.common.ports import free_port
from ferry.criu.errors import CriuError
from ferry.criu.external import external_keys
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import DEFAULT_TIMEOUT_S
from ferry.criu.lazy_common import (
    LAZY_LOG,
    PAGE_SIZE,
    PIPE_MAX_BYTES,
    LiveMoveFailed,
    copy_images,
    ensure_pipe_limits,
    finish_anyway,
    kerndat_cache_problem,
    rebuild_outputs,
    tree_pids,
)
from ferry.criu.lazy_source import Frozen, LazySource
from ferry.criu.lazy_target import LazyTarget

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

CopyImages = Callable[[Path, Path], Awaitable[int]]


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


class LiveMove:
    """Move the workload rooted at host pid ``pid`` (PID 1 of its namespace, launched by
    ``ferry.criu.launch.launch`` into ``source``) to ``target`` with CRIU post-copy, both halves
    (``LazySource``, ``LazyTarget``) driven from this process.

    ``source_images`` and ``target_images`` must be absent or empty. ``copy`` moves the images
    that are not memory between them (a local copy by default). ``address``/``port``: where the
    source's page server listens (a free port by default).
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
        tls_args: tuple[str, ...] = (),
    ) -> None:
        self.source = source
        self.tls_args = tls_args
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
        self._src = LazySource(source, pid, self.source_images, criu_bin=criu_bin, address=address, port=port,
                               timeout_s=timeout_s, tls_args=tls_args)
        self._tgt: LazyTarget | None = None
        self._frozen: Frozen | None = None
        self._switched = False
        self._done = False
        self._t: dict[str, float] = {}
        self._bytes_final = 0

    def _mark(self, name: str) -> None:
        self._t[name] = time.monotonic()

    def _ms(self, a: str, b: str) -> float:
        return (self._t[b] - self._t[a]) * 1000

    async def switch(self) -> ShimInfo:
        """Freeze the source, restore on the target; return once the target runs (its pages follow).

        On failure everything started is undone (the source runs again) and LiveMoveFailed raised.
        """
        if self._switched:
            raise RuntimeError("LiveMove.switch() runs once")
        self._switched = True
        if self.target_images.exists() and any(self.target_images.iterdir()):
            raise LiveMoveFailed(f"images directory {self.target_images} is not empty", source_running=True)
        try:
            outputs = [self.source.stdout, self.source.stderr]
            keys = external_keys(self.pid, outputs)  # what the freeze will name them (ferry.criu.external)
            inherit = {p.name: keys.get(str(p), str(p)) for p in outputs}
            self._tgt = LazyTarget(self.target, self.target_images, incarnation=self.incarnation, inherit=inherit,
                                   criu_bin=self.criu_bin, python=self.python, timeout_s=self.timeout_s,
                                   tls_args=self.tls_args)
            await self._tgt.arm()  # Python's start-up, before the freeze
            self._mark("start")
            self._frozen = frozen = await self._src.freeze()  # undoes itself on failure
            self.port = frozen.port
            self._mark("ready")
            self._bytes_final = await self.copy(self.source_images, self.target_images)
            await finish_anyway(asyncio.to_thread(rebuild_outputs, self.source, self.target, frozen.sizes))
            self._mark("copied")
            shim = await self._tgt.start(frozen.address, frozen.port)
            self._mark("running")
        except BaseException as exc:
            target_started = self._tgt is not None and self._tgt.shim is not None
            await finish_anyway(self._rollback())
            self._done = True
            if isinstance(exc, LiveMoveFailed):
                exc.source_running, exc.target_killed = self._src.running(), target_started
                raise
            if isinstance(exc, (CriuError, OSError)):
                raise LiveMoveFailed(
                    f"live move failed: {exc}" if isinstance(exc, OSError) else str(exc),
                    source_running=self._src.running(),
                    target_killed=target_started,
                    log_excerpt=getattr(exc, "log_excerpt", ()),
                    log_path=getattr(exc, "log_path", None),
                ) from exc
            raise
        log.info("live move: pid %d runs on the target as pid %d after %.0f ms", self.pid, shim.pid,
                 self._ms("start", "running"))
        return shim

    async def complete(self, timeout_s: float | None = 600.0) -> LiveMoveResult:
        """Wait until every page is on the target, then kill the source; return the measurements.

        When the transfer fails (or takes longer than ``timeout_s``) the target is killed, the
        source resumes, and LiveMoveFailed is raised.
        """
        tgt, frozen = self._tgt, self._frozen
        if tgt is None or frozen is None or tgt.shim is None or "running" not in self._t:
            raise RuntimeError("LiveMove.complete() needs a successful switch()")
        if self._done:
            raise RuntimeError("LiveMove.complete() runs once")
        try:
            pages = await tgt.wait_local(timeout_s)
            self._mark("local")
        except BaseException as exc:
            await finish_anyway(self._rollback())
            self._done = True
            if isinstance(exc, LiveMoveFailed):
                exc.source_running, exc.target_killed = self._src.running(), True
            raise
        # Every page is local: from here on the move is done, whatever happens to the caller.
        try:
            await finish_anyway(self._src.end())
            self._mark("end")
        finally:
            self._done = True
            tgt.close()
        assert tgt.running_at is not None and tgt.local_at is not None
        first, last = tgt.first_write_at, frozen.last_write_at
        return LiveMoveResult(
            source_pid=self.pid,
            pid=tgt.shim.pid,
            shim=tgt.shim,
            port=frozen.port,
            dump_ms=frozen.dump_ms,
            freeze_ms=frozen.freeze_ms,
            copy_ms=self._ms("ready", "copied"),
            restore_ms=self._ms("copied", "running"),
            lazy_start_ms=tgt.lazy_start_ms,
            switch_ms=(tgt.running_at - frozen.frozen_at) * 1000,
            downtime_ms=(first - last) * 1000 if first is not None and last is not None else None,
            degraded_ms=self._ms("running", "local"),
            total_ms=self._ms("start", "end"),
            bytes_final=self._bytes_final,
            pages_lazy=pages,
            bytes_lazy=pages * PAGE_SIZE if pages is not None else None,
            started_at=frozen.started_at,
            frozen_at=frozen.frozen_at,
            running_at=tgt.running_at,
            pages_local_at=tgt.local_at,
            last_source_write_at=last,
            first_target_write_at=first,
        )

    async def run(self) -> LiveMoveResult:
        await self.switch()
        return await self.complete()

    async def abort(self) -> bool:
        """Undo a switched move that will not be completed: kill the target, resume the source.

        Returns whether the source runs again.
        """
        if self._done:
            raise RuntimeError("the live move already ended")
        await finish_anyway(self._rollback())
        self._done = True
        return self._src.running()

    async def _rollback(self) -> None:
        if self._tgt is not None:
            await self._tgt.kill()
        await self._src.resume()


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
