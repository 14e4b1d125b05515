"""The report of bench/migrate.py: medians per mode with every sample, the ratio of `ferry migrate
--live` to the naive move, and the Markdown tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchkit import median

from movebench.moves import Sample, number
from movebench.workload import GOAL, MODES

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
