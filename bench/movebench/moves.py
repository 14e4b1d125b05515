"""The three ways a process is moved from node-1 to node-2, and what one move measured
(``Sample``): naive stop-and-copy with raw CRIU, the library's post-copy ``LiveMove``, and `ferry
migrate --live` on a real `ferry up` cluster (bench/migrate.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import BenchError, dir_bytes, read_bytes, wait_for

from ferry.common.ports import free_port
from ferry.criu.binary import find_criu
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.criu.lazy import LiveMove
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import DUMP_MOUNTS, CriuRunner
from ferry.node.base import workload_env
from movebench.workload import (
    FERRY,
    MEMHOG,
    PY,
    ROOT,
    ROUNDS_AFTER,
    ROUNDS_BEFORE,
    WRAPPER,
    await_for,
    gap_around,
    longest_gap,
    rate,
    round_lines,
    stamps,
    stamps_of,
)

# ---- one move ----------------------------------------------------------------------------------


@dataclass
class StopAndCopy:
    """What a naive move did (``Bench.stop_and_copy``): times are wall clock, in seconds."""

    dst: JobDir
    started: float
    dumped: float
    copied: float
    restored: float
    pid: int  # the restored tree's
    bytes_moved: int


@dataclass
class Sample:
    kind: str
    mib: int
    dirty: float
    downtime_s: float
    parts_ms: dict[str, float]
    degraded_s: float
    rate_before: float | None
    rate_degraded: float | None
    rate_after: float | None
    degraded_rounds: int
    bytes_moved_at_freeze: int
    bytes_lazy: int | None
    ferry_downtime_ms: float | None = None
    precopy_gap_s: float | None = None  # ferry: the longest heartbeat gap during the pre-copy round
    baseline_gap_s: float | None = None  # ferry: the same in the 5 s before the move (its first round on)
    reported: dict[str, Any] | None = None  # ferry: what `ferry migrate -o json` printed
    rounds: list[bytes] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "rounds"}
        d["rounds_seen"] = len(self.rounds)
        return d


def number(report: dict[str, Any], key: str) -> float | None:
    value = report.get(key)
    return float(value) if isinstance(value, int | float) else None


class Cluster:
    """A real `ferry up --nodes 2` (node-1, node-2) with its data dir in the run directory, driven
    through the real `ferry` CLI, the way tests/conftest.py does."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log = data_dir.parent / "ferry-up.log"
        self.addr = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "FERRY_ADDR": self.addr, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            # its own process group: a Ctrl-C reaches the bench, which stops the cluster last
            self.proc = subprocess.Popen(
                [FERRY, "up", "--nodes", "2", "--data-dir", str(self.data_dir), "--grpc", self.addr],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while b"ferry: ready" not in read_bytes(self.log):
            if self.proc.poll() is not None:
                raise BenchError(f"ferry up exited ({self.proc.returncode}) before it was ready: {self.tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"ferry up was not ready after {timeout:.0f}s: {self.tail()}")
            time.sleep(0.1)

    def tail(self) -> str:
        return read_bytes(self.log)[-800:].decode(errors="replace")

    def stop(self) -> None:
        """SIGTERM, as an operator stops it (it ends its services and the workloads left); SIGKILL to
        its process group if it takes more than a minute."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"ferry up did not stop within 60 s; killed: {self.tail()}", file=sys.stderr)

    def job_dir(self, node: str, job_id: str) -> JobDir:
        return JobDir(self.data_dir / "nodes" / node / "jobs" / job_id)

    async def cli(self, *args: str, timeout: float = 180) -> str:
        proc = await asyncio.create_subprocess_exec(
            FERRY,
            *args,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BenchError(f"`ferry {' '.join(args[:4])}` timed out after {timeout:.0f}s") from None
        except BaseException:  # cancelled (SIGTERM, Ctrl-C): the CLI call goes too
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise BenchError(
                f"`ferry {' '.join(args[:4])}` exited {proc.returncode}: {err.decode(errors='replace').strip()[-800:]} "
                f"(the cluster's logs: {self.data_dir / 'logs'})"
            )
        return out.decode()

    async def json(self, command: str, *args: str, timeout: float = 180) -> Any:
        # -o right after the subcommand: what follows `--` belongs to the job's command line
        return json.loads(await self.cli(command, "-o", "json", *args, timeout=timeout))


class Bench:
    def __init__(self, args: argparse.Namespace, run_dir: Path) -> None:
        self.args = args
        self.run_dir = run_dir
        self.criu = find_criu() or "criu"
        self.pids: set[int] = set()
        self.cluster: Cluster | None = None
        self.turn = 0  # which mode goes first in the next repeat
        self.seed = 0  # memhog's --seed: the same for the modes of a repeat, new at every repeat

    def argv(self, mib: int, dirty: float) -> list[str]:
        return [
            PY,
            "-c",
            WRAPPER,
            str(MEMHOG),
            "--mib",
            str(mib),
            "--dirty-pct",
            f"{dirty:g}",
            "--interval",
            f"{self.args.interval:g}",
            "--seed",
            str(self.seed),
        ]

    async def start(self, tag: str, mib: int, dirty: float) -> tuple[JobDir, int, Path]:
        base = self.run_dir / tag
        src = JobDir(base / "node-1" / "job")
        info = await launch(src, self.argv(mib, dirty), cwd=ROOT, env=workload_env({}), incarnation=1)
        self.pids.add(info.pid)
        await await_for(
            lambda: len(round_lines(src.stdout)) >= ROUNDS_BEFORE,
            120 + mib / 20,
            f"{ROUNDS_BEFORE} rounds of {tag} ({src.stdout})",
        )
        return src, info.pid, base

    async def stop_and_copy(self, pid: int, src: JobDir, base: Path) -> StopAndCopy:
        """A naive move of the tree of `pid` (its job folder `src`, on "node-1" under `base`) to
        "node-2": raw ``criu dump`` (the tree ends), every image and output file copied, raw ``criu
        restore`` there (the shim's command line)."""
        dst = JobDir(base / "node-2" / "job").create()
        src_img, dst_img = base / "node-1" / "images", base / "node-2" / "images"
        src_img.mkdir(parents=True)
        dst_img.mkdir(parents=True)
        t0 = time.time()
        await self.criu_run(
            # the job has its own mount namespace, as Ferry runs it: its host's mounts are external
            [self.criu, "dump", "-t", str(pid), "-D", str(src_img), "-o", "dump.log", "-v4", *DUMP_MOUNTS],
            src_img / "dump.log",
        )
        t_dumped = time.time()
        await await_for(lambda: is_gone(pid), 30, f"the dumped pid {pid} to end")
        self.pids.discard(pid)

        def copy() -> int:
            for f in src_img.iterdir():
                if f.name != "dump.log":
                    shutil.copyfile(f, dst_img / f.name)
            for name in ("stdout", "stderr"):
                shutil.copyfile(src.path / name, dst.path / name)
            return dir_bytes(dst_img)

        moved = await asyncio.to_thread(copy)
        t_copied = time.time()
        fds: dict[int, str] = {}
        pidfile = dst.path / "restore.pid"
        try:
            for name, original in (("stdout", src.stdout), ("stderr", src.stderr)):
                fds[os.open(dst.path / name, os.O_WRONLY | os.O_APPEND)] = str(original)
            argv = CriuRunner(self.criu).restore_command(dst_img, pidfile, fds)
            await self.criu_run(argv, dst_img / "restore.log", pass_fds=list(fds))
        finally:
            for fd in fds:
                os.close(fd)
        t_restored = time.time()
        new_pid = int(pidfile.read_text().strip())
        self.pids.add(new_pid)
        nspid = ns_pids(new_pid)
        if len(nspid) != 2 or nspid[-1] != 1:
            raise BenchError(f"naive restore: pid {new_pid} is not PID 1 of a new PID namespace ({nspid})")
        shutil.rmtree(src_img, ignore_errors=True)
        return StopAndCopy(dst, t0, t_dumped, t_copied, t_restored, new_pid, moved)

    async def naive(self, tag: str, mib: int, dirty: float) -> Sample:
        src, pid, base = await self.start(tag, mib, dirty)
        m = await self.stop_and_copy(pid, src, base)
        await self.after(m.dst, m.restored)
        self.kill(m.pid)
        beats, rounds = stamps(m.dst.stderr)
        before, _ = rate(rounds, m.started - 30, m.started)
        after, _ = rate(rounds, m.restored, time.time())
        sample = Sample(
            kind="naive",
            mib=mib,
            dirty=dirty,
            downtime_s=gap_around(beats, m.dumped),
            parts_ms={
                "dump": (m.dumped - m.started) * 1000,
                "copy": (m.copied - m.dumped) * 1000,
                "restore": (m.restored - m.copied) * 1000,
            },
            degraded_s=0.0,
            rate_before=before,
            rate_degraded=None,
            rate_after=after,
            degraded_rounds=0,
            bytes_moved_at_freeze=m.bytes_moved,
            bytes_lazy=None,
            rounds=round_lines(m.dst.stdout),
        )
        shutil.rmtree(base, ignore_errors=True)
        return sample

    async def live(self, tag: str, mib: int, dirty: float) -> Sample:
        src, pid, base = await self.start(tag, mib, dirty)
        dst = JobDir(base / "node-2" / "job")
        move = LiveMove(
            src,
            pid,
            dst,
            source_images=base / "node-1" / "images",
            target_images=base / "node-2" / "images",
            incarnation=2,
            criu_bin=self.criu,
        )
        shim = await move.switch()
        self.pids.add(shim.pid)
        result = await move.complete(timeout_s=600)
        self.pids.discard(pid)
        await self.after(dst, result.pages_local_at)
        self.kill(shim.pid)
        beats, rounds = stamps(dst.stderr)
        images_written = result.started_at + result.dump_ms / 1000  # the source is frozen then
        before, _ = rate(rounds, result.started_at - 30, result.frozen_at)
        # Rounds finished on the target while its pages were still coming, per second of that window.
        done = len([t for t in rounds if result.running_at < t <= result.pages_local_at])
        degraded = done / (result.degraded_ms / 1000) if result.degraded_ms > 0 else None
        after, _ = rate(rounds, result.pages_local_at, time.time())
        sample = Sample(
            kind="live",
            mib=mib,
            dirty=dirty,
            downtime_s=gap_around(beats, images_written),
            parts_ms={
                "dump": result.dump_ms,
                "freeze": result.freeze_ms,
                "copy": result.copy_ms,
                "restore": result.restore_ms,
                "lazy_start": result.lazy_start_ms,
                "switch": result.switch_ms,
                "total": result.total_ms,
            },
            degraded_s=result.degraded_ms / 1000,
            rate_before=before,
            rate_degraded=degraded,
            rate_after=after,
            degraded_rounds=done,
            bytes_moved_at_freeze=result.bytes_final,
            bytes_lazy=result.bytes_lazy,
            ferry_downtime_ms=result.downtime_ms,
            rounds=round_lines(dst.stdout),
        )
        shutil.rmtree(base, ignore_errors=True)
        return sample

    async def ferry(self, tag: str, mib: int, dirty: float) -> Sample:
        c = self.cluster
        assert c is not None
        job = await c.json("run", "--name", tag, "--node", "node-1", "--cwd", str(ROOT), "--network", "host", "--",
                           *self.argv(mib, dirty))
        if job.get("state") != "running" or job.get("node") != "node-1":
            raise BenchError(f"ferry run {tag}: {job.get('state')} on {job.get('node')}: {job.get('reason')}")
        src, dst = c.job_dir("node-1", job["id"]), c.job_dir("node-2", job["id"])
        shim = src.read_shim()
        if shim is not None:
            self.pids.add(shim.pid)
        await await_for(
            lambda: len(round_lines(src.stdout)) >= ROUNDS_BEFORE,
            120 + mib / 20,
            f"{ROUNDS_BEFORE} rounds of {tag} ({src.stdout})",
        )
        t0 = time.time()
        report = await c.json("migrate", tag, "--to", "node-2", "--live", timeout=900)
        t_done = time.time()  # the command returns once every page is on the target
        if shim is not None:  # every page is on the target: the frozen source is ended (one copy, never two)
            await await_for(lambda: is_gone(shim.pid), 30, f"the source of {tag} (pid {shim.pid}) to end")
            self.pids.discard(shim.pid)
        if report.get("mode") != "postcopy" or report.get("to") != "node-2":
            raise BenchError(f"ferry migrate {tag} --live did not move it by post-copy: {report}")
        moved = dst.read_shim()
        if moved is None:
            raise BenchError(f"no shim.json in {dst.path} after the move")
        self.pids.add(moved.pid)
        # The frozen source cannot write any more: its stderr file ends with its last heartbeat
        # before the blackout, and the target's file must start with exactly that file.
        frozen = read_bytes(src.stderr)
        frozen = frozen[: frozen.rfind(b"\n") + 1]
        if not read_bytes(dst.stderr).startswith(frozen):
            raise BenchError(f"{dst.stderr} does not continue {src.stderr}")
        src_beats, src_rounds = stamps_of(frozen)
        if not src_beats or src_beats[-1] < t0:
            raise BenchError(f"no heartbeat from {tag} on node-1 during the move ({src.stderr})")
        last = src_beats[-1]
        await self.after(dst, t_done)
        await c.cli("kill", tag, "--grace", "1s")
        await await_for(lambda: is_gone(moved.pid), 60, f"{tag} (pid {moved.pid}) to end after ferry kill")
        self.pids.discard(moved.pid)
        beats, rounds = stamps(dst.stderr)
        downtime = gap_around(beats, last)
        running = next(t for t in beats if t > last)  # the target's first heartbeat
        degraded_ms = number(report, "degraded_ms")
        degraded_s = degraded_ms / 1000 if degraded_ms is not None else 0.0
        done = len([t for t in rounds if running < t <= running + degraded_s])
        before, _ = rate(rounds, t0 - 30, t0)
        after, _ = rate(rounds, t_done, time.time())
        parts = {k: number(report, k) for k in ("freeze_ms", "switch_ms", "restore_ms", "total_ms")}
        round_freeze = report.get("round_freeze_ms") or []
        parts["round_freeze_ms"] = float(sum(round_freeze)) if round_freeze else None
        freeze, switch, restore = parts["freeze_ms"], parts["switch_ms"], parts["restore_ms"]
        if freeze is not None and switch is not None and restore is not None:
            parts["handoff_ms"] = switch - freeze - restore  # switch_ms runs from the start of the freeze
        return Sample(
            kind="ferry",
            mib=mib,
            dirty=dirty,
            downtime_s=downtime,
            parts_ms={k.removesuffix("_ms"): v for k, v in parts.items() if v is not None},
            degraded_s=degraded_s,
            rate_before=before,
            rate_degraded=done / degraded_s if degraded_s > 0 else None,
            rate_after=after,
            degraded_rounds=done,
            bytes_moved_at_freeze=int(report.get("bytes_final") or 0),
            bytes_lazy=report.get("bytes_lazy"),
            ferry_downtime_ms=number(report, "downtime_ms"),
            precopy_gap_s=longest_gap(src_beats, t0, last),
            baseline_gap_s=longest_gap(src_beats, max([t0 - 5, *src_rounds[:1]]), t0),  # not its start-up
            reported=report,
            rounds=round_lines(dst.stdout),
        )

    async def after(self, dst: JobDir, since: float) -> None:
        """Let the moved process run ROUNDS_AFTER rounds once it is whole again."""

        def enough() -> bool:
            _, rounds = stamps(dst.stderr)
            return len([t for t in rounds if t > since]) >= ROUNDS_AFTER

        await await_for(enough, 120, f"rounds on the target ({dst.stdout})")

    async def criu_run(self, argv: list[str], log: Path, pass_fds: list[int] | None = None) -> None:
        with tempfile.TemporaryFile() as out:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=pass_fds or []
            )
            rc = await proc.wait()
            if rc != 0:
                out.seek(0)
                raise BenchError(f"{' '.join(argv[:2])} failed ({rc}); see {log}: {out.read()[-500:]!r}")

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: is_gone(pid), 30, f"pid {pid} to end")
        self.pids.discard(pid)

    def cleanup(self) -> None:
        """Ends what is left: the processes the bench started, then the cluster (which ends the
        workloads of its nodes too)."""
        for pid in list(self.pids):
            with contextlib.suppress(ProcessLookupError, BenchError):
                self.kill(pid)
        if self.cluster is not None:
            self.cluster.stop()

    async def repeat(self, i: int, mib: int, dirty: float) -> dict[str, Sample]:
        """One process moved per mode; the modes take turns going first."""
        tag = f"m{mib}-d{dirty:g}-{i}".replace(".", "p")
        modes = list(self.args.mode_list)
        first = self.turn % len(modes)
        self.turn += 1
        self.seed = self.turn  # no repeat's memory is in the store before its own pre-copy
        move = {"naive": self.naive, "live": self.live, "ferry": self.ferry}
        samples: dict[str, Sample] = {}
        for mode in modes[first:] + modes[:first]:
            samples[mode] = await move[mode](f"{tag}-{mode}", mib, dirty)
        ref = next(iter(samples.values()))
        for mode, sample in samples.items():
            common = min(len(ref.rounds), len(sample.rounds))
            if common < ROUNDS_BEFORE + ROUNDS_AFTER or ref.rounds[:common] != sample.rounds[:common]:
                raise BenchError(f"{tag}: the CRC sequence of the {mode} move differs from the {ref.kind} one")
        return {mode: samples[mode] for mode in modes}
