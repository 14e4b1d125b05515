"""The source half of a post-copy move: freeze the tree, dump all but its memory, serve the memory.

    src = LazySource(job_dir, pid, images, address=A)
    frozen = await src.freeze()   # images written; the page server listens on A:frozen.port
    ...                           # ship the images, restore on the target with lazy pages
    await src.end()               # once every page is on the target: the tree is killed
    await src.resume()            # or, when the target failed: the tree runs on, as if nothing happened

The tree never runs twice: CRIU dumps with ``--leave-running`` and Ferry queues SIGSTOP to every
process of it once the dump listens, so when CRIU detaches the tree stops before running an
instruction; ``end()`` kills it and ``resume()`` sends SIGCONT (``ferry.criu.lazy`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ferry.common.ports import free_port
from ferry.criu.binary import find_criu, setup_hint
from ferry.criu.errors import CriuError, DumpFailed
from ferry.criu.external import dump_args, external_keys
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import DEFAULT_TIMEOUT_S
from ferry.criu.lazy_common import (
    END_TIMEOUT_S,
    PS_IOV,
    PS_UNKNOWN_CMD,
    CriuProcess,
    LiveMoveFailed,
    ensure_pipe_limits,
    frozen_ms_from_log,
    signal_all,
    tree_pids,
)
from ferry.criu.linux import is_gone, proc_state
from ferry.criu.procfs_guard import cwd_dump_lock
from ferry.criu.progress import last_write
from ferry.criu.runner import DUMP_LOG, DUMP_MOUNTS
from ferry.criu.sizes import read_sizes, write_size_script
from ferry.criu.treekill import kill_tree
from ferry.criu.veth import HostEnd

__all__ = ["Frozen", "LazySource"]

log = logging.getLogger("ferry.criu.lazy")


class Frozen(BaseModel):
    """What ``LazySource.freeze()`` reports. Durations in ms, ``*_at`` wall-clock seconds."""

    model_config = ConfigDict(frozen=True)

    address: str
    port: int
    sizes: dict[str, int]
    """The sizes of the job's output files at the freeze (what the target's copies start from)."""
    dump_ms: float
    """``criu dump`` start until the images are written (CRIU's start-up included, still running)."""
    freeze_ms: float
    """The frozen part of that, from CRIU's log."""
    started_at: float
    frozen_at: float
    ready_at: float
    last_write_at: float | None
    """The output files' last modification: the source's last observable progress."""
    file_keys: dict[str, str] = {}
    """CRIU's external key of each output file (``ferry.criu.external``), by its path."""


class LazySource:
    """Freezes the workload rooted at ``pid`` (launched into ``job_dir``) and serves its memory."""

    def __init__(
        self,
        job_dir: JobDir,
        pid: int,
        images: Path,
        *,
        criu_bin: str = "criu",
        address: str = "127.0.0.1",
        port: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_args: tuple[str, ...] = (),
        tls_args: tuple[str, ...] = (),
        host_end: HostEnd | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.host_end = host_end  # a bridge-network job's veth (ferry.criu.veth.HostEnd says why)
        self.pid = pid
        self.tls_args = tls_args  # the page server's TLS (ferry.criu.lazy_common.tls_args)
        self.images = Path(images).absolute()
        self.criu_bin = criu_bin
        self.address = address
        self.port = port
        self.timeout_s = timeout_s
        self.extra_args = extra_args
        self.dump = CriuProcess("criu dump --lazy-pages", self.images / DUMP_LOG)
        self.stopped: list[int] = []
        self._frozen = False

    async def freeze(self) -> Frozen:
        """Dump everything but the memory; return once the page server listens (the tree is frozen).

        On failure the tree runs on and LiveMoveFailed is raised."""
        if self._frozen:
            raise RuntimeError("LazySource.freeze() runs once")
        self._frozen = True
        problem = ensure_pipe_limits()
        if problem is not None:
            raise LiveMoveFailed(problem, source_running=not is_gone(self.pid))
        criu = find_criu(self.criu_bin)
        if criu is None:
            raise LiveMoveFailed(f"criu binary {self.criu_bin!r} not found: {setup_hint()}", source_running=True)
        self.images.mkdir(parents=True, exist_ok=True)
        if any(self.images.iterdir()):
            raise LiveMoveFailed(f"images directory {self.images} is not empty", source_running=True)
        if self.port is None:
            self.port = free_port(self.address)
        try:
            return await self._freeze(criu, self.port)
        except BaseException as exc:
            await self.resume()
            if isinstance(exc, LiveMoveFailed):
                exc.source_running = self.running()
                raise
            if isinstance(exc, CriuError):
                raise LiveMoveFailed(str(exc), source_running=self.running(), log_excerpt=exc.log_excerpt,
                                     log_path=exc.log_path) from exc
            if isinstance(exc, OSError):
                raise LiveMoveFailed(f"live move failed: {exc}", source_running=self.running()) from exc
            raise

    async def _freeze(self, criu: str, port: int) -> Frozen:
        jd = self.job_dir
        outputs = [jd.stdout, jd.stderr]
        script = write_size_script(self.images, self.images, outputs)
        argv = [criu, "dump", "--lazy-pages", "--address", self.address, "--port", str(port), *self.tls_args]
        argv += ["-t", str(self.pid), "-D", str(self.images), "-o", DUMP_LOG, "-v4", *DUMP_MOUNTS]
        keys = external_keys(self.pid, outputs)
        argv += ["--leave-running", "--action-script", str(script), *dump_args(keys), *self.extra_args]
        t0, started_at = time.monotonic(), time.time()
        async with cwd_dump_lock(self.pid):  # until it listens, CRIU is past the parasite's /proc step
            listening = await self.dump.start(argv, self.timeout_s)
        if not listening:
            rc = await self.dump.wait(END_TIMEOUT_S)
            excerpt, reason = self.dump.failure()
            raise DumpFailed(f"criu dump --lazy-pages of pid {self.pid} failed (exit {rc}): {reason}",
                             log_excerpt=excerpt, log_path=str(self.dump.log_path))
        dump_ms, ready_at = (time.monotonic() - t0) * 1000, time.time()
        # The tree is frozen: its output files have their final sizes and times.
        self.stopped = tree_pids(self.pid)
        signal_all(self.stopped, signal.SIGSTOP)  # takes effect when CRIU detaches
        if self.host_end is not None:
            await asyncio.to_thread(self.host_end.set_up, False)
        script.unlink(missing_ok=True)
        freeze_ms = frozen_ms_from_log(self.dump.log_path)
        if freeze_ms is None:
            freeze_ms = dump_ms
        return Frozen(address=self.address, port=port, sizes=read_sizes(self.images, outputs), dump_ms=dump_ms,
                      freeze_ms=freeze_ms, started_at=started_at, frozen_at=ready_at - freeze_ms / 1000,
                      ready_at=ready_at, last_write_at=last_write(outputs), file_keys=keys)

    async def end(self) -> None:
        """Every page is on the target: let the dump finish and kill the tree."""
        try:
            rc: int | None = await self.dump.wait(END_TIMEOUT_S)
        except TimeoutError:
            rc = None
            await self.dump.kill()
        if rc != 0:
            log.warning("criu dump exited %s after the transfer; see %s", rc, self.dump.log_path)
        if self.host_end is not None:
            try:
                await asyncio.to_thread(self.host_end.delete)
            except OSError as exc:
                log.warning("live move: the source's veth: %s", exc)
        if await kill_tree(self.pid, END_TIMEOUT_S):
            raise LiveMoveFailed(f"the source pid {self.pid} did not end after SIGKILL", source_running=True)
        self.dump.close()

    async def resume(self) -> bool:
        """Undo the freeze (the target must be gone): end the dump and let the tree run on.

        Returns whether the tree runs again."""
        deadline = time.monotonic() + END_TIMEOUT_S
        while self.dump.running:
            if time.monotonic() > deadline:
                log.warning("live move: criu dump did not end; killing it (the kernel releases the tree)")
                await self.dump.kill()
                break
            await self._abort_page_server()  # refused until it listens, and once a client connected
            with contextlib.suppress(TimeoutError):
                await self.dump.wait(0.1)
        if self.host_end is not None:
            try:
                await asyncio.to_thread(self.host_end.set_up, True)
            except OSError as exc:
                log.warning("live move undone: the job's veth did not come up again: %s", exc)
        if self.stopped:
            signal_all(self.stopped, signal.SIGCONT)
            deadline = time.monotonic() + 2.0
            while proc_state(self.pid) in ("T", "t"):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
        self.dump.close()
        running = self.running()
        log.warning("live move of pid %d undone; the source %s", self.pid, "runs again" if running else "is gone")
        return running

    async def _abort_page_server(self) -> None:
        """Make a page server nobody has connected to fail, so that CRIU resumes the tree."""
        if self.port is None:
            return
        try:
            async with asyncio.timeout(5.0):
                reader, writer = await asyncio.open_connection(self.address, self.port)
                try:
                    writer.write(PS_IOV.pack(PS_UNKNOWN_CMD, 0, 0, 0))
                    await writer.drain()
                    await reader.read()  # until CRIU closes its end
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            pass  # not listening: the lazy-pages daemon got there first, or the dump ended

    def running(self) -> bool:
        state = proc_state(self.pid)
        return state is not None and state not in ("Z", "X", "T", "t")

    def close(self) -> None:
        self.dump.close()
