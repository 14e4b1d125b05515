"""The durable record of a post-copy target in flight, and how a successor takes it over.

The target of a live move runs while its memory still arrives through ``criu lazy-pages``; the
service that started them waits for the daemon and then reports the move done. When that service
dies midway, the daemon and the restored tree live on (each has its own session) and the transfer
ends by itself, but nobody would report it: the job would stay ``migrating`` and its source frozen.
So ``LazyTarget`` writes ``live-target.json`` into the job's directory once the daemon runs (the
daemon's PID and start time, where its exit status will be written, the caller's op) and the
caller removes it after its report. A successor finds the record (``OrphanTarget.find``), waits
for the daemon (``wait_local``: a pidfd, not polling) and reads how it ended: exit 0 means every
page arrived; anything else, or a daemon gone without a status, means the copy here cannot be
trusted and is killed (``LiveMoveFailed``), so the source can resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict

from ferry.criu.fdwait import until_ready
from ferry.criu.jobdir import JobDir, write_json_atomic
from ferry.criu.lazy_common import LiveMoveFailed, transferred_pages
from ferry.criu.treekill import kill_tree

__all__ = ["RECORD_FILE", "LiveTargetRecord", "OrphanTarget", "process_start_time"]

log = logging.getLogger("ferry.criu.lazy")

RECORD_FILE = "live-target.json"


class LiveTargetRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    incarnation: int
    op: str | None = None
    lazy_pid: int
    lazy_started: float  # the daemon's start time (psutil), so a reused PID is not mistaken for it
    exit_file: str
    log_file: str
    images: str
    shim_pid: int | None = None  # the restored tree's root, once it runs
    running_at: float | None = None


def process_start_time(pid: int) -> float | None:
    """When `pid` started, or None once it has ended: a zombie (ended, its parent not yet told)
    counts as ended, or a daemon just killed would still look alive to its own parent."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(process.create_time())
    except (psutil.Error, OSError):
        return None


def write_record(job_dir: JobDir, record: LiveTargetRecord) -> None:
    write_json_atomic(job_dir.path / RECORD_FILE, record)


def forget_record(job_dir: JobDir) -> None:
    (job_dir.path / RECORD_FILE).unlink(missing_ok=True)


async def _wait_exit(pid: int) -> None:
    """Returns when `pid` (not a child of this process) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await until_ready(fd)
    finally:
        os.close(fd)


class OrphanTarget:
    """A post-copy target whose starter died: see the module's doc."""

    def __init__(self, job_dir: JobDir, record: LiveTargetRecord) -> None:
        self.job_dir = job_dir
        self.record = record
        self.local_at: float | None = None

    @classmethod
    def find(cls, job_dir: JobDir) -> OrphanTarget | None:
        try:
            record = LiveTargetRecord.model_validate_json((job_dir.path / RECORD_FILE).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("unreadable %s in %s (%s): ignored", RECORD_FILE, job_dir.path, exc)
            return None
        return cls(job_dir, record)

    def daemon_running(self) -> bool:
        started = process_start_time(self.record.lazy_pid)
        return started is not None and abs(started - self.record.lazy_started) < 0.05

    def exit_status(self) -> int | None:
        try:
            return int(Path(self.record.exit_file).read_text().strip())
        except (OSError, ValueError):
            return None

    def target_running(self) -> bool:
        """The restored tree of this record's incarnation runs here."""
        shim = self.job_dir.read_shim()
        if shim is None or shim.incarnation != self.record.incarnation or self.job_dir.read_exit() is not None:
            return False
        return process_start_time(shim.pid) is not None

    async def wait_local(self, timeout_s: float | None = 600.0) -> int | None:
        """Waits for the daemon; the pages it sent lazily. LiveMoveFailed (the target killed) when it
        failed, was killed, or outlasts ``timeout_s``."""
        if self.daemon_running():
            try:
                async with asyncio.timeout(timeout_s):
                    await _wait_exit(self.record.lazy_pid)
            except TimeoutError:
                await self.kill()
                raise LiveMoveFailed(f"the memory did not reach the target within {timeout_s:.0f} s",
                                     source_running=False, target_killed=True) from None
        rc = self.exit_status()
        with contextlib.suppress(OSError):
            self.local_at = Path(self.record.exit_file).stat().st_mtime
        if rc != 0 or not self.target_running():
            await self.kill()
            why = ("the target copy is gone" if rc == 0 else
                   "criu lazy-pages ended without an exit status (killed with its starter)" if rc is None else
                   f"criu lazy-pages failed (exit {rc}) while its starter was down")
            raise LiveMoveFailed(f"{why}; see {self.record.log_file}", source_running=False, target_killed=True,
                                 log_path=self.record.log_file)
        return transferred_pages(Path(self.record.log_file))

    async def kill(self) -> None:
        """The daemon and the restored tree of this record are gone when this returns."""
        if self.daemon_running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.record.lazy_pid, signal.SIGKILL)
            await _wait_exit(self.record.lazy_pid)
        shim = self.job_dir.read_shim()
        if shim is not None and shim.incarnation == self.record.incarnation and process_start_time(shim.pid):
            log.warning("live move: killing the target (pid %d) its starter left", shim.pid)
            await kill_tree(shim.pid, grace_s=0)

    def forget(self) -> None:
        forget_record(self.job_dir)
