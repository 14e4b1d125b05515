"""Elastic scale against a fixed-size cluster (issue 17): a day of job arrivals replayed, sped up,
on two all-in-one clusters in turn:

- **fixed**: ``--max`` nodes of one instance type, up the whole day;
- **autoscaled**: one node of that type to start with, ``ferry up --provider local`` able to launch
  more (up to ``--max``), and ``ferry autoscale --min 1 --max MAX`` with the given target and delay.

The day: jobs arrive more in working hours (3 an hour) than at night (one every 3 hours; a fixed,
seeded pattern), each asking for one cpu of a two-cpu node and computing for one to three hours.
Time runs ``--speed`` times faster than the clock (default 240: a day in six minutes; a job's hour
is 15 s). Each job prints a line per step; its output is checked against the same program run
without Ferry.

Reported per cluster: node-hours and cost (simulated hours: the clock's seconds times the speed),
makespan, each job's wait from submission to running (median, p90), and whether every output
matched; then the autoscaled cluster's saving against the fixed one.

    python bench/autoscale.py [--speed 240] [--hours 24] [--max 4] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchkit import (
    FERRY,
    BenchError,
    add_run_arguments,
    emit,
    machine,
    machine_line,
    read_bytes,
    run_directory,
    uptime,
    wait_for,
)

from ferry.common.ports import free_port

PRICE = 0.096  # USD/h of one node (an m5.large's on-demand price: 2 cpus)
JOB = """
import sys, time, zlib
steps, pause = int(sys.argv[1]), float(sys.argv[2])
crc = 0
for i in range(steps):
    crc = zlib.crc32(f"{sys.argv[3]}:{i}".encode(), crc)
    print(i, crc, flush=True)
    time.sleep(pause)
