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
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import emit, exit_on_sigterm, machine, run_directory, uptime
from movebench.moves import Bench, Cluster, Sample
from movebench.report import markdown, summarize
from movebench.workload import FERRY, MODES, mem_available

from ferry.criu.binary import find_criu
from ferry.criu.lazy import ensure_pipe_limits

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
    exit_on_sigterm()
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
    emit(result, markdown(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
