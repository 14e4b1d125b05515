"""How the control plane scales (issue 18), on its own ``ferry up --nodes 4``:

- **submits**: ``--jobs`` short jobs (``true``) submitted through the admin API by ``--clients``
  concurrent gRPC clients, as fast as it answers; submits per second overall and per hundred (a
  rate that falls as jobs pile up means a cost that grows with history), each submit's latency
  (p50, p90), the CPU seconds each service used for them, and how much of the machine's CPU went
  unused meanwhile; then as many again from ``--more-clients`` clients (with few clients each
  submit's latency can bound the rate while CPU is left over);
- **spread**: where the jobs ran (equal nodes should share equal work);
- **listing**: ``ferry ps -a -o json`` and ``ferry nodes -o json`` with every job finished;
- **supervisor**: what one running job's supervisor (its monitor, forked from the node's shim
  zygote) costs: PSS and CPU to start; and the memory of a restored job's;
- **idle**: the services' CPU with nothing to do, before the first job and after the last
  (``--idle-s`` each): the same with any number of finished jobs;
- **placement**: one placement decision (the node views from the records, then the choice) at
  10,000 jobs, 2,000 of them running, on 1,000 nodes, in this process.

    python bench/scale.py [--jobs 1000] [--clients 4] [--more-clients 16] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
from benchkit import (
    FERRY,
    Cluster,
    add_run_arguments,
    emit,
    machine,
    machine_line,
    median,
    run_directory,
    uptime,
    wait_for,
)

from ferry.common.models import Job, JobState, Node
from ferry.policy import decisions
from ferry.policy.views import ViewCache, job_view
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as rpc

SERVICES = ("api", "scheduler", "health", "pricing", "checkpointer", "migrator")


def service_of(cmdline: str) -> str | None:
    """Which of ``SERVICES`` a process with this command line is (``python -m ferry.<service>``)."""
    return next((s for s in SERVICES if f"ferry.{s}" in cmdline), None)


def service_cpu(root: int) -> dict[str, float]:
    """CPU seconds (user + system) of each service process under ``ferry up`` (summed over nodes)."""
    out: dict[str, float] = {}
    for proc in psutil.Process(root).children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            times = proc.cpu_times()
        except psutil.Error:
            continue
        name = service_of(cmd)
        if name is not None:
            out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def idle_pct(before: Any, after: Any) -> float:
    """How much of the machine's CPU time went unused between two ``psutil.cpu_times()``: near 0
    means the submits were bound by CPU; more, by the latency of each (the clients waited)."""
    spent = {k: getattr(after, k) - getattr(before, k) for k in after._fields}
    total = sum(spent.values())
    return round(100 * (spent.get("idle", 0.0) + spent.get("iowait", 0.0)) / total, 1) if total else 0.0


def percentile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) >= 2 else (xs[0] if xs else float("nan"))


def submits(cluster: Cluster, jobs: int, clients: int, prefix: str = "s") -> dict[str, Any]:
    channel = grpc.insecure_channel(cluster.addr)
    stub = rpc.FerryAdminStub(channel)
    latencies: list[tuple[int, float, float]] = []  # (index, finished at, seconds)
    lock = threading.Lock()
    counter = iter(range(jobs))
    errors: list[str] = []

    def client() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            started = time.perf_counter()
            try:
                stub.SubmitJob(pb.SubmitJobRequest(name=f"{prefix}{i:05d}", argv=["true"]), timeout=120)
            except grpc.RpcError as exc:
                errors.append(f"{prefix}{i:05d}: {exc.details()}")
                return
            done = time.perf_counter()
            with lock:
                latencies.append((i, done, done - started))

    assert cluster.proc is not None
    cpu_before = service_cpu(cluster.proc.pid)
    machine_before = psutil.cpu_times()
    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - began
    cpu_after = service_cpu(cluster.proc.pid)
    machine_after = psutil.cpu_times()
    if errors:
        raise SystemExit(f"{len(errors)} submits failed, the first: {errors[0]}")
    latencies.sort(key=lambda x: x[1])
    per_hundred = []
    previous = began
    for k in range(0, len(latencies), 100):
        block = latencies[k:k + 100]
        per_hundred.append(round(len(block) / (block[-1][1] - previous), 1))
        previous = block[-1][1]
    secs = [x[2] for x in latencies]
    return {"jobs": jobs, "clients": clients, "seconds": round(took, 2), "per_s": round(jobs / took, 1),
            "per_s_each_hundred": per_hundred, "latency_p50_ms": round(percentile(secs, 50) * 1000, 1),
            "latency_p90_ms": round(percentile(secs, 90) * 1000, 1),
            "idle_pct": idle_pct(machine_before, machine_after),
            "cpu_s": {k: round(cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0), 2) for k in sorted(cpu_after)}}


def idle(cluster: Cluster, seconds: float) -> dict[str, Any]:
    """What the services of an idle cluster use: their CPU over ``seconds`` with nothing to do, as
    a percentage of one core (all of them, and each kind). Measured with no job yet and after all
    the bench's jobs have ended, it shows whether idle cost grows with history (issue 18)."""
    assert cluster.proc is not None
    before = service_cpu(cluster.proc.pid)
    time.sleep(seconds)
    after = service_cpu(cluster.proc.pid)
    each = {k: round(100 * (after[k] - before.get(k, 0.0)) / seconds, 2) for k in sorted(after)}
    return {"seconds": seconds, "pct_of_a_core": round(sum(each.values()), 2), "each": each}


