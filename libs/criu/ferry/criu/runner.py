"""Running the ``criu`` binary: feature check, dump, the restore command line."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict

from ferry.criu.binary import find_criu, parse_version, required_version, setup_hint
from ferry.criu.errors import CriuMissing, DumpFailed, ImageError
from ferry.criu.external import dump_args, external_keys, is_external_key
from ferry.criu.images import DumpStats, read_dump_stats
from ferry.criu.logs import failure_summary, first_error
from ferry.criu.procfs_guard import cwd_dump_lock
from ferry.criu.sizes import SIZES_FILE, read_sizes, write_size_script

__all__ = ["CriuRunner", "CriuStatus", "DumpResult"]

DUMP_LOG = "dump.log"
RESTORE_LOG = "restore.log"
DUMP_MOUNTS = ("--external", "mnt[]")
"""A job has a mount namespace of its own, a private copy of its host's plus its own /proc
(``linux.mount_own_proc``): every mount but that /proc is recorded as external, by its path, so
that no tmpfs is copied into the images and the restore binds the same paths of its host."""
RESTORE_MOUNTS = ("--root", "/", "--external", "mnt[]")
"""The restored mount namespace is built over this host's root, binding each external mount from
the same path here (a node that lacks one cannot restore the job)."""
def job_criu_args(network: str, requested: Sequence[str] = (), *, adopted: bool = False) -> tuple[str, ...]:
    """CRIU's options for each dump and restore of an operation on a job (every pre-copy round of
    a live move included): the operation's own (``--tcp-established`` where the user keeps the
    connections of a host-network job) plus its network's: a job with a network namespace of its
    own (``--network isolated|bridge``) takes it along, so its TCP connections (both ends in the tree) are
    dumped and restored as they are. With TCP connections the namespace is locked with nftables
    (CRIU links libnftables; its default, iptables, needs a binary Debian no longer has). A job that
    was adopted (``ferry adopt``) has its session leader outside its tree: ``--shell-job``."""
    args = list(requested)
    if adopted and "--shell-job" not in args:
        args.append("--shell-job")
    if network in ("isolated", "bridge") and "--tcp-established" not in args:
        args.append("--tcp-established")
    if "--tcp-established" in args and "--network-lock" not in args:
        args += ["--network-lock", "nftables"]
    return tuple(args)


# Post-copy needs CRIU's pipes to hold its page batches; without CAP_SYS_RESOURCE they are capped
# by fs.pipe-max-size (see DESIGN: "page-pipe: tee: 65536: Operation not permitted").
LAZY_PIPE_MIN_BYTES = 4 << 20
_CHECK_TIMEOUT_S = 30.0


class CriuStatus(BaseModel):
    """What ``criu`` can do on this node."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    version: str | None
    error: str | None
    lazy_pages: bool
    mem_dirty_track: bool
    path: str | None = None


class DumpResult(BaseModel):
    """One finished ``criu dump``; times in milliseconds (CRIU's own from ``stats-dump``)."""

    model_config = ConfigDict(frozen=True)

    wall_ms: float
    frozen_ms: float | None
    freezing_ms: float | None
    memdump_ms: float | None
    memwrite_ms: float | None
    pages_written: int | None
    file_sizes: dict[str, int]
    images_dir: str
    file_keys: dict[str, str] = {}
    """CRIU's external key of each of ``record_sizes`` the tree has open (``ferry.criu.external``):
    what a restore hands that file to CRIU under."""


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_CHECK_TIMEOUT_S,
        check=False,
    )


def _pipe_max_size() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return first_error(lines) or (lines[-1] if lines else "no output")