"""


def arrivals(hours: float, seed: int = 17) -> list[tuple[float, float]]:
    """(arrival hour, work hours) of the day's jobs: about 3 an hour from 8 to 18, one every 3 hours
    otherwise (a Poisson process, by thinning one of 3 an hour)."""
    rng = random.Random(seed)
    out: list[tuple[float, float]] = []
    t = 0.0
    while True:
        t += rng.expovariate(3.0)
        if t >= hours:
            return out
        work = round(rng.uniform(1.0, 3.0), 2)
        if rng.random() < (1.0 if 8 <= t % 24 < 18 else 1 / 9):
            out.append((round(t, 3), work))


class Run:
    """One cluster of the comparison and the ``ferry`` CLI against it."""

    def __init__(self, folder: Path, cluster: str, provider: bool) -> None:
        self.folder = folder
        self.addr = f"127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
        self.env = {**env, "FERRY_ADDR": self.addr, "PYTHONUNBUFFERED": "1", "FERRY_AUTOSCALE_EVERY_S": "1",
                    "FERRY_REBALANCE_EVERY_S": "2"}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cluster.yaml").write_text(cluster)
        self.argv = [FERRY, "up", "--data-dir", str(folder / "data"), "--grpc", self.addr,
                     "--cluster", str(folder / "cluster.yaml"), *(["--provider", "local"] if provider else [])]
        self.log = folder / "up.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.node_seconds = 0.0
        self.samples: list[tuple[float, int]] = []
        self.started: dict[str, float] = {}  # job name -> when first seen started
        self.ids: dict[str, tuple[str, str | None]] = {}  # job name -> (id, node) as last seen
        self.stop_sampling = threading.Event()

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: b"ferry: ready" in read_bytes(self.log), 180, f"ferry up (log {self.log})", interval=0.2)

    def stop(self) -> None:
        self.stop_sampling.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)

    def ferry(self, *args: str) -> Any:
        r = subprocess.run([FERRY, args[0], "-o", "json", *args[1:]], env=self.env, capture_output=True, text=True,
                           timeout=300, check=False)
        if r.returncode != 0:
            raise BenchError(f"ferry {' '.join(args)}: {r.stderr.strip()[-1000:]}")
        return json.loads(r.stdout)

    def sample(self) -> None:
        """Every second: the cluster's nodes (the node-seconds it pays for), and when each job was
        first seen started (its wait)."""
        last = time.monotonic()
        while not self.stop_sampling.wait(1.0):
            try:
                count = len(self.ferry("nodes"))
                jobs = self.ferry("ps", "-a")
            except (BenchError, subprocess.TimeoutExpired, json.JSONDecodeError):
                continue
            t = time.monotonic()
            self.node_seconds += count * (t - last)
            self.samples.append((t, count))
            for j in jobs:
                if j["state"] != "pending":
                    self.started.setdefault(j["name"], t)
                self.ids[j["name"]] = (j["id"], j["node"])
            last = t

    def output(self, name: str) -> tuple[str, bool]:
        """The job's stdout through `ferry logs`; where its node has been retired (its services are
        gone, so nothing serves it), from the node's folder that the local provider leaves: the
        second value says so."""
        got = subprocess.run([FERRY, "logs", name], env=self.env, capture_output=True, text=True, check=False)
        if got.returncode == 0:
            return got.stdout, False
        job_id, node = self.ids[name]
        path = self.folder / "data" / "nodes" / (node or "-") / "jobs" / job_id / "stdout"
        return (path.read_text() if path.exists() else ""), True


def replay(run: Run, day: list[tuple[float, float]], speed: float, steps_per_hour: int) -> dict[str, Any]:
    """Submits the day's jobs at their (sped-up) times and waits for every one to end."""
    hour_s = 3600.0 / speed
    pause = hour_s / steps_per_hour
    sampler = threading.Thread(target=run.sample, daemon=True)
    began = time.monotonic()
    sampler.start()
    submitted: dict[str, float] = {}
    for i, (at, work) in enumerate(day):
        delay = began + at * hour_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        name = f"j{i:03d}"
        steps = max(1, round(work * steps_per_hour))
        run.ferry("run", "--name", name, "--cpus", "1", "--", sys.executable, "-c", JOB, str(steps), f"{pause:.4f}",
                  name)
        submitted[name] = time.monotonic()

    def all_done() -> bool:
        jobs = {j["name"]: j for j in run.ferry("ps", "-a")}
        return all(jobs.get(n, {}).get("state") in ("succeeded", "failed", "killed") for n in submitted)

    wait_for(all_done, 24 * hour_s + 600, "every job to end", interval=1.0)
    makespan = time.monotonic() - began
    run.stop_sampling.set()
    sampler.join(timeout=30)
    jobs = {j["name"]: j for j in run.ferry("ps", "-a")}
    wrong, from_folder = [], []
    for i, (_, work) in enumerate(day):
        name = f"j{i:03d}"
        run.ids[name] = (jobs[name]["id"], jobs[name]["node"])
        steps = max(1, round(work * steps_per_hour))
        want = subprocess.run([sys.executable, "-c", JOB, str(steps), "0", name], capture_output=True, text=True,
                              check=True).stdout
        got, retired = run.output(name)
        if retired:
            from_folder.append(name)
        if jobs[name]["state"] != "succeeded" or got != want:
            wrong.append(name)
    waits = [max(0.0, run.started.get(n, submitted[n]) - submitted[n]) * speed / 3600 for n in submitted]
    return {"jobs": len(day), "outputs_identical": not wrong, "wrong": wrong, "read_from_retired": from_folder,
            "makespan_h": makespan * speed / 3600,
            "node_hours": run.node_seconds * speed / 3600, "cost_usd": run.node_seconds * speed / 3600 * PRICE,
            "wait_h_median": statistics.median(waits),
            "wait_h_p90": statistics.quantiles(waits, n=10)[-1] if len(waits) > 1 else waits[0],
            "max_nodes": max((c for _, c in run.samples), default=0)}