def all_ended(cluster: Cluster) -> None:
    wait_for(lambda: all(j["state"] != "running" for j in cluster.ferry("ps")[1]), 300, "every job to end")


def spread(cluster: Cluster) -> dict[str, int]:
    _, jobs = cluster.ferry("ps", "-a")
    return dict(sorted(Counter(j["node"] for j in jobs).items()))


def timed_cli(cluster: Cluster, *args: str, repeat: int = 5) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run([FERRY, *args, "-o", "json"], env=cluster.env, capture_output=True, check=False)
        out.append(round(time.perf_counter() - started, 3))
        if done.returncode != 0:
            raise SystemExit(f"ferry {' '.join(args)}: {done.stderr.decode()[-300:]}")
    return out


def supervisor(cluster: Cluster, count: int = 5) -> dict[str, Any]:
    """What the supervisors (monitors) of ``count`` sleeping jobs cost: each one's PSS, and the CPU
    to start one: its starter's (a fork of the node's zygote, ``ferry.criu.zygote``, reaped by the
    zygote, so read from the zygote's children counters) and the monitor's own since its fork."""
    zygotes = [p for p in psutil.process_iter(["cmdline"])
               if "ferry.criu.zygote_server" in " ".join(p.info["cmdline"] or [])
               and str(cluster.data_dir) in " ".join(p.info["cmdline"] or [])]
    assert zygotes, "no shim zygote runs on the cluster's nodes"

    def reaped() -> float:
        return sum(z.cpu_times().children_user + z.cpu_times().children_system for z in zygotes)

    before = reaped()
    for i in range(count):
        cluster.ferry("run", "--name", f"sup-{i}", "--", "sleep", "600")
    monitors: list[psutil.Process] = []

    def found() -> bool:
        monitors[:] = []
        for shim_json in Path(cluster.data_dir).glob("nodes/*/jobs/*/shim.json"):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                info = json.loads(shim_json.read_text())
                if not (shim_json.parent / "exit.json").exists():
                    monitors.append(psutil.Process(info["shim_pid"]))
        return len(monitors) >= count

    wait_for(found, 60, "the monitors of the sleeping jobs")
    time.sleep(1)
    memory = [p.memory_full_info() for p in monitors]
    pss, uss = [m.pss / 2**20 for m in memory], [m.uss / 2**20 for m in memory]
    own = [(t.user + t.system) * 1000 for t in (p.cpu_times() for p in monitors)]
    starters = (reaped() - before) * 1000 / count
    for i in range(count):
        cluster.ferry("kill", f"sup-{i}")
    cpu = [x + starters for x in own]
    return {"pss_mib": [round(x, 1) for x in pss], "uss_mib": [round(x, 1) for x in uss],
            "cpu_ms": [round(x) for x in cpu], "starter_cpu_ms": round(starters, 1),
            "monitor_cpu_ms": [round(x) for x in own]}


