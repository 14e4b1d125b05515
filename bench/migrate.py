"""Downtime of a live move (CRIU post-copy) against a naive stop-and-copy: library and `ferry migrate --live`.

    .venv/bin/python bench/migrate.py [--mib 1024] [--dirty-pct 5] [--sizes 256,1024,4096]
        [--dirty 0,5,20] [--repeat 3] [--interval 0.2] [--modes naive,live,ferry] [--json PATH] [--md PATH]
        [--data-dir DIR] [--keep]

For every size and dirty percentage, and each repeat, three identical ``memhog.py --mib M
--dirty-pct P --interval I`` processes are launched one after the other and each is moved from a
"node-1" to a "node-2" once it ran a few rounds (``--modes`` picks which of the three run):

- naive: launched the way Ferry launches (``ferry.criu.launch.launch``: PID 1 of a new PID
  namespace under the shim, output to files in a "node-1" job directory); ``criu dump -t PID -D DIR
  -o dump.log -v4`` (the tree is killed once dumped), every image file copied into the target's
  images directory, the output files copied into the target's job directory, ``criu restore -D DIR
  -d --pidfile F --inherit-fd ...`` (the shim's command line, run directly);
- live: launched the same way, moved with the library class ``ferry.criu.lazy.LiveMove``: ``criu
  dump --lazy-pages`` freezes and writes everything but the memory, those images are copied, ``criu
  lazy-pages`` starts and the shim restores with ``--lazy-pages``; the memory follows over CRIU's
  page server while the job runs on the target;
- ferry: the product end to end. One ``ferry up --nodes 2`` cluster per bench run (its data dir in
  the run directory; stopped at the end, on errors and on SIGTERM too) runs the process with ``ferry
  run --node node-1`` and moves it with ``ferry migrate -o json JOB --to node-2 --live``: a pre-copy
  checkpoint into the cluster's store while the job runs (one round), the freeze (``criu dump
  --lazy-pages``; the non-memory images go through the store), the restore on node-2 with lazy pages.
  Ferry's own report (downtime_ms, freeze_ms, restore_ms, switch_ms, degraded_ms, rounds,
  bytes_precopy, bytes_final, round_freeze_ms, bytes_lazy) is recorded next to what is measured.

Measured, not estimated: memhog runs under a small wrapper that writes ``hb <wall ns>`` to stderr
every 10 ms from a thread, and ``r <wall ns>`` whenever memhog prints a round. The downtime is the
gap in the heartbeat around a moment known to lie inside the move's blackout (live: when the frozen
source's images were written; naive: when the dump ended; ferry: the frozen source's last heartbeat,
read from node-1's own stderr file once the move is done, since the source cannot write after its
freeze: the gap runs from it to the target's first heartbeat, in node-2's stderr file, which must
start with exactly the source's file). The ferry mode also measures what the pre-copy round cost the
running job: the longest heartbeat gap between the ``ferry migrate`` call and the final freeze
(against the longest gap in the 5 s before the call, its first round on: the noise floor). The
degraded period runs from the target's restore until its last page is local (live: the lazy-pages
daemon exits; ferry: its degraded_ms, counted from the target's first heartbeat); rounds per
second come from the round stamps (the mean time between two consecutive rounds, both printed inside
the window). The modes of a repeat take turns going first (rotating at every repeat of the run).
Every moved process must continue memhog's CRC sequence exactly: the processes of a repeat start
from the same ``--seed``; each repeat has its own, so the cluster's content-addressed store cannot
already hold a process's memory from an earlier repeat (or, as one size's buffer starts like a
larger one's, from an earlier row).

The images (and the cluster's store) live in the run directory (default: the system's temp dir, a
disk here), so the naive copy reads from the page cache, its best case. Prints a Markdown report
and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from benchkit import dir_bytes, machine, median, read_bytes, run_directory, uptime

from ferry.common.ports import free_port
from ferry.criu.binary import find_criu
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.criu.lazy import LiveMove, ensure_pipe_limits
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import CriuRunner
from ferry.node.base import workload_env

ROOT = Path(__file__).resolve().parent.parent
MEMHOG = ROOT / "examples" / "memhog.py"
PY = sys.executable
FERRY = str(Path(sys.executable).parent / "ferry")
MODES = ("naive", "live", "ferry")
GOAL = 0.10
ROUNDS_BEFORE = 6  # rounds a process runs before it is moved
ROUNDS_AFTER = 4  # rounds it runs on the target once all its memory is there
WRAPPER = """\
import os, runpy, sys, threading, time
def beat():
    while True:
        os.write(2, b"hb %d\\n" % time.time_ns())
        time.sleep(0.01)
