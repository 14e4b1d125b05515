"""What a move costs the job: seconds of progress lost against the same job unmoved, for a naive
stop-and-copy with raw CRIU, `ferry migrate` (cold) and `ferry migrate --live`, in one run.

    .venv/bin/python bench/lost.py [--workloads train,memhog] [--repeat 3] [--modes naive,cold,live,live-fresh]
                                   [--json PATH] [--md PATH] [--dir DIR] [--keep]

Workloads (each under the wrapper of bench/movebench, which stamps every line the job prints on
its stderr, wall clock in ns):

- train: ``examples/train.py --width 65536 --sleep 0``, about 1.1 GiB resident, one line per step;
- memhog: ``examples/memhog.py --mib 1024 --dirty-pct 5 --interval 0.2``, one line per round.

Each move takes the job from "node-1" to "node-2" once it printed ``BEFORE`` lines: naive as
bench/migrate.py does it (``criu dump``, copy every image, ``criu restore``, the job launched the way
Ferry launches), cold and live through the real CLI against a real ``ferry up --nodes 2``. Then it
runs until it printed ``AFTER`` more lines after the move command returned.

``live-fresh`` is the live move of a job that checkpoints periodically (``--checkpoint-every
FRESH_EVERY``) and has a checkpoint younger than that interval: the scheduler then takes no pre-copy
round (``ferry.scheduler.ops.live_move``), that checkpoint being the fallback. The checkpoint is
taken (``ferry checkpoint``) after ``FRESH_AT`` lines, and ``BEFORE`` lines are counted after it, so
its own freeze is outside the lines that measure the move.

Measured from the job's own output, not estimated: its speed unmoved is the mean period of its
last ``PERIOD_LINES`` lines before the move and of its last ``PERIOD_LINES`` lines at the end (both
sides, so that a machine a little busier or quieter after the move than before does not count as
the move's); with ``ref`` its last line before the move began and ``k`` its last line at the end,
the job unmoved would have printed line ``k`` at ``t_ref + (k - ref) x period``. What it lost is how
much later it printed it:

    lost = (t_k - t_ref) - (k - ref) x period

Ferry's own figure for the move (``lost_s`` in the move's JSON, ferry.policy.lost) is recorded
beside it. The modes take turns going first; medians of the repeats with every sample, the ratios
against the naive move of the same run, and the machine's load are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import statistics
import sys
import time
from typing import Any

from benchkit import (
    BenchError,
    add_run_arguments,
    copy_rate,
    emit,
    exit_on_sigterm,
    machine,
    machine_line,
    median,
    run_directory,
    uptime,
)
from movebench.moves import Bench, Cluster
from movebench.workload import PY, ROOT, WRAPPER, await_for, stamps_of

from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.node.base import workload_env

WORKLOADS = {
    "train": [str(ROOT / "examples" / "train.py"), "--steps", "100000", "--sleep", "0", "--width", "65536"],
    "memhog": [str(ROOT / "examples" / "memhog.py"), "--mib", "1024", "--dirty-pct", "5", "--interval", "0.2"],
}
MODES = ("naive", "cold", "live", "live-fresh")
FRESH_EVERY = "10m"  # live-fresh: the job's checkpoint interval; its one checkpoint is taken well inside it
FRESH_AT = 2  # live-fresh: lines the job prints before that checkpoint
BEFORE = 14  # lines a job prints before it is moved
PERIOD_LINES = 8  # its speed unmoved: the mean period of its last lines before the move
AFTER = 14  # lines it prints after the move returned
GOALS = {"live": 0.5, "live-fresh": 0.5, "cold": 1.0}  # issue 18: lost seconds against naive's


def lines(stderr: bytes) -> list[float]:
    """The times of the job's printed lines (its wrapper's ``r`` stamps; memhog's "ready" counts too)."""
    _, rounds = stamps_of(b"r 0\n" + stderr)  # stamps_of drops the first: keep every real one
    return rounds


def lost_against_unmoved(stamps: list[float], moved_at: float) -> dict[str, float]:
    """The module's formula: what the job lost, from its own line stamps."""
    before = [t for t in stamps if t < moved_at]
    if len(before) < PERIOD_LINES + 1:
        raise BenchError(f"only {len(before)} lines before the move")
    ref, k = len(before) - 1, len(stamps) - 1
    if k - ref < PERIOD_LINES + 1:
        raise BenchError(f"only {k - ref} lines after the move")
    gaps = [b - a for a, b in itertools.pairwise(before[-PERIOD_LINES - 1:])]
    gaps += [b - a for a, b in itertools.pairwise(stamps[-PERIOD_LINES - 1:])]
    period = statistics.mean(gaps)
    return {"lost_s": (stamps[k] - stamps[ref]) - (k - ref) * period, "period_s": period,
            "lines_after": float(k - ref)}


