"""Downtime of a live move (CRIU post-copy, ``ferry.criu.lazy``) against a naive stop-and-copy.

    .venv/bin/python bench/migrate.py [--mib 1024] [--dirty-pct 5] [--sizes 256,1024,4096]
        [--dirty 0,5,20] [--repeat 3] [--interval 0.2] [--json PATH] [--md PATH] [--data-dir DIR] [--keep]

For every size and dirty percentage, and each repeat, two identical ``memhog.py --mib M
--dirty-pct P --interval I`` processes are launched one after the other the way Ferry launches
(``ferry.criu.launch.launch``: PID 1 of a new PID namespace under the shim, output to files in a
"node-1" job directory), and each is moved to a "node-2" directory once it ran a few rounds:

- naive: ``criu dump -t PID -D DIR -o dump.log -v4`` (the tree is killed once dumped), every image
  file copied into the target's images directory, the output files copied into the target's job
  directory, ``criu restore -D DIR -d --pidfile F --inherit-fd ...`` (the shim's command line, run
  directly);
- live: ``ferry.criu.lazy.LiveMove``: ``criu dump --lazy-pages`` freezes and writes everything but
  the memory, those images are copied, ``criu lazy-pages`` starts and the shim restores with
  ``--lazy-pages``; the memory follows over CRIU's page server while the job runs on the target.

Measured, not estimated: memhog runs under a small wrapper that writes ``hb <wall ns>`` to stderr
every 10 ms from a thread, and ``r <wall ns>`` whenever memhog prints a round. The downtime is the
gap in the heartbeat around a moment known to lie inside the move's blackout (live: when the frozen
source's images were written; naive: when the dump ended); the degraded period runs from the
target's restore until its last page is local (the lazy-pages daemon exits); rounds per second
come from the round stamps (the mean time between two consecutive rounds, both printed inside the
window). The naive and the live process of a repeat take turns going first. Every moved process
must continue memhog's CRC sequence exactly (both start from the same seed).

The images live in the run directory (default: the system's temp dir, a disk here), so the naive
copy reads from the page cache, its best case. Prints a Markdown table and the machine.
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
    beats: list[float] = []
    rounds: list[float] = []
    for line in read_bytes(stderr).splitlines():
        kind, _, value = line.partition(b" ")
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
    rounds: list[bytes] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "rounds"}
        d["rounds_seen"] = len(self.rounds)
        return d


class Bench:
    def __init__(self, args: argparse.Namespace, run_dir: Path) -> None:
        self.args = args
        self.run_dir = run_dir
        self.criu = find_criu() or "criu"
        self.pids: set[int] = set()

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
        for pid in list(self.pids):
            with contextlib.suppress(ProcessLookupError, BenchError):
                self.kill(pid)

    async def pair(self, i: int, mib: int, dirty: float) -> tuple[Sample, Sample]:
        tag = f"{mib}m-{dirty:g}d-{i}"
        if i % 2 == 0:
            naive = await self.naive(tag + "-naive", mib, dirty)
            live = await self.live(tag + "-live", mib, dirty)
        else:
            live = await self.live(tag + "-live", mib, dirty)
            naive = await self.naive(tag + "-naive", mib, dirty)
        common = min(len(naive.rounds), len(live.rounds))
        if naive.rounds[:common] != live.rounds[:common]:
            raise BenchError(f"{tag}: the moved processes' CRC sequences differ")
        return naive, live


# ---- the report --------------------------------------------------------------------------------


def fmt_rate(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "n/a"


def summarize(pairs: list[tuple[Sample, Sample]]) -> dict[str, Any]:
    naive = [p[0] for p in pairs]
    live = [p[1] for p in pairs]

    def med(samples: list[Sample], key: Callable[[Sample], float | None]) -> float | None:
        xs = [v for v in (key(s) for s in samples) if v is not None]
        return median(xs) if xs else None

    def part(samples: list[Sample], name: str) -> float | None:
        return med(samples, lambda s: s.parts_ms.get(name))

    parts = {k: part(live, k) for k in live[0].parts_ms}
    nparts = {k: part(naive, k) for k in naive[0].parts_ms}
    before = med(live, lambda s: s.rate_before)
    degraded = med(live, lambda s: s.rate_degraded)
    ratios = [lv.downtime_s / nv.downtime_s for nv, lv in pairs]
    return {
        "naive_downtime_s": [s.downtime_s for s in naive],
        "live_downtime_s": [s.downtime_s for s in live],
        "ratio_median": median(ratios),
        "ratios": ratios,
        "live_parts_ms": parts,
        "naive_parts_ms": nparts,
        "degraded_s": med(live, lambda s: s.degraded_s),
        "bytes_at_freeze_live": med(live, lambda s: float(s.bytes_moved_at_freeze)),
        "bytes_at_freeze_naive": med(naive, lambda s: float(s.bytes_moved_at_freeze)),
        "bytes_lazy": med(live, lambda s: float(s.bytes_lazy) if s.bytes_lazy is not None else None),
        "rate_before": before,
        "rate_degraded": degraded,
        "rate_after": med(live, lambda s: s.rate_after),
        "degraded_rounds": [s.degraded_rounds for s in live],
        "slowdown": before / degraded if before and degraded else (float("inf") if before else None),
        "ferry_vs_heartbeat_ms": [abs((s.ferry_downtime_ms or float("nan")) - s.downtime_s * 1000) for s in live],
    }


def markdown(result: dict[str, Any]) -> str:
    cfg, m = result["config"], result["machine"]
    lines = [
        f"memhog.py --interval {cfg['interval']:g} under a heartbeat wrapper; median of {cfg['repeat']} per row "
        "(samples in brackets); naive and live take turns going first.",
        "",
        "| MiB | dirty % | naive downtime (dump + copy + restore) | live downtime | live / naive | goal <= 0.1x "
        "| live split: freeze / final delta / restore | frozen -> target runs (Ferry) | degraded (until last page "
        "local) | lazily moved | rounds/s before -> degraded -> after (slowdown) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        s = row["summary"]
        lp, np_ = s["live_parts_ms"], s["naive_parts_ms"]
        nd, ld = s["naive_downtime_s"], s["live_downtime_s"]
        slowdown = s["slowdown"]
        slow = "n/a" if slowdown is None else "stalled" if slowdown == float("inf") else f"{slowdown:.1f}x"
        lines.append(
            f"| {row['mib']} | {row['dirty']:g} | {median(nd):.2f} s [{', '.join(f'{x:.2f}' for x in nd)}] "
            f"({np_['dump'] / 1000:.2f} + {np_['copy'] / 1000:.2f} + {np_['restore'] / 1000:.2f} s) "
            f"| {median(ld) * 1000:.0f} ms [{', '.join(f'{x * 1000:.0f}' for x in ld)}] "
            f"| {s['ratio_median']:.3f}x | {'yes' if s['ratio_median'] <= GOAL else '**no**'} "
            f"| {lp['freeze']:.0f} ms (criu dump {lp['dump']:.0f}) / {lp['copy']:.0f} ms, "
            f"{s['bytes_at_freeze_live'] / 2**20:.1f} MiB / {lp['restore']:.0f} ms "
            f"| {lp['switch']:.0f} ms | {s['degraded_s']:.2f} s "
            f"| {(s['bytes_lazy'] or 0) / 2**20:.0f} MiB "
            f"| {fmt_rate(s['rate_before'])} -> {fmt_rate(s['rate_degraded'])} -> {fmt_rate(s['rate_after'])} "
            f"({slow}) |"
        )
    lazy_starts = ", ".join(f"{row['summary']['live_parts_ms']['lazy_start']:.0f}" for row in result["rows"])
    worst = max((x for row in result["rows"] for x in row["summary"]["ferry_vs_heartbeat_ms"]), default=float("nan"))
    lines += [
        "",
        "- downtime: the gap in the workload's own 10 ms heartbeat (written from a thread; wall clock) around the "
        "move. Ferry's `LiveMoveResult.downtime_ms` (from the output files: the frozen source's last mtime to the "
        f"target's first write, seen by inotify) differed from it by at most {worst:.0f} ms.",
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
        f"{[row['summary']['degraded_rounds'] for row in result['rows']]}.",
        "- naive: raw `criu dump` (tree killed when dumped), `shutil.copyfile` of every image (from the page "
        "cache), raw `criu restore -d` with the shim's arguments. CRC sequences of both moved processes were "
        "checked identical.",
        "",
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
    p.add_argument("--repeat", type=int, default=3, help="pairs per size and dirty percentage (default 3)")
    p.add_argument(
        "--interval",
        type=float,
        default=0.2,
        help="memhog's --interval in s (default 0.2: several rounds fall into a degraded period)",
    )
    p.add_argument("--json", help="also write every sample to this JSON file")
    p.add_argument("--md", help="also write the Markdown report to this file")
    p.add_argument("--data-dir", help="where the run directory goes (default: the system's temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    args = p.parse_args(argv)
    args.size_list = [int(x) for x in args.sizes.split(",")] if args.sizes else [args.mib]
    args.dirty_list = [float(x) for x in args.dirty.split(",")] if args.dirty else [args.dirty_pct]
    if min(args.size_list) < 1 or args.repeat < 1 or not all(0 <= d <= 100 for d in args.dirty_list):
        p.error("need sizes >= 1 MiB, --repeat >= 1 and dirty percentages in 0..100")
    return args


def on_term(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


async def run(args: argparse.Namespace, bench: Bench) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for mib in args.size_list:
        for dirty in args.dirty_list:
            # The live move holds the frozen source and the target at once; keep room for both.
            if mem_available() < 2.5 * mib * 2**20:
                skipped.append(f"{mib} MiB at {dirty:g}% (MemAvailable {mem_available() / 2**30:.1f} GiB)")
                continue
            pairs = []
            for i in range(args.repeat):
                print(f"{mib} MiB, {dirty:g}% dirty, pair {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
                naive, live = await bench.pair(i, mib, dirty)
                pairs.append((naive, live))
                print(
                    f"  downtime naive {naive.downtime_s:.2f} s, live {live.downtime_s * 1000:.0f} ms "
                    f"(Ferry: {live.ferry_downtime_ms or float('nan'):.0f} ms); degraded {live.degraded_s:.2f} s; "
                    f"rounds/s {fmt_rate(live.rate_before)} -> {fmt_rate(live.rate_degraded)}",
                    file=sys.stderr,
                    flush=True,
                )
            rows.append(
                {
                    "mib": mib,
                    "dirty": dirty,
                    "samples": [[n.to_json(), lv.to_json()] for n, lv in pairs],
                    "summary": summarize(pairs),
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
    started = time.monotonic()
    load_before = uptime()
    with run_directory(args.data_dir, args.keep, "ferry-migrate-") as run_dir:
        bench = Bench(args, run_dir)
        try:
            rows, skipped = asyncio.run(run(args, bench))
        finally:
            bench.cleanup()
        mach = machine(run_dir)
    if not rows:
        print(f"nothing measured: {'; '.join(skipped)}", file=sys.stderr)
        return 1
    result = {
        "config": {"sizes": args.size_list, "dirty": args.dirty_list, "repeat": args.repeat, "interval": args.interval},
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