def restored_supervisor(cluster: Cluster, count: int = 3) -> dict[str, Any]:
    """What the supervisor of a restored job costs: ``count`` sleeping jobs, each checkpointed with
    ``--stop`` and restored; each restore's monitor (a fork of the node's zygote since restores go
    through it) is measured as the launched ones are (USS, PSS)."""
    monitors: list[psutil.Process] = []

    def running(name: str) -> Callable[[], bool]:
        return lambda: bool(cluster.ferry("status", name)[1]["state"] == "running")

    for i in range(count):
        name = f"rst-{i}"
        _, job = cluster.ferry("run", "--name", name, "--", "sleep", "600")
        wait_for(running(name), 60, f"{name} to run")
        cluster.ferry("checkpoint", name, "--stop")
        cluster.ferry("restore", name)
        wait_for(running(name), 120, f"{name} to run again")
        for shim_json in Path(cluster.data_dir).glob(f"nodes/*/jobs/{job['id']}/shim.json"):
            info = json.loads(shim_json.read_text())
            if info.get("mode") == "restore":
                monitors.append(psutil.Process(info["shim_pid"]))
    assert len(monitors) == count, f"found {len(monitors)} restore monitors of {count}"
    time.sleep(1)
    memory = [p.memory_full_info() for p in monitors]
    for i in range(count):
        cluster.ferry("kill", f"rst-{i}")
    return {"pss_mib": [round(m.pss / 2**20, 1) for m in memory], "uss_mib": [round(m.uss / 2**20, 1) for m in memory]}


def placement(repeat: int = 20) -> dict[str, Any]:
    """One placement as the scheduler makes it: the node views (``ViewCache``: built again only for
    the nodes whose record or load changed since the last decision), then the choice. Between two
    decisions one more job runs on one node, as in a burst of submits; the first decision of a
    second builds every view (``cold_ms``: as after a second has passed or every node beat)."""
    t = time.time()
    nodes = [Node(id=f"n{i:04d}", cpus=16, memory_bytes=64 << 30, started=t - 100, last_heartbeat=t)
             for i in range(1000)]
    jobs = [Job(id=f"j{i:05d}", name=f"j{i}", argv=["x"], node=f"n{i % 1000:04d}", cpus=1,
                state=JobState.RUNNING if i < 2000 else JobState.SUCCEEDED) for i in range(10_000)]
    live = [j for j in jobs if not j.terminal]  # what the scheduler's index hands the placement
    new = Job(id="new", name="new", argv=["x"], cpus=1)
    cache = ViewCache()
    started = time.perf_counter()
    decisions.choose_node(job_view(new, t), cache.views(nodes, live, t, 30.0), t)
    cold = (time.perf_counter() - started) * 1000
    samples = []
    for i in range(repeat):
        live.append(Job(id=f"more{i}", name=f"more{i}", argv=["x"], node=f"n{i:04d}", cpus=1, state=JobState.RUNNING))
        started = time.perf_counter()
        views = cache.views(nodes, live, t, 30.0)
        decisions.choose_node(job_view(new, t), views, t)
        samples.append((time.perf_counter() - started) * 1000)
    return {"ms": [round(x, 2) for x in samples], "median_ms": round(median(samples), 2), "cold_ms": round(cold, 2)}