MOVE_FIGURES = ("mode", "rounds", "round_freeze_ms", "freeze_ms", "downtime_ms", "switch_ms", "restore_ms",
                "degraded_ms", "bytes_precopy", "bytes_final", "bytes_lazy", "total_ms")
"""What each Ferry move's JSON says of where its time went, kept with the sample (``--json``)."""


CHECKPOINT_FIGURES = ("freeze_ms", "dump_ms", "upload_ms", "total_ms", "bytes_uploaded", "final")
"""What the record of the move's checkpoint says of where its time went (a live move's holds its
final images, without the memory)."""


class LostBench(Bench):
    """bench/migrate.py's mover (its naive stop-and-copy, its processes and cluster to clean up),
    moving the workloads here and measuring what the moves cost them."""

    def workload(self, workload: str) -> list[str]:
        return [PY, "-c", WRAPPER, *WORKLOADS[workload]]

    async def naive_lost(self, tag: str, workload: str) -> dict[str, Any]:
        base = self.run_dir / tag
        src = JobDir(base / "node-1" / "job")
        info = await launch(src, self.workload(workload), cwd=ROOT, env=workload_env({}), incarnation=1)
        self.pids.add(info.pid)
        await await_for(lambda: len(lines(src.stderr.read_bytes())) >= BEFORE, 300, f"{BEFORE} lines of {tag}")
        m = await self.stop_and_copy(info.pid, src, base)
        await await_for(lambda: len([t for t in lines(m.dst.stderr.read_bytes()) if t > m.restored]) >= AFTER, 300,
                        f"{AFTER} lines of {tag} after its move")
        self.kill(m.pid)
        got = lost_against_unmoved(lines(m.dst.stderr.read_bytes()), m.started)
        shutil.rmtree(base, ignore_errors=True)
        return {**got, "move_s": m.restored - m.started, "ferry_lost_s": None}

    async def ferry_lost(self, tag: str, workload: str, mode: str) -> dict[str, Any]:
        c = self.cluster
        assert c is not None
        fresh = mode == "live-fresh"
        await c.json("run", "--name", tag, "--node", "node-1", "--cwd", str(ROOT), "--network", "host",
                     *(["--checkpoint-every", FRESH_EVERY] if fresh else []), "--", *self.workload(workload))

        async def stderr() -> bytes:
            return (await c.cli("logs", tag, "--stream", "stderr")).encode()

        async def lines_after(t: float, n: int, what: str) -> None:
            deadline = time.monotonic() + 300
            while len([x for x in lines(await stderr()) if x > t]) < n:
                if time.monotonic() > deadline:
                    raise BenchError(f"timed out waiting for {n} lines of {tag} {what}")
                await asyncio.sleep(0.5)

        since = 0.0
        if fresh:
            await lines_after(since, FRESH_AT, "before its checkpoint")
            await c.json("checkpoint", tag, timeout=900)
            since = time.time()
        await lines_after(since, BEFORE, "before its move")
        moved_at = time.time()
        report = await c.json("migrate", tag, "--to", "node-2", *(["--live"] if mode != "cold" else []),
                              timeout=900)
        back_at = time.time()
        await lines_after(back_at, AFTER, "after its move")
        got = lost_against_unmoved(lines(await stderr()), moved_at)
        records = await c.json("checkpoints", tag)  # the move's own checkpoint is the newest
        newest = max(records, key=lambda r: r["created"]) if isinstance(records, list) and records else {}
        await c.cli("kill", tag, "--grace", "1s")
        return {**got, "move": {k: report.get(k) for k in MOVE_FIGURES}, "move_s": back_at - moved_at,
                "checkpoint": {k: newest.get(k) for k in CHECKPOINT_FIGURES},
                "ferry_lost_s": report.get("lost_s"), "ferry_lost_basis": report.get("lost_basis"),
                "downtime_ms": report.get("downtime_ms")}

    async def run(self) -> dict[str, Any]:
        if any(m != "naive" for m in self.args.mode_list):
            self.cluster = Cluster(self.run_dir / "cluster")
            await asyncio.to_thread(self.cluster.start)
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
        turn = 0
        for workload in self.args.workload_list:
            samples[workload] = {m: [] for m in self.args.mode_list}
            for i in range(self.args.repeat):
                modes = list(self.args.mode_list)
                modes = modes[turn % len(modes):] + modes[:turn % len(modes)]
                turn += 1
                for mode in modes:
                    tag = f"{workload}-{mode}-{i}"
                    print(f"{tag} ...", file=sys.stderr, flush=True)
                    rate = copy_rate()
                    got = await (self.naive_lost(tag, workload) if mode == "naive"
                                 else self.ferry_lost(tag, workload, mode))
                    got["copy_gibs"] = rate
                    own = got.get("ferry_lost_s")
                    print(f"  lost {got['lost_s']:.2f} s" + (f" (Ferry's own figure: {own:.2f} s)"
                                                             if own is not None else ""), file=sys.stderr, flush=True)
                    samples[workload][mode].append(got)
        return samples


