"""The target half of a post-copy move: restore at once, take the memory from the source's page server.

    tgt = LazyTarget(job_dir, images, incarnation=K, inherit=...)
    await tgt.arm()                         # Python and the shim loaded, before the source freezes
    ...                                     # the images arrive in ``images``, the outputs in job_dir
    shim = await tgt.start(address, port)   # the workload runs here (its pages still arriving)
    await tgt.wait_local()                  # every page is here; LiveMoveFailed when the transfer failed
    await tgt.kill()                        # undo: the target copy is gone (the source must resume)
    tgt.forget()                            # after the caller reported the outcome

While the daemon runs, ``live-target.json`` in the job's directory records it, so that a successor
of a caller that died midway can finish the move (``ferry.criu.lazy_record``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ferry.criu.binary import find_criu, setup_hint
from ferry.criu.errors import RestoreFailed
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import DEFAULT_TIMEOUT_S
from ferry.criu.lazy_common import (
    END_TIMEOUT_S,
    LAZY_LOG,
    LAZY_SOCKET,
    CriuProcess,
    LiveMoveFailed,
    transferred_pages,
)
from ferry.criu.lazy_record import LiveTargetRecord, forget_record, process_start_time, write_record
from ferry.criu.lazy_shim import ArmedRestore
from ferry.criu.progress import FirstWrite
from ferry.criu.treekill import kill_tree

__all__ = ["LazyTarget"]

RESTORE_GRACE_S = 2.0
"""How long a restore whose lazy-pages daemon failed may still report its own outcome."""

log = logging.getLogger("ferry.criu.lazy")


class LazyTarget:
    """Restores ``images`` into ``job_dir`` with lazy pages served from the source's page server.

    ``inherit``: as for ``ferry.criu.launch.restore`` (the source's output paths, which the
    workload's open files name). Timings are kept in ``lazy_start_ms``, ``restore_ms`` (daemon start
    plus restore), ``running_at``, ``local_at`` and ``first_write_at`` (wall clock)."""

    def __init__(
        self,
        job_dir: JobDir,
        images: Path,
        *,
        incarnation: int,
        inherit: Mapping[str, str],
        criu_bin: str = "criu",
        python: str = sys.executable,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_args: tuple[str, ...] = (),
        op: str | None = None,
        tls_args: tuple[str, ...] = (),
        node_netns: str | None = None,
    ) -> None:
        self.tls_args = tls_args  # to the source's page server (ferry.criu.lazy_common.tls_args)
        criu = find_criu(criu_bin)
        if criu is None:
            raise LiveMoveFailed(f"criu binary {criu_bin!r} not found: {setup_hint()}", source_running=True)
        self.criu = criu
        self.job_dir = job_dir
        self.images = Path(images).absolute()
        self.timeout_s = timeout_s
        self.incarnation = incarnation
        self.op = op
        self.lazy = CriuProcess("criu lazy-pages", self.images / LAZY_LOG,
                                exit_file=job_dir.path / f"lazy-pages-{incarnation}.rc")
        self.record: LiveTargetRecord | None = None
        self.restore = ArmedRestore(job_dir, self.images, inherit=inherit, incarnation=incarnation,
                                    criu_args=["--lazy-pages", *extra_args], criu_bin=criu, python=python,
                                    node_netns=node_netns)
        self.shim: ShimInfo | None = None
        self.watch: FirstWrite | None = None
        self.lazy_start_ms = 0.0
        self.restore_ms = 0.0
        self.running_at: float | None = None
        self.local_at: float | None = None

    async def arm(self) -> None:
        self.images.mkdir(parents=True, exist_ok=True)
        await self.restore.arm(self.timeout_s)

    async def start(self, address: str, port: int) -> ShimInfo:
        """Start the lazy-pages daemon and restore; return once the workload runs here.

        On failure whatever started is stopped again and the error raised (the source must resume)."""
        t0 = time.monotonic()
        argv = [self.criu, "lazy-pages", "--page-server", "--address", address, "--port", str(port), *self.tls_args]
        argv += ["-D", str(self.images), "-o", LAZY_LOG, "-v4"]
        try:
            if not await self.lazy.start(argv, self.timeout_s):
                rc = await self.lazy.wait(END_TIMEOUT_S)
                excerpt, reason = self.lazy.failure()
                raise RestoreFailed(f"criu lazy-pages failed to start (exit {rc}): {reason}",
                                    log_excerpt=excerpt, log_path=str(self.lazy.log_path))
            self.lazy_start_ms = (time.monotonic() - t0) * 1000
            self._record()
            self.watch = FirstWrite([self.job_dir.stdout, self.job_dir.stderr])
            self.watch.start()
            self.shim = await self._restore_while_served()
            self.running_at = time.time()
            self._record(shim_pid=self.shim.pid, running_at=self.running_at)
            self.restore_ms = (time.monotonic() - t0) * 1000
            await self.restore.reap()
        except BaseException:
            await self.kill()
            raise
        return self.shim

    async def _restore_while_served(self) -> ShimInfo:
        """The restore, given up at once when the lazy-pages daemon fails first: with its memory
        source gone the restore would wait for a page forever."""
        go = asyncio.ensure_future(self.restore.go(self.timeout_s))
        gone = asyncio.ensure_future(self.lazy.wait())
        try:
            await asyncio.wait({go, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if go.done() or not gone.done() or gone.cancelled() or gone.result() == 0:
            return await go  # done, or every page arrived before the restore reported
        # the daemon also fails when the restore does (it loses its peer): the restore's own
        # error, if it has one within a moment, says more
        await asyncio.wait({go}, timeout=RESTORE_GRACE_S)
        if go.done():
            return await go
        go.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await go
        excerpt, reason = self.lazy.failure()
        raise RestoreFailed(f"criu lazy-pages exited ({gone.result()}) before the restore was done, so the "
                            f"memory source went away: {reason}", log_excerpt=excerpt,
                            log_path=str(self.lazy.log_path))

    async def wait_local(self, timeout_s: float | None = 600.0) -> int | None:
        """Wait until every page is here; return how many came lazily. LiveMoveFailed when the
        transfer failed or outlasted ``timeout_s``: the target copy is then already killed.
        ``close()`` after reading ``first_write_at``."""
        try:
            rc = await self.lazy.wait(timeout_s)
        except TimeoutError:
            await self.kill()
            raise LiveMoveFailed(f"the memory did not reach the target within {timeout_s:.0f} s; "
                                 f"see {self.lazy.log_path}", source_running=False, target_killed=True) from None
        self.local_at = time.time()
        if rc != 0:
            excerpt, reason = self.lazy.failure()
            await self.kill()
            raise LiveMoveFailed(f"criu lazy-pages failed (exit {rc}) while the target ran: {reason}",
                                 source_running=False, target_killed=True, log_excerpt=excerpt,
                                 log_path=str(self.lazy.log_path))
        return transferred_pages(self.lazy.log_path)

    def _record(self, **update: object) -> None:
        if self.record is None:
            pid = self.lazy.pid
            assert pid is not None and self.lazy.exit_file is not None
            self.record = LiveTargetRecord(incarnation=self.incarnation, op=self.op, lazy_pid=pid,
                                           lazy_started=process_start_time(pid) or 0.0,
                                           exit_file=str(self.lazy.exit_file), log_file=str(self.lazy.log_path),
                                           images=str(self.images))
        if update:
            self.record = self.record.model_copy(update=update)
        write_record(self.job_dir, self.record)

    def forget(self) -> None:
        """The caller has reported how the move ended: nobody needs to take it over."""
        forget_record(self.job_dir)
        if self.lazy.exit_file is not None:
            self.lazy.exit_file.unlink(missing_ok=True)

    @property
    def first_write_at(self) -> float | None:
        return self.watch.at if self.watch is not None else None

    async def kill(self) -> None:
        """Undo: the starter, the restored tree and the daemon are gone when this returns."""
        await self.restore.cancel()
        if self.shim is not None:
            log.warning("live move: killing the target (pid %d)", self.shim.pid)
            await kill_tree(self.shim.pid, grace_s=0)
        await self.lazy.kill()
        self.close()
        self.forget()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        (self.images / LAZY_SOCKET).unlink(missing_ok=True)
        self.lazy.close()
