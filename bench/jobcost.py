"""Where a submitted job's CPU goes (issue 18), on its own ``ferry up --nodes 4``:

After a warm-up, ``--repeat`` bursts of ``--jobs`` short jobs (``true``) from ``--clients`` gRPC
clients (as ``bench/scale.py`` submits them). Around each burst, every process's CPU (its own,
and its reaped children's) and the machine's busy time are read, and NATS's counters (its
monitoring port): the milliseconds of CPU per job by kind of process, the messages NATS took in
and sent out per job, and the writes per job to each JetStream stream (each one synced to disk:
``sync_interval: always``). A job's monitor and workload outlive the starter that forked them and
are reaped by the machine's init (or a subreaper): their CPU shows as that process's reaped
children. Medians over the bursts, with every sample.

    python bench/jobcost.py [--jobs 300] [--clients 16] [--repeat 3] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
from benchkit import Cluster, add_run_arguments, emit, machine, machine_line, median, run_directory, uptime
from scale import SERVICES, service_of, submits

OURS = ("nats-server", "zygote", *SERVICES)


def kind_of(proc: psutil.Process) -> str:
    """The kind of process `proc` is, for the table: one of ours, a kernel thread, or another."""
    try:
        if proc.pid == 2 or proc.ppid() == 2:
            return "kernel threads"
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "other"
    if "nats-server" in cmd:
        return "nats-server"
    if "ferry.criu.zygote" in cmd:
        return "zygote"
    return service_of(cmd) or "other"


def cpu_snapshot() -> dict[int, tuple[str, float, float]]:
    """pid -> (kind, own CPU seconds, reaped children's CPU seconds), for every process."""
    out: dict[int, tuple[str, float, float]] = {}
    for proc in psutil.process_iter():
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = (kind_of(proc), t.user + t.system, t.children_user + t.children_system)
    return out


def cpu_by_kind(before: dict[int, tuple[str, float, float]],
                after: dict[int, tuple[str, float, float]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by kind. A process that is not ours but reaped
    children meanwhile (init, a subreaper) counts them as the jobs' monitors and workloads; the
    starters forked by a zygote, which it reaps, count as the zygote's."""
    spent: defaultdict[str, float] = defaultdict(float)
    for pid, (kind, own, kids) in after.items():
        own0, kids0 = (before[pid][1], before[pid][2]) if pid in before else (0.0, 0.0)
        spent[kind] += own - own0
        spent[kind if kind in OURS else "monitors and workloads"] += kids - kids0
    return dict(spent)


class NatsCounters:
    """NATS's monitoring endpoint, found in the cluster's ``nats.conf``."""

    def __init__(self, conf: Path) -> None:
        found = re.search(r"^http: ([0-9.]+:\d+)", conf.read_text(), re.M)
        if found is None:
            raise SystemExit(f"no monitoring port in {conf}")
        self.base = f"http://{found.group(1)}"

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return dict(json.load(r))

    def read(self) -> dict[str, int]:
        varz = self._get("/varz")
        out = {"in_msgs": int(varz["in_msgs"]), "out_msgs": int(varz["out_msgs"])}
        for account in self._get("/jsz?streams=true").get("account_details", []):
            for stream in account.get("stream_detail", []):
                out[f"stream {stream['name']}"] = int(stream["state"]["last_seq"])
        return out


def burst(cluster: Cluster, nats: NatsCounters, jobs: int, clients: int, prefix: str) -> dict[str, Any]:
    before, nats_before, machine_before = cpu_snapshot(), nats.read(), psutil.cpu_times()
    result = submits(cluster, jobs, clients, prefix=prefix)
    time.sleep(2.0)  # the last jobs' exits reported
    after, nats_after, machine_after = cpu_snapshot(), nats.read(), psutil.cpu_times()
    busy = sum(getattr(machine_after, f) - getattr(machine_before, f) for f in machine_after._fields
               if f not in ("idle", "iowait", "guest", "guest_nice"))
    spent = cpu_by_kind(before, after)
    return {
        "per_s": result["per_s"],
        "busy_ms_per_job": 1000 * busy / jobs,
        "ms_per_job": {k: round(1000 * v / jobs, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])
                       if v > 0},
        "nats_per_job": {k: round((nats_after[k] - nats_before.get(k, 0)) / jobs, 2) for k in sorted(nats_after)
                         if nats_after[k] != nats_before.get(k, 0)},
    }


def report(r: dict[str, Any]) -> str:
    bursts = r["bursts"]
    lines = [f"Where a job's CPU goes: `ferry up --nodes 4`, {len(bursts)} bursts of {r['jobs']} jobs (`true`) "
             f"from {r['clients']} clients (the median and every burst's figure):", "",
             "| per job | median | bursts |", "|---|---|---|"]

    def row(label: str, xs: list[float], unit: str = "") -> None:
        lines.append(f"| {label} | {median(xs):.1f}{unit} | {', '.join(f'{x:.1f}' for x in xs)} |")

    row("submits per second", [b["per_s"] for b in bursts])
    row("the machine's busy CPU (ms)", [b["busy_ms_per_job"] for b in bursts])
    kinds = sorted({k for b in bursts for k in b["ms_per_job"]}, key=lambda k: -median(
        [b["ms_per_job"].get(k, 0.0) for b in bursts]))
    for k in kinds:
        xs = [b["ms_per_job"].get(k, 0.0) for b in bursts]
        if median(xs) >= 0.2:
            row(f"... {k} (ms)", xs)
    for k in sorted({k for b in bursts for k in b["nats_per_job"]}):
        label = {"in_msgs": "messages in", "out_msgs": "messages out"}.get(k, f"writes to {k}")
        row(f"NATS: {label}", [b["nats_per_job"].get(k, 0.0) for b in bursts])
    lines += ["", machine_line(r["machine"], r["load_before"], r["load_after"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    with run_directory(args.dir, args.keep, "ferry-jobcost-bench-") as run_dir:
        cluster = Cluster(Path(run_dir) / "cluster", nodes=4)
        load_before = uptime()
        cluster.start()
        try:
            nats = NatsCounters(Path(run_dir) / "cluster" / "nats.conf")
            submits(cluster, 40, 4, prefix="w")  # warm-up: zygotes, connections, caches
            time.sleep(3.0)
            bursts = [burst(cluster, nats, args.jobs, args.clients, prefix=f"b{i}-") for i in range(args.repeat)]
        finally:
            cluster.stop()
        result = {"jobs": args.jobs, "clients": args.clients, "bursts": bursts, "machine": machine(Path(run_dir)),
                  "load_before": load_before, "load_after": uptime()}
    emit(result, report(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