def report(r: dict[str, Any]) -> str:
    s, m = r["submits"], r["machine"]
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in s["cpu_s"].items())
    return "\n".join([
        f"Control plane, `ferry up --nodes 4`, {s['jobs']} jobs (`true`) submitted by {s['clients']} clients:",
        "",
        "| metric | value | goal | met? |",
        "|---|---|---|---|",
        f"| submits per second (overall) | {s['per_s']} | >= 30 | {'yes' if s['per_s'] >= 30 else '**no**'} |",
        f"| ... per hundred, in order | {', '.join(map(str, s['per_s_each_hundred']))} | flat | - |",
        f"| submit latency p50 / p90 | {s['latency_p50_ms']} / {s['latency_p90_ms']} ms | - | - |",
        f"| the machine's CPU left idle during the submits | {s['idle_pct']}% | - | - |",
        *([f"| submits per second with {x['clients']} clients (another {x['jobs']} jobs, after the first) | "
           f"{x['per_s']} (idle {x['idle_pct']}%; per hundred {', '.join(map(str, x['per_s_each_hundred']))}) | "
           f">= 30 | {'yes' if x['per_s'] >= 30 else '**no**'} |"] if (x := r.get("more_submits")) else []),
        f"| CPU seconds per service for the {s['jobs']} submits | {cpu} | - | - |",
        *([f"| the services' CPU, idle, with no job yet / after all {r['jobs_total']} jobs ended "
           f"({r['idle_before']['seconds']:.0f} s each; % of one core) | {r['idle_before']['pct_of_a_core']} / "
           f"{r['idle_after']['pct_of_a_core']} (after, by service: "
           f"{', '.join(f'{k} {v}' for k, v in r['idle_after']['each'].items())}) | "
           f"independent of history | - |"] if "idle_after" in r else []),
        f"| jobs per node | {', '.join(f'{k}: {v}' for k, v in r['spread'].items())} | equal | - |",
        f"| `ferry ps -a -o json` with {s['jobs']} jobs (median; samples) | {median(r['ps_s']) * 1000:.0f} ms; "
        f"{', '.join(f'{x * 1000:.0f}' for x in r['ps_s'])} | - | - |",
        f"| `ferry nodes -o json` (median; samples) | {median(r['nodes_s']) * 1000:.0f} ms; "
        f"{', '.join(f'{x * 1000:.0f}' for x in r['nodes_s'])} | <= 120 ms | "
        f"{'yes' if median(r['nodes_s']) <= 0.12 else '**no**'} |",
        f"| a job's supervisor: private memory (USS, MiB: what one more job adds) | "
        f"{', '.join(map(str, r['supervisor']['uss_mib']))} | <= 5 | "
        f"{'yes' if median(r['supervisor']['uss_mib']) <= 5 else '**no**'} |",
        f"| ... its PSS (MiB: the zygote's shared pages split among the jobs on its node and the zygote) | "
        f"{', '.join(map(str, r['supervisor']['pss_mib']))} | - | - |",
        f"| ... CPU to start: the starter forked from the zygote, and the monitor (ms) | "
        f"{', '.join(map(str, r['supervisor']['cpu_ms']))} | <= 20 | "
        f"{'yes' if median(r['supervisor']['cpu_ms']) <= 20 else '**no**'} |",
        f"| a restored job's supervisor (a fork of the zygote, as a launched one): USS / PSS (MiB) | "
        f"{', '.join(map(str, r['restored']['uss_mib']))} / {', '.join(map(str, r['restored']['pss_mib']))} | "
        f"<= 5 (USS) | {'yes' if median(r['restored']['uss_mib']) <= 5 else '**no**'} |",
        f"| one placement at 10,000 jobs (2,000 running), 1,000 nodes (median; cold: every view rebuilt) | "
        f"{r['placement']['median_ms']} ms (cold {r['placement']['cold_ms']} ms) | <= 2 ms | "
        f"{'yes' if r['placement']['median_ms'] <= 2 else '**no**'} |",
        "",
        f"{machine_line(m, r['load_before'], r['load_after'])} The run took {r['seconds']:.0f} s.",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--more-clients", type=int, default=16,
                        help="then as many jobs again from this many clients (0: not): with few clients the "
                             "submits can wait on each one's latency with CPU to spare")
    parser.add_argument("--idle-s", type=float, default=65.0,
                        help="how long to measure the idle services' CPU before the jobs and after them "
                             "(0: not); the job mirrors look at their buckets after 30 quiet seconds")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    began = time.monotonic()
    with run_directory(args.dir, args.keep, "ferry-scale-bench-") as run_dir:
        cluster = Cluster(Path(run_dir) / "cluster", nodes=4)
        load_before = uptime()
        cluster.start()
        try:
            result: dict[str, Any] = {}
            if args.idle_s:
                time.sleep(5)  # the start's own work settles
                result["idle_before"] = idle(cluster, args.idle_s)
            result["submits"] = submits(cluster, args.jobs, args.clients)
            all_ended(cluster)
            result["spread"] = spread(cluster)
            result["ps_s"] = timed_cli(cluster, "ps", "-a")
            result["nodes_s"] = timed_cli(cluster, "nodes")
            result["supervisor"] = supervisor(cluster)
            result["restored"] = restored_supervisor(cluster)
            if args.more_clients:
                result["more_submits"] = submits(cluster, args.jobs, args.more_clients, prefix="m")
            if args.idle_s:
                all_ended(cluster)
                result["jobs_total"] = len(cluster.ferry("ps", "-a")[1])
                result["idle_after"] = idle(cluster, args.idle_s)
        finally:
            cluster.stop()
        result |= {"placement": placement(), "machine": machine(Path(run_dir)), "load_before": load_before,
                   "load_after": uptime(), "seconds": time.monotonic() - began}
    emit(result, report(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