class Out:
    def __init__(self, f):
        self.f = f
    def write(self, s):
        n = self.f.write(s)
        if "\\n" in s:
            os.write(2, b"r %d\\n" % time.time_ns())
        return n
    def __getattr__(self, name):
        return getattr(self.f, name)
sys.stdout = Out(sys.stdout)
threading.Thread(target=beat, daemon=True).start()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class BenchError(Exception):
    """A step failed; the message says which and where to look."""


# ---- reading a workload's output ---------------------------------------------------------------


def round_lines(stdout: Path) -> list[bytes]:
    return [line for line in read_bytes(stdout).splitlines(keepends=True)[1:] if line.endswith(b"\n")]


def stamps(stderr: Path) -> tuple[list[float], list[float]]:
    """(heartbeat times, round times), wall clock in seconds, from the wrapper's stderr lines."""
    return stamps_of(read_bytes(stderr))


def stamps_of(data: bytes) -> tuple[list[float], list[float]]:
    beats: list[float] = []
    rounds: list[float] = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            continue  # a line being written
        kind, _, value = line.rstrip(b"\n").partition(b" ")
        if not value.isdigit():
            continue
        if kind == b"hb":
            beats.append(int(value) / 1e9)
        elif kind == b"r":
            rounds.append(int(value) / 1e9)
    return beats, rounds[1:]  # the first "r" is memhog's "ready" line


def gap_around(beats: list[float], moment: float) -> float:
    """Seconds between the last heartbeat before ``moment`` and the first one after it."""
    before = [t for t in beats if t <= moment]
    after = [t for t in beats if t > moment]
    if not before or not after:
        raise BenchError("no heartbeat on one side of the move")
    return after[0] - before[-1]


def longest_gap(beats: list[float], start: float, end: float) -> float | None:
    """The longest time between two consecutive heartbeats, both in [start, end]."""
    inside = [t for t in beats if start <= t <= end]
    return max((b - a for a, b in itertools.pairwise(inside)), default=None)


def rate(rounds: list[float], start: float, end: float) -> tuple[float | None, int]:
    """Rounds per second from consecutive rounds both printed in [start, end]; and how many gaps."""
    inside = [t for t in rounds if start <= t <= end]
    gaps = [b - a for a, b in itertools.pairwise(inside)]
    return (1 / statistics.mean(gaps) if gaps else None), len(gaps)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


async def await_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