def clusters(max_nodes: int) -> tuple[str, str]:
    node = "{id: %s, cpus: 2, memory: 8GiB, instance_type: m5.large, zone: local-a, price_per_hour: %s}"
    fixed = "nodes:\n" + "".join(f"  - {node % (f'n{i}', PRICE)}\n" for i in range(1, max_nodes + 1))
    elastic = (f"nodes:\n  - {node % ('n1', PRICE)}\ninstance_types:\n"
               f"  - {{name: m5.large, zone: local-a, cpus: 2, memory: 8GiB, price_per_hour: {PRICE}, "
               f"available: {max_nodes}}}\n")
    return fixed, elastic


def report(result: dict[str, Any]) -> str:
    f, a = result["fixed"], result["autoscaled"]
    lines = [f"A day of {f['jobs']} jobs (1 cpu, 1-3 h each) replayed {result['speed']:g}x faster than the clock; "
             f"nodes of 2 cpus at {PRICE} USD/h; autoscaler: --min 1 --max {result['max']} "
             f"--target-utilization {result['target']} --scale-down-after {result['scale_down_after_min']:g} min "
             "(simulated).", "",
             "| cluster | node-hours | cost (USD) | most nodes | makespan (h) | wait median (h) | wait p90 (h) | "
             "outputs identical |", "|---|---|---|---|---|---|---|---|"]
    for name, r in (("fixed", f), ("autoscaled", a)):
        lines.append(f"| {name} | {r['node_hours']:.1f} | {r['cost_usd']:.2f} | {r['max_nodes']} | "
                     f"{r['makespan_h']:.1f} | {r['wait_h_median']:.2f} | {r['wait_h_p90']:.2f} | "
                     f"{'all' if r['outputs_identical'] else 'NO: ' + ', '.join(r['wrong'])} |")
    saving = 1 - a["cost_usd"] / f["cost_usd"] if f["cost_usd"] else 0.0
    retired = a["read_from_retired"]
    lines += ["", f"The autoscaled cluster cost {saving:.0%} less than the fixed one."]
    if retired:
        lines += ["", f"{len(retired)} job(s) ended on nodes the autoscaler retired since: `ferry logs` cannot read "
                  "them any more (their node served them), so their output was read from the folder the local "
                  "provider left."]
    lines += ["",
              machine_line(result["machine"], result["load_before"], result["load_after"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", type=float, default=240.0, help="simulated seconds per second (default 240)")
    parser.add_argument("--hours", type=float, default=24.0, help="the simulated day's length (default 24)")
    parser.add_argument("--max", type=int, default=4, help="nodes of the fixed cluster; the autoscaler's --max")
    parser.add_argument("--target", type=float, default=0.8, help="the autoscaler's --target-utilization")
    parser.add_argument("--scale-down-after", type=float, default=30.0, metavar="MINUTES",
                        help="simulated minutes a node stays underused before it retires (default 30)")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    day = arrivals(args.hours)
    fixed_yaml, elastic_yaml = clusters(args.max)
    result: dict[str, Any] = {"speed": args.speed, "hours": args.hours, "max": args.max, "target": args.target,
                              "scale_down_after_min": args.scale_down_after, "arrivals": day,
                              "load_before": uptime()}
    with run_directory(args.dir, args.keep, "ferry-autoscale-bench-") as folder:
        for name, text, provider in (("fixed", fixed_yaml, False), ("autoscaled", elastic_yaml, True)):
            run = Run(folder / name, text, provider)
            run.start()
            try:
                if provider:
                    down_s = args.scale_down_after * 60 / args.speed
                    run.ferry("autoscale", "--min", "1", "--max", str(args.max), "--target-utilization",
                              str(args.target), "--scale-down-after", f"{down_s:.1f}s", "--scale-up-after", "1s")
                result[name] = replay(run, day, args.speed, steps_per_hour=8)
            finally:
                run.stop()
        result |= {"machine": machine(folder), "load_after": uptime()}
    emit(result, report(result), args.json, args.md)
    return 0 if result["fixed"]["outputs_identical"] and result["autoscaled"]["outputs_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
