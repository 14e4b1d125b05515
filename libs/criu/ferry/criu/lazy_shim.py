"""The shim's restore with extra ``criu restore`` arguments, started ahead of time for a live move.

    python -m ferry.criu.lazy_shim restore --job-dir D --incarnation K --images IMGDIR \
        --inherit FILE_IN_D=ORIGINAL_ABS_PATH ... [--criu BIN] [--criu-arg ARG ...] [--armed]

Everything but the two options is ``ferry.criu.shim``'s restore, unchanged: the same validation,
the same detached subreaper monitor, the same ``shim.json``/``exit.json`` and starter reply. The
shim builds CRIU's command line with ``CriuRunner.restore_command``; in this process only, its
module sees a ``CriuRunner`` whose ``restore_command`` appends the ``--criu-arg`` values
(``--lazy-pages`` for post-copy).

``--armed``: print ``armed`` once Python and the shim are loaded, then wait for a ``go`` line on
stdin before doing anything (any other line, or EOF, exits 1 having done nothing). Starting Python
and importing the shim takes about 0.2 s on a small machine: a live move pays it before the freeze
instead of during its downtime. ``ArmedRestore`` is the async caller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ferry.criu import shim
from ferry.criu.binary import find_criu, setup_hint
from ferry.criu.errors import CriuMissing, RestoreFailed
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import DEFAULT_TIMEOUT_S
from ferry.criu.runner import RESTORE_LOG, CriuRunner

__all__ = ["ArmedRestore", "main"]

ARMED = b"armed"
GO = b"go"


class _StarterReply(BaseModel):
    pid: int
    shim_pid: int


class ArmedRestore:
    """A restore starter, loaded and waiting: ``arm()`` it early, ``go()`` when the images are there.

    ``inherit`` as for ``ferry.criu.launch.restore`` (the files in ``job_dir`` must exist at
    ``go()``). ``cancel()`` ends an armed starter that will not go.
    """

    def __init__(
        self,
        job_dir: JobDir,
        images_dir: Path,
        *,
        inherit: Mapping[str, str],
        incarnation: int,
        criu_args: Sequence[str],
        criu_bin: str = "criu",
        python: str = sys.executable,
        node_netns: str | None = None,
    ) -> None:
        criu = find_criu(criu_bin)
        if criu is None:
            raise CriuMissing(f"criu binary {criu_bin!r} not found: {setup_hint()}")
        self.job_dir = job_dir
        self.images_dir = Path(images_dir).absolute()
        cmd = [python, "-m", "ferry.criu.lazy_shim", "--armed", "restore", "--job-dir", str(job_dir.path)]
        cmd += ["--incarnation", str(incarnation), "--images", str(self.images_dir), "--criu", criu]
        for local, original in inherit.items():
            cmd += ["--inherit", f"{local}={original}"]
        cmd += [f"--criu-arg={arg}" for arg in criu_args]
        if node_netns:  # a bridge-network job's veth lands on this node's bridge (ferry.criu.veth)
            cmd += ["--node-netns", node_netns]
        self.cmd = cmd
        self._proc: asyncio.subprocess.Process | None = None
        self._tail: asyncio.Future[tuple[bytes, bytes]] | None = None
        self._reported = False  # the restore reported the workload running: its monitor stays

    @property
    def log_path(self) -> str:
        return str(self.images_dir / RESTORE_LOG)

    async def arm(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Start the starter and wait until it is loaded."""
        # a session of its own: cancel() can take down the starter with the criu restore it runs
        proc = await asyncio.create_subprocess_exec(
            *self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        self._proc = proc
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(timeout_s):
                line = await proc.stdout.readline()
        except BaseException:
            await self.cancel()
            raise
        if line.strip() != ARMED:
            await self.cancel()
            raise RestoreFailed(f"the shim did not arm (it said {line[:200]!r}); see {self.job_dir.shim_log}")

    async def go(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> ShimInfo:
        """Restore now; return once the workload runs. Raises RestoreFailed with CRIU's log excerpt."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("ArmedRestore.go() before arm()")
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            async with asyncio.timeout(timeout_s):
                proc.stdin.write(GO + b"\n")
                proc.stdin.close()
                # The reply is the starter's last line: take it without waiting for its exit.
                out = await proc.stdout.readline()
                if out.endswith(b"\n"):
                    self._tail = asyncio.ensure_future(proc.communicate())  # reap() awaits it
                    err = b""
                else:
                    out += await proc.stdout.read()
                    err = await proc.stderr.read()
                    await proc.wait()
        except TimeoutError:
            await self.cancel()
            raise RestoreFailed(
                f"the shim did not report within {timeout_s:.0f} s; see {self.job_dir.shim_log}"
            ) from None
        except asyncio.CancelledError:
            await self.cancel()
            raise
        lines = err.decode(errors="replace").splitlines()
        if not out.endswith(b"\n") and proc.returncode != 0:
            first = lines[0].removeprefix("ferry-shim: ") if lines else f"the shim exited with {proc.returncode}"
            raise RestoreFailed(first, log_excerpt=lines[1:], log_path=self.log_path)
        try:
            reply = _StarterReply.model_validate_json(out.strip().splitlines()[-1])
        except (ValidationError, IndexError) as exc:
            raise RestoreFailed(f"the shim answered {out[:200]!r}; see {self.job_dir.shim_log}") from exc
        info = self.job_dir.read_shim()
        if info is None or info.pid != reply.pid or info.shim_pid != reply.shim_pid:
            raise RestoreFailed(f"the shim reported pid {reply.pid} but {self.job_dir.shim_file} says {info}")
        self._reported = True
        return info

    async def reap(self) -> None:
        """Wait for the starter's exit after a successful ``go()`` (it follows within moments)."""
        if self._tail is not None:
            await self._tail

    async def cancel(self) -> None:
        """Stop the starter: one that has not gone exits on EOF (it started nothing); one that went
        is killed with the criu restore it runs (a restore whose memory source went away can wait
        forever for a page), which takes the half-restored tree with it."""
        proc = self._proc
        if proc is None:
            return
        went = proc.stdin is None or proc.stdin.is_closing()
        if proc.returncode is None:
            if not went and proc.stdin is not None:
                proc.stdin.close()  # EOF: an armed starter exits without doing anything
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5 if went else 5.0):
                    await proc.wait()
        groups = {proc.pid} if went or proc.returncode is None else set()
        monitor = self.job_dir.read_monitor_group()
        if went and not self._reported and monitor is not None and monitor != os.getpgrp():
            groups.add(monitor)  # the monitor it forked, and the criu restore that one still runs
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        await proc.wait()


def _runner_with(extra: Sequence[str]) -> type[CriuRunner]:
    class _Runner(CriuRunner):
        def restore_command(
            self,
            images_dir: Path,
            pidfile: Path,
            inherit: Mapping[int, str],
            extra_args: Sequence[str] = (),
        ) -> list[str]:
            return super().restore_command(images_dir, pidfile, inherit, [*extra_args, *extra])

    return _Runner


def main(args: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--criu-arg", action="append", default=[])
    parser.add_argument("--armed", action="store_true")
    ns, rest = parser.parse_known_args(argv)
    if not rest or rest[0] != "restore":
        print("ferry-shim: lazy_shim only restores (expected: restore ...)", file=sys.stderr)
        return 1
    setattr(shim, "CriuRunner", _runner_with(ns.criu_arg))  # noqa: B010 (mypy refuses a plain assignment)
    if ns.armed:
        sys.stdout.buffer.write(ARMED + b"\n")
        sys.stdout.flush()
        if sys.stdin.buffer.readline().strip() != GO:
            print("ferry-shim: not told to go; nothing was started", file=sys.stderr)
            return 1
    return shim.main(rest)


if __name__ == "__main__":
    sys.exit(main())