def mem_available() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# ---- one move ----------------------------------------------------------------------------------


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

    async def naive(self, tag: str, mib: int, dirty: float) -> Sample:
        src, pid, base = await self.start(tag, mib, dirty)
        dst = JobDir(base / "node-2" / "job").create()
        src_img, dst_img = base / "node-1" / "images", base / "node-2" / "images"
        src_img.mkdir(parents=True)
        dst_img.mkdir(parents=True)
        t0 = time.time()
        await self.criu_run(
            [self.criu, "dump", "-t", str(pid), "-D", str(src_img), "-o", "dump.log", "-v4"], src_img / "dump.log"
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
        await self.after(dst, t_restored)
        self.kill(new_pid)
        beats, rounds = stamps(dst.stderr)
        before, _ = rate(rounds, t0 - 30, t0)
        after, _ = rate(rounds, t_restored, time.time())
        sample = Sample(
            kind="naive",
            mib=mib,
            dirty=dirty,
            downtime_s=gap_around(beats, t_dumped),
            parts_ms={
                "dump": (t_dumped - t0) * 1000,
                "copy": (t_copied - t_dumped) * 1000,
                "restore": (t_restored - t_copied) * 1000,
            },
            degraded_s=0.0,
            rate_before=before,
            rate_degraded=None,
            rate_after=after,
            degraded_rounds=0,
            bytes_moved_at_freeze=moved,
            bytes_lazy=None,
            rounds=round_lines(dst.stdout),
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
        job = await c.json("run", "--name", tag, "--node", "node-1", "--cwd", str(ROOT), "--", *self.argv(mib, dirty))
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


# ---- the report --------------------------------------------------------------------------------


def fmt_rate(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "n/a"


def fmt_ms(x: float | None) -> str:
    return f"{x:.0f} ms" if x is not None else "n/a"


def summarize_mode(samples: list[Sample]) -> dict[str, Any]:
    def med(key: Callable[[Sample], float | None]) -> float | None:
        xs = [v for v in (key(s) for s in samples) if v is not None]
        return median(xs) if xs else None

    def part(name: str) -> Callable[[Sample], float | None]:
        return lambda s: s.parts_ms.get(name)

    names = dict.fromkeys(k for s in samples for k in s.parts_ms)
    before, degraded = med(lambda s: s.rate_before), med(lambda s: s.rate_degraded)
    out = {
        "downtime_s": [s.downtime_s for s in samples],
        "parts_ms": {k: med(part(k)) for k in names},
        "degraded_s": med(lambda s: s.degraded_s),
        "bytes_at_freeze": med(lambda s: float(s.bytes_moved_at_freeze)),
        "bytes_lazy": med(lambda s: float(s.bytes_lazy) if s.bytes_lazy is not None else None),
        "rate_before": before,
        "rate_degraded": degraded,
        "rate_after": med(lambda s: s.rate_after),
        "degraded_rounds": [s.degraded_rounds for s in samples],
        "slowdown": before / degraded if before and degraded else (float("inf") if before else None),
        "reported_downtime_ms": [s.ferry_downtime_ms for s in samples],
        # how far the downtime a mode reports itself is from the heartbeat's
        "reported_vs_heartbeat_ms": [
            abs(s.ferry_downtime_ms - s.downtime_s * 1000) for s in samples if s.ferry_downtime_ms is not None
        ],
    }
    if samples[0].kind == "ferry":
        out |= {
            "precopy_gap_s": med(lambda s: s.precopy_gap_s),
            "baseline_gap_s": med(lambda s: s.baseline_gap_s),
            "precopy_rounds": [(s.reported or {}).get("rounds") for s in samples],
            "bytes_precopy": med(lambda s: number(s.reported or {}, "bytes_precopy")),
        }
    return out


def summarize(repeats: list[dict[str, Sample]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        samples = [r[mode] for r in repeats if mode in r]
        if samples:
            out[mode] = summarize_mode(samples)
    for mode in ("live", "ferry"):
        ratios = [r[mode].downtime_s / r["naive"].downtime_s for r in repeats if mode in r and "naive" in r]
        if ratios:
            out[f"{mode}_ratios"] = ratios
            out[f"{mode}_ratio_median"] = median(ratios)
    return out


def downtimes(s: dict[str, Any] | None, unit: str) -> str:
    if s is None:
        return "n/a"
    xs = s["downtime_s"]
    if unit == "s":
        return f"{median(xs):.2f} s [{', '.join(f'{x:.2f}' for x in xs)}]"
    return f"{median(xs) * 1000:.0f} ms [{', '.join(f'{x * 1000:.0f}' for x in xs)}]"


def rates(s: dict[str, Any]) -> str:
    slowdown = s["slowdown"]
    slow = "n/a" if slowdown is None else "stalled" if slowdown == float("inf") else f"{slowdown:.1f}x"
    return f"{fmt_rate(s['rate_before'])} -> {fmt_rate(s['rate_degraded'])} -> {fmt_rate(s['rate_after'])} ({slow})"


def verdict(ratio: float | None) -> str:
    return "n/a" if ratio is None else "yes" if ratio <= GOAL else "**no**"


def library_table(result: dict[str, Any]) -> list[str]:
    """naive against the library's LiveMove, in detail."""
    lines = [
        "| MiB | dirty % | naive downtime (dump + copy + restore) | live downtime | live / naive | goal <= 0.1x "
        "| live split: freeze / final delta / restore | frozen -> target runs (Ferry) | degraded (until last page "
        "local) | lazily moved | rounds/s before -> degraded -> after (slowdown) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        s = row["summary"]
        n, lv = s["naive"], s["live"]
        lp, np_ = lv["parts_ms"], n["parts_ms"]
        lines.append(
            f"| {row['mib']} | {row['dirty']:g} | {downtimes(n, 's')} "
            f"({np_['dump'] / 1000:.2f} + {np_['copy'] / 1000:.2f} + {np_['restore'] / 1000:.2f} s) "
            f"| {downtimes(lv, 'ms')} | {s['live_ratio_median']:.3f}x | {verdict(s['live_ratio_median'])} "
            f"| {lp['freeze']:.0f} ms (criu dump {lp['dump']:.0f}) / {lp['copy']:.0f} ms, "
            f"{lv['bytes_at_freeze'] / 2**20:.1f} MiB / {lp['restore']:.0f} ms "
            f"| {lp['switch']:.0f} ms | {lv['degraded_s']:.2f} s "
            f"| {(lv['bytes_lazy'] or 0) / 2**20:.0f} MiB | {rates(lv)} |"
        )
    lazy_starts = ", ".join(f"{row['summary']['live']['parts_ms']['lazy_start']:.0f}" for row in result["rows"])
    worst = max((x for row in result["rows"] for x in row["summary"]["live"]["reported_vs_heartbeat_ms"]), default=None)
    return [
        *lines,
        "",
        "- downtime: the gap in the workload's own 10 ms heartbeat (written from a thread; wall clock) around the "
        "move. Ferry's `LiveMoveResult.downtime_ms` (from the output files: the frozen source's last mtime to the "
        f"target's first write, seen by inotify) differed from it by at most {fmt_ms(worst)}.",
        "- live split: freeze = CRIU's log, tree seized until the non-memory images are written (criu dump = from "
        "starting the process, its start-up included, while the source still runs); final delta = copying those "
        "images (the pages CRIU cannot serve lazily included) to the target; restore = `criu lazy-pages` start "
        f"({lazy_starts} ms) + "
        "the shim's `criu restore --lazy-pages -d`. frozen -> target runs: Ferry's clock and CRIU's log.",
        "- degraded: from the restored target running until the lazy-pages daemon exits (every page local); "
        "rounds/s: memhog rounds (each sleeps --interval, rewrites dirty-pct % of the buffer, then CRCs all of "
        "it, so every round reads every page); before and after: from the times between consecutive rounds; "
        "degraded: rounds finished on the target inside the window / its length (whole rounds: coarse); "
        "slowdown = before / degraded. Rounds finished inside each degraded window: "
        f"{[row['summary']['live']['degraded_rounds'] for row in result['rows']]}.",
        "- naive: raw `criu dump` (tree killed when dumped), `shutil.copyfile` of every image (from the page "
        "cache), raw `criu restore -d` with the shim's arguments.",
    ]


def ferry_table(result: dict[str, Any]) -> list[str]:
    """The three modes side by side, and `ferry migrate --live` in detail."""
    lines = [
        "| MiB | dirty % | naive downtime | library live downtime | `ferry migrate --live` downtime (Ferry's "
        "downtime_ms) | ferry / naive | goal <= 0.1x | Ferry split: freeze / handoff / restore (frozen -> target "
        "runs) "
        "| degraded (until last page local) | pre-copy round: shipped; its freeze (Ferry) / longest heartbeat gap "
        "(floor) | final delta / lazily moved | rounds/s before -> degraded -> after (slowdown) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        s = row["summary"]
        f = s.get("ferry")
        head = (
            f"| {row['mib']} | {row['dirty']:g} | {downtimes(s.get('naive'), 's')} | {downtimes(s.get('live'), 'ms')} "
        )
        if f is None:
            lines.append(head + "| n/a " * 9 + "|")
            continue
        fp = f["parts_ms"]
        ratio = s.get("ferry_ratio_median")
        reported = ", ".join(fmt_ms(x).removesuffix(" ms") for x in f["reported_downtime_ms"])
        floor = f["baseline_gap_s"]
        gaps = [r["ferry"]["precopy_gap_s"] for r in row["samples"] if r.get("ferry", {}).get("precopy_gap_s")]
        gap = f"{median(gaps) * 1000:.0f} ms [{', '.join(f'{x * 1000:.0f}' for x in gaps)}]" if gaps else "n/a"
        rounds = "/".join(dict.fromkeys(str(x) for x in f["precopy_rounds"]))
        lines.append(
            head + f"| {downtimes(f, 'ms')} ({reported}) "
            f"| {f'{ratio:.3f}x' if ratio is not None else 'n/a'} | {verdict(ratio)} "
            f"| {fmt_ms(fp.get('freeze'))} / {fmt_ms(fp.get('handoff'))} / {fmt_ms(fp.get('restore'))} "
            f"({fmt_ms(fp.get('switch'))}) "
            f"| {f['degraded_s']:.2f} s "
            f"| {rounds} round(s), {(f['bytes_precopy'] or 0) / 2**20:.0f} MiB; "
            f"{fmt_ms(fp.get('round_freeze'))} / {gap} "
            f"({fmt_ms(floor * 1000 if floor is not None else None)}) "
            f"| {f['bytes_at_freeze'] / 2**20:.1f} MiB / {(f['bytes_lazy'] or 0) / 2**20:.0f} MiB | {rates(f)} |"
        )
    ferry_rows = [row for row in result["rows"] if "ferry" in row["summary"]]
    if not ferry_rows:
        return lines
    worst = max((x for row in ferry_rows for x in row["summary"]["ferry"]["reported_vs_heartbeat_ms"]), default=None)
    goal = next((row["summary"] for row in ferry_rows if row["mib"] == 1024 and row["dirty"] == 5), None)
    if goal is None or goal.get("ferry_ratio_median") is None:
        goal_line = "not measured in this run (no 1024 MiB, 5 % row with both naive and ferry)"
    else:
        ratio = goal["ferry_ratio_median"]
        goal_line = (
            f"{'met' if ratio <= GOAL else '**not met**'}: {ratio:.3f}x (median of "
            f"{', '.join(f'{x:.3f}' for x in goal['ferry_ratios'])}), {median(goal['ferry']['downtime_s']) * 1000:.0f}"
            f" ms against {median(goal['naive']['downtime_s']):.2f} s"
        )
    return [
        *lines,
        "",
        f"- Goal (the issue): `ferry migrate --live` downtime <= {GOAL:g}x naive at 1024 MiB, 5 % dirty: {goal_line}.",
        "- ferry downtime: the same heartbeat, in the job's stderr file on node-2 (it starts with a copy of "
        "node-1's file, checked byte for byte), from the frozen source's last heartbeat (the last line of its "
        "stderr file on node-1, which it cannot write after its freeze) to the target's first. In brackets, "
        "Ferry's own `downtime_ms` (the source's last write to the target's first, from the nodes' reports); it "
        f"differed from the heartbeat by at most {fmt_ms(worst)}. ferry / naive: per repeat, then the median.",
        "- Ferry split, from `ferry migrate -o json`: freeze = `freeze_ms` (CRIU's log: tree seized until the "
        "non-memory images are written); restore = `restore_ms` (node-2, from its restore command until the "
        "target runs: those images fetched from the store, `criu lazy-pages` and `criu restore --lazy-pages`); "
        "frozen -> target runs = `switch_ms` (from the start of the freeze); handoff = the rest of it: the "
        "non-memory images uploaded into the store, the nodes' reports and the scheduler's commands. degraded = "
        "`degraded_ms` (target running until every page is local).",
        "- pre-copy round: `rounds`, `bytes_precopy` shipped into the store while the job ran, and what its "
        "checkpoint's freeze cost the running job: `round_freeze_ms` (Ferry) / the longest heartbeat gap between "
        "the `ferry migrate` call and the final freeze (floor: the longest gap in the 5 s before the call, from its "
        "first round on, start-up excluded). final "
        "delta = `bytes_final` (the non-memory images at the freeze); lazily moved = `bytes_lazy`.",
        "- rounds/s as above; degraded: rounds finished on node-2 between its first heartbeat and `degraded_ms` "
        "later. Rounds finished inside each degraded window: "
        f"{[row['summary']['ferry']['degraded_rounds'] for row in ferry_rows]}.",
        "- cluster: one `ferry up --nodes 2` for the whole run (data dir and store in the run directory); the job "
        "started with `ferry run --node node-1`, ended with `ferry kill` after the measurement. Each repeat's "
        "processes get their own memhog `--seed`, so the store's deduplication never finds a process's memory "
        "from an earlier repeat.",
    ]


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    modes = cfg["modes"]
    lines = [
        f"memhog.py --interval {cfg['interval']:g} under a heartbeat wrapper; modes {', '.join(modes)}; median of "
        f"{cfg['repeat']} per row (samples in brackets); the modes take turns going first.",
        "",
    ]
    both = "naive" in modes and "live" in modes
    if both:
        lines += ["Naive stop-and-copy against the library's live move (`ferry.criu.lazy.LiveMove`):", ""]
        lines += [*library_table(result), ""]
    if "ferry" in modes or not both:
        lines += ["The product: `ferry migrate --live` through the CLI against a `ferry up` cluster:", ""]
        lines += [*ferry_table(result), ""]
    if len(modes) > 1:
        lines += ["CRC sequences of the moved processes of every repeat were checked identical.", ""]
    lines += [
        "Machine:",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores; RAM {m['memory_gib']} GiB; kernel {m['kernel']}; {m['criu']}; "
        f"Python {m['python']}; fs.pipe-max-size {m['pipe_max_size']}",
        f"- run dir {m['data_dir']}: `{m['disk']}`",
        f"- load before: `{result['load_before']}`; after: `{result['load_after']}`; run took "
        f"{result['elapsed_s']:.0f} s",
    ]
    if result.get("skipped"):
        lines.append(f"- skipped: {'; '.join(result['skipped'])}")
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=1024, help="memhog size in MiB (default 1024)")
    p.add_argument("--dirty-pct", type=float, default=5.0, help="memhog's --dirty-pct (default 5)")
    p.add_argument("--sizes", help="several sizes in MiB, comma-separated (overrides --mib), e.g. 256,1024,4096")
    p.add_argument("--dirty", help="several dirty percentages, comma-separated (overrides --dirty-pct), e.g. 0,5,20")
    p.add_argument("--repeat", type=int, default=3, help="repeats per size and dirty percentage (default 3)")
    p.add_argument(
        "--interval",
        type=float,
        default=0.2,
        help="memhog's --interval in s (default 0.2: several rounds fall into a degraded period)",
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help="which moves, comma-separated (default naive,live,ferry; ferry starts a `ferry up` cluster)",
    )
    p.add_argument("--json", help="also write every sample to this JSON file")
    p.add_argument("--md", help="also write the Markdown report to this file")
    p.add_argument("--data-dir", help="where the run directory goes (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    args = p.parse_args(argv)
    args.size_list = [int(x) for x in args.sizes.split(",")] if args.sizes else [args.mib]
    args.dirty_list = [float(x) for x in args.dirty.split(",")] if args.dirty else [args.dirty_pct]
    wanted = [x.strip() for x in args.modes.split(",") if x.strip()]
    if not wanted or any(x not in MODES for x in wanted):
        p.error(f"--modes: a comma-separated subset of {','.join(MODES)}")
    args.mode_list = [x for x in MODES if x in wanted]
    if min(args.size_list) < 1 or args.repeat < 1 or not all(0 <= d <= 100 for d in args.dirty_list):
        p.error("need sizes >= 1 MiB, --repeat >= 1 and dirty percentages in 0..100")
    return args


def on_term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def progress(mode: str, sample: Sample) -> str:
    own = f" (its own: {sample.ferry_downtime_ms:.0f} ms)" if sample.ferry_downtime_ms is not None else ""
    text = f"{mode} {sample.downtime_s * 1000:.0f} ms{own}"
    if mode != "naive":
        text += f", degraded {sample.degraded_s:.2f} s"
    if sample.precopy_gap_s is not None:
        text += f", pre-copy gap {sample.precopy_gap_s * 1000:.0f} ms"
    return text


async def run(args: argparse.Namespace, bench: Bench) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for mib in args.size_list:
        for dirty in args.dirty_list:
            # A live move holds the frozen source and the target at once; keep room for both.
            if mem_available() < 2.5 * mib * 2**20:
                skipped.append(f"{mib} MiB at {dirty:g}% (MemAvailable {mem_available() / 2**30:.1f} GiB)")
                continue
            repeats = []
            for i in range(args.repeat):
                print(f"{mib} MiB, {dirty:g}% dirty, repeat {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                samples = await bench.repeat(i, mib, dirty)
                repeats.append(samples)
                print(
                    "  downtime " + "; ".join(progress(mode, s) for mode, s in samples.items()),
                    file=sys.stderr,
                    flush=True,
                )
            rows.append(
                {
                    "mib": mib,
                    "dirty": dirty,
                    "samples": [{mode: s.to_json() for mode, s in r.items()} for r in repeats],
                    "summary": summarize(repeats),
                }
            )
    return rows, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, on_term)
    if find_criu() is None:
        print("criu not found: run ./setup.sh", file=sys.stderr)
        return 1
    problem = ensure_pipe_limits()
    if problem is not None:
        print(f"post-copy cannot run here: {problem}", file=sys.stderr)
        return 1
    if "ferry" in args.mode_list and not Path(FERRY).exists():
        print(f"{FERRY} is missing: install the project into this virtualenv (./setup.sh)", file=sys.stderr)
        return 1
    started = time.monotonic()
    load_before = uptime()
    with run_directory(args.data_dir, args.keep, "ferry-migrate-") as run_dir:
        bench = Bench(args, run_dir)
        try:
            if "ferry" in args.mode_list:
                bench.cluster = Cluster(run_dir / "cluster")
                bench.cluster.start()
            rows, skipped = asyncio.run(run(args, bench))
        finally:
            # a second SIGTERM or Ctrl-C must not cut the cleanup short
            previous = signal.signal(signal.SIGTERM, signal.SIG_IGN), signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                bench.cleanup()
            finally:
                signal.signal(signal.SIGTERM, previous[0])
                signal.signal(signal.SIGINT, previous[1])
        mach = machine(run_dir)
    if not rows:
        print(f"nothing measured: {'; '.join(skipped)}", file=sys.stderr)
        return 1
    result = {
        "config": {
            "sizes": args.size_list,
            "dirty": args.dirty_list,
            "repeat": args.repeat,
            "interval": args.interval,
            "modes": args.mode_list,
        },
        "machine": mach,
        "load_before": load_before,
        "load_after": uptime(),
        "elapsed_s": time.monotonic() - started,
        "rows": rows,
        "skipped": skipped,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    report = markdown(result)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