def report(samples: dict[str, dict[str, list[dict[str, Any]]]], repeat: int, mach: dict[str, Any],
           load: tuple[str, str]) -> tuple[dict[str, Any], str]:
    out = ["| workload | move | lost s, median [samples] | vs naive | goal | Ferry's own lost_s, median [samples] "
           "| move command s | period s |", "|---|---|---|---|---|---|---|---|"]
    result: dict[str, Any] = {"repeat": repeat, "machine": mach, "load_before": load[0], "load_after": load[1],
                              "rows": []}
    for workload, modes in samples.items():
        naive = median([s["lost_s"] for s in modes["naive"]]) if modes.get("naive") else None
        for mode, got in modes.items():
            lost = median([s["lost_s"] for s in got])
            own = [s["ferry_lost_s"] for s in got if s.get("ferry_lost_s") is not None]
            ratio = lost / naive if naive and mode != "naive" else None
            goal = GOALS.get(mode)
            verdict = "-" if ratio is None or goal is None else (
                f"<= {goal}x: " + ("met" if ratio <= goal else "**no**"))
            each = ", ".join(f"{s['lost_s']:.2f}" for s in got)
            out.append(f"| {workload} | {mode} | {lost:.2f} [{each}] | "
                       + (f"{ratio:.2f}x" if ratio is not None else "-") + f" | {verdict} | "
                       + (f"{median(own):.2f} [{', '.join(f'{x:.2f}' for x in own)}]" if own else "-") + " | "
                       + f"{median([s['move_s'] for s in got]):.2f} | {median([s['period_s'] for s in got]):.3f} |")
            result["rows"].append({"workload": workload, "mode": mode, "lost_s": lost, "ratio_vs_naive": ratio,
                                   "ferry_lost_s": median(own) if own else None, "samples": got})
    rates = [f"{workload} {mode} [{', '.join(format(s['copy_gibs'], '.2f') for s in got)}]"
             for workload, modes in samples.items() for mode, got in modes.items()]
    text = "\n".join([f"Lost seconds against the job unmoved; median of {repeat}; modes rotate which goes first.",
                      "", *out, "", "Memory copy rate before each sample, GiB/s (`benchkit.copy_rate`): "
                      + "; ".join(rates) + ".", "", machine_line(mach, *load)])
    return result, text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: train,memhog")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated: {','.join(MODES)}")
    p.add_argument("--repeat", type=int, default=3)
    add_run_arguments(p)
    args = p.parse_args(argv)
    args.workload_list = [w for w in args.workloads.split(",") if w]
    args.mode_list = [m for m in MODES if m in args.modes.split(",")]
    if not args.workload_list or any(w not in WORKLOADS for w in args.workload_list):
        p.error(f"--workloads: a comma-separated subset of {','.join(WORKLOADS)}")
    if not args.mode_list or args.repeat < 1:
        p.error(f"--modes: a comma-separated subset of {','.join(MODES)}; --repeat >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    with run_directory(args.dir, args.keep, "ferry-lost-") as run_dir:
        bench = LostBench(args, run_dir)
        load_before = uptime()
        try:
            samples = asyncio.run(bench.run())
        except BenchError as exc:
            print(f"bench/lost.py: {exc}", file=sys.stderr)
            return 1
        finally:
            bench.cleanup()
        result, text = report(samples, args.repeat, machine(run_dir), (load_before, uptime()))
    emit(result, text, args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