class CriuRunner:
    """Runs one ``criu`` binary (a name looked up on PATH, /usr/local/sbin, /usr/sbin, or a path)."""

    def __init__(self, criu_bin: str = "criu") -> None:
        self.criu_bin = criu_bin

    # -- check -----------------------------------------------------------------------------------

    def check(self) -> CriuStatus:
        """Whether CRIU is usable here, and which optional features work. Never raises."""
        try:
            return self._check()
        except Exception as exc:  # a probe must answer, whatever broke
            return self._status_error(None, f"checking CRIU failed: {exc}")

    @staticmethod
    def _status_error(version: str | None, error: str, path: str | None = None) -> CriuStatus:
        return CriuStatus(ok=False, version=version, error=error, lazy_pages=False, mem_dirty_track=False, path=path)

    def _check(self) -> CriuStatus:
        path = find_criu(self.criu_bin)
        if path is None:
            return self._status_error(None, f"criu binary {self.criu_bin!r} not found: {setup_hint()}")
        out = _run([path, "--version"])
        parsed = parse_version(out.stdout + out.stderr)
        if out.returncode != 0 or parsed is None:
            return self._status_error(None, f"{path} --version: {_one_line(out.stdout + out.stderr)}", path)
        version = ".".join(map(str, parsed))
        need = required_version()
        if parsed[:2] < need:
            return self._status_error(
                version, f"CRIU {version} is too old: {setup_hint()}", path
            )
        chk = _run([path, "check"])
        if "Looks good" not in chk.stdout + chk.stderr:
            return self._status_error(version, f"criu check: {_one_line(chk.stdout + chk.stderr)}", path)
        uffd = _run([path, "check", "--feature", "uffd-noncoop"]).returncode == 0
        dirty = _run([path, "check", "--feature", "mem_dirty_track"]).returncode == 0
        return CriuStatus(
            ok=True,
            version=version,
            error=None,
            lazy_pages=uffd and _pipe_max_size() >= LAZY_PIPE_MIN_BYTES,
            mem_dirty_track=dirty,
            path=path,
        )

    def _require(self) -> str:
        path = find_criu(self.criu_bin)
        if path is None:
            raise CriuMissing(f"criu binary {self.criu_bin!r} not found: {setup_hint()}")
        return path

    # -- dump ------------------------------------------------------------------------------------

    async def dump(
        self,
        pid: int,
        images_dir: Path,
        *,
        leave_running: bool,
        record_sizes: Sequence[Path] = (),
        extra_args: Sequence[str] = (),
    ) -> DumpResult:
        """Dump the tree rooted at ``pid`` into ``images_dir`` (log: ``images_dir/dump.log``).

        ``record_sizes`` are measured while the tree is frozen (see ``ferry.criu.sizes``). On any
        failure CRIU resumes the tree, so with ``leave_running`` it keeps running. Cancelling waits
        for CRIU to finish: killing it midway could leave the tree stopped or with CRIU's parasite
        code still in it.
        """
        criu = self._require()
        images_dir = _prepare_images_dir(images_dir)
        log_path = images_dir / DUMP_LOG
        argv = [criu, "dump", "-t", str(pid), "-D", str(images_dir), "-o", DUMP_LOG, "-v4", *DUMP_MOUNTS]
        if leave_running:
            argv.append("--leave-running")
        # The script sits in the images dir (a data disk, where /tmp may be noexec) only while
        # CRIU runs, so it never travels with the checkpoint.
        script = write_size_script(images_dir, images_dir, record_sizes) if record_sizes else None
        keys = external_keys(pid, record_sizes)
        argv += dump_args(keys)
        try:
            if script is not None:
                argv += ["--action-script", str(script)]
            argv += list(extra_args)
            async with cwd_dump_lock(pid):
                started = time.monotonic()
                rc, output = await _run_to_end(argv)
                wall_ms = (time.monotonic() - started) * 1000
        finally:
            if script is not None:
                script.unlink(missing_ok=True)
        if rc != 0:
            excerpt, reason = failure_summary(log_path, output)
            raise DumpFailed(
                f"criu dump of pid {pid} failed (exit {rc}): {reason}",
                log_excerpt=excerpt,
                log_path=str(log_path) if log_path.exists() else None,
            )
        stats = _dump_stats(images_dir)
        sizes = read_sizes(images_dir, record_sizes) if record_sizes else {}
        return DumpResult(
            wall_ms=wall_ms,
            frozen_ms=stats.frozen_time_us / 1000 if stats else None,
            freezing_ms=stats.freezing_time_us / 1000 if stats else None,
            memdump_ms=stats.memdump_time_us / 1000 if stats else None,
            memwrite_ms=stats.memwrite_time_us / 1000 if stats else None,
            pages_written=stats.pages_written if stats else None,
            file_sizes=sizes,
            images_dir=str(images_dir),
            file_keys=keys,
        )

    # -- restore ---------------------------------------------------------------------------------

    def restore_command(
        self,
        images_dir: Path,
        pidfile: Path,
        inherit: Mapping[int, str],
        extra_args: Sequence[str] = (),
    ) -> list[str]:
        """argv of a detached ``criu restore`` (log: ``images_dir/restore.log``).

        ``inherit`` maps a file descriptor that the caller passes to CRIU (open on this node's copy
        of a file) to the file's external key at the dump (``DumpResult.file_keys``), or, for images
        without one, to the absolute path that the dumped process had open; CRIU then hands that fd
        to the restored process instead of reopening the file, and skips its size check.
        """
        criu = find_criu(self.criu_bin) or self.criu_bin
        argv = [
            criu,
            "restore",
            "-D",
            str(images_dir),
            "-o",
            RESTORE_LOG,
            "-v4",
            "-d",
            "--pidfile",
            str(pidfile),
        ]
        for fd, path in sorted(inherit.items()):
            argv += ["--inherit-fd", f"fd[{fd}]:{path if is_external_key(path) else path.lstrip('/')}"]
        argv += [*RESTORE_MOUNTS, *extra_args]
        return argv



def _prepare_images_dir(images_dir: Path) -> Path:
    images_dir = Path(images_dir).absolute()
    images_dir.mkdir(parents=True, exist_ok=True)
    for stale in (SIZES_FILE, "stats-dump", DUMP_LOG):
        (images_dir / stale).unlink(missing_ok=True)
    return images_dir


async def _run_to_end(argv: Sequence[str]) -> tuple[int, str]:
    """Run CRIU to its end, even when cancelled; return its exit code and its stdout+stderr."""
    with tempfile.TemporaryFile() as out:  # a file, not a pipe: nobody has to read for CRIU to go on
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            rc = await proc.wait()
        except asyncio.CancelledError:
            await proc.wait()
            raise
        return rc, _read_all(out)


def _read_all(f: IO[bytes]) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _dump_stats(images_dir: Path) -> DumpStats | None:
    try:
        return read_dump_stats(images_dir / "stats-dump")
    except ImageError:
        return None
