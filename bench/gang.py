"""Gangs, measured (issue 15): a group checkpoint's freeze against its members' solo checkpoints,
and what the driver of a Ray cluster loses while one of its workers moves, live against cold.

    .venv/bin/python bench/gang.py [--members 3] [--mib 256] [--repeat 3] [--json PATH] [--md PATH]
        [--data-dir DIR] [--keep] [--no-ray]

One ``ferry up --nodes 3`` cluster (its data dir in the run directory) runs both parts:

- freeze: ``--members`` identical ``memhog.py --mib M`` jobs of one gang, one per node. Each repeat
  checkpoints every member alone (``ferry checkpoint JOB``: each dump's freeze_ms, their sum and
  their maximum), then the gang as one (``ferry checkpoint --gang``: the slowest member's freeze,
  the sum of the members' freezes in that group, and how long the gang's network was locked). The
  group's freeze is what the gang's work stops for; the sum is what checkpointing the members one
  after another would have cost; the ratio of the two is reported.
- Ray: a head (with a driver that calls a counter actor on each worker and prints a wall-clock
  stamp per call) and two workers, each a gang member on its own node. Each repeat moves worker 1
  to another node live (``ferry migrate --live``), then cold (``ferry migrate``), turn about. What
  the driver loses is the longest gap between two of its calls from the move's start to its end
  (its calls wait on the moving worker), against the longest gap in the seconds before (the noise).

Medians with every sample, the machine and its load (before and after) are reported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import BenchError, emit, machine, median, read_bytes, run_directory, uptime, wait_for

from ferry.common.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FERRY, PY, RAY = str(BIN / "ferry"), sys.executable, str(BIN / "ray")
MEMHOG = ROOT / "examples" / "memhog.py"
STORE = 80 * 1024 * 1024

HEAD = f"""
set -e
export RAY_AUTH_MODE=disabled RAY_health_check_failure_threshold=60
"$RAY" start --head --port=6379 --num-cpus=1 --include-dashboard=false --object-store-memory={STORE} \\
    --temp-dir="$1" --include-log-monitor=False --disable-usage-stats >/dev/null
exec "$PY" -u -c '
import time, ray
ray.init(address="auto", log_to_driver=False)

@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n

while sum(n["Alive"] for n in ray.nodes()) < 3:
    time.sleep(0.5)
a = Counter.options(resources={{"w1": 1}}).remote()
b = Counter.options(resources={{"w2": 1}}).remote()
while True:
    x, y = ray.get([a.inc.remote(), b.inc.remote()])
    print(x, y, time.time(), flush=True)
    time.sleep(0.02)
'
"""

WORKER = f"""
export RAY_AUTH_MODE=disabled RAY_raylet_start_wait_time_s=120
exec "$RAY" start --address="$1:6379" --num-cpus=1 --object-store-memory={STORE} --resources="{{\\"$2\\": 1}}" \\
    --include-log-monitor=False --disable-usage-stats --block >/dev/null
"""


class Cluster:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.log = data_dir, data_dir.parent / "ferry-up.log"
        self.env = {**os.environ, "FERRY_ADDR": f"127.0.0.1:{free_port()}", "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([FERRY, "up", "--nodes", "3", "--data-dir", str(self.data_dir), "--grpc",
                                          self.env["FERRY_ADDR"]], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: b"ferry: ready" in read_bytes(self.log), 120, "ferry up to be ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def cli(self, *args: str) -> Any:
        run = subprocess.run([FERRY, args[0], "-o", "json", *args[1:]], env=self.env, capture_output=True, text=True,
                             timeout=600, check=False)
        if run.returncode != 0:
            raise BenchError(f"ferry {' '.join(args)}: {run.stderr.strip()}")
        return json.loads(run.stdout) if run.stdout.strip() else None

    def logs(self, job: str) -> str:
        run = subprocess.run([FERRY, "logs", job], env=self.env, capture_output=True, text=True, timeout=60,
                             check=False)
        return run.stdout


def freeze_part(c: Cluster, members: int, mib: int, repeat: int) -> list[dict[str, Any]]:
    names = [f"gb-m{i}" for i in range(members)]
    for i, name in enumerate(names):
        c.cli("run", "--name", name, "--gang", "gb", "--node", f"node-{i % 3 + 1}", "--", PY, str(MEMHOG),
              "--mib", str(mib), "--interval", "1")
    for name in names:
        wait_for(lambda name=name: "ready" in c.logs(name), 120, f"{name} to fill its memory")  # type: ignore[misc]
    rows = []
    for r in range(repeat):
        solo = [float(c.cli("checkpoint", name)["freeze_ms"]) for name in names]
        group = c.cli("checkpoint", "--gang", "gb")
        rows.append({"repeat": r, "solo_freeze_ms": solo, "solo_sum_ms": sum(solo), "solo_max_ms": max(solo),
                     "gang_freeze_ms": group["freeze_ms"], "gang_freeze_sum_ms": group["freeze_ms_sum"],
                     "gang_lock_ms": group["lock_ms"]})
        print(f"freeze {r}: solo {[round(s) for s in solo]} ms, gang {group['freeze_ms']:.0f} ms "
              f"(locked {group['lock_ms']:.0f} ms)", file=sys.stderr)
    for name in names:
        c.cli("kill", name)
    return rows


def stamps(c: Cluster) -> list[float]:
    out = []
    for line in c.logs("rb-head").splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append(float(parts[2]))
    return out


def longest_gap(ts: list[float], start: float, end: float) -> float:
    inside = [t for t in ts if start <= t <= end]
    before = [t for t in ts if t < start][-1:]
    after = [t for t in ts if t > end][:1]
    window = [*before, *inside, *after]
    return max((b - a for a, b in itertools.pairwise(window)), default=float("nan")) * 1000


def ray_part(c: Cluster, repeat: int, ray_dir: str) -> list[dict[str, Any]]:
    c.cli("run", "--name", "rb-head", "--gang", "rb", "--node", "node-1", "--", "env", f"RAY={RAY}", f"PY={PY}",
          "bash", "-c", HEAD, "rb-head", ray_dir)
    head = c.cli("status", "rb-head")["address"]
    for worker, node in (("w1", "node-2"), ("w2", "node-3")):
        c.cli("run", "--name", f"rb-{worker}", "--gang", "rb", "--node", node, "--", "env", f"RAY={RAY}", "bash",
              "-c", WORKER, f"rb-{worker}", head, worker)
        time.sleep(15)  # one raylet starting at a time
    wait_for(lambda: len(stamps(c)) > 50, 300, "the Ray driver to call both workers")
    rows, nodes = [], ["node-1", "node-2"]
    for r in range(repeat):
        for mode in (("live", "cold") if r % 2 == 0 else ("cold", "live")):
            time.sleep(5)
            target = nodes[0] if c.cli("status", "rb-w1")["node"] != nodes[0] else nodes[1]
            t0 = time.time()
            result = c.cli("migrate", "rb-w1", "--to", target, *(["--live"] if mode == "live" else []))
            t1 = time.time()
            time.sleep(3)
            ts = stamps(c)
            row = {"repeat": r, "mode": mode, "lost_ms": longest_gap(ts, t0, t1),
                   "noise_ms": longest_gap(ts, t0 - 5, t0 - 0.001), "move_s": t1 - t0,
                   "ferry_downtime_ms": (result or {}).get("downtime_ms")}
            rows.append(row)
            print(f"ray {r} {mode}: the driver lost {row['lost_ms']:.0f} ms (noise {row['noise_ms']:.0f} ms)",
                  file=sys.stderr)
    for job in ("rb-w1", "rb-w2", "rb-head"):
        c.cli("kill", job)
    return rows


def markdown(result: dict[str, Any]) -> str:
    fr, rr = result["freeze"], result["ray"]
    lines = [f"Gangs: {result['config']}; load before {result['load_before']}, after {result['load_after']}", ""]
    if fr:
        gang, solo_sum, solo_max = (median([r[k] for r in fr]) for k in ("gang_freeze_ms", "solo_sum_ms",
                                                                        "solo_max_ms"))
        lines += ["| group checkpoint (median) | ms | samples |", "| --- | --- | --- |",
                  f"| gang freeze (slowest member) | {gang:.0f} | {[round(r['gang_freeze_ms']) for r in fr]} |",
                  f"| solo freezes, sum | {solo_sum:.0f} | {[round(r['solo_sum_ms']) for r in fr]} |",
                  f"| solo freezes, max | {solo_max:.0f} | {[round(r['solo_max_ms']) for r in fr]} |",
                  f"| gang network lock | {median([r['gang_lock_ms'] for r in fr]):.0f} | "
                  f"{[round(r['gang_lock_ms']) for r in fr]} |",
                  "", f"gang freeze / solo sum: {gang / solo_sum:.2f}; gang freeze / solo max: {gang / solo_max:.2f}",
                  ""]
    if rr:
        lines += ["| Ray worker move | driver lost, median ms | samples | noise ms |", "| --- | --- | --- | --- |"]
        for mode in ("live", "cold"):
            rows = [r for r in rr if r["mode"] == mode]
            lines.append(f"| {mode} | {median([r['lost_ms'] for r in rows]):.0f} | "
                         f"{[round(r['lost_ms']) for r in rows]} | {[round(r['noise_ms']) for r in rows]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--data-dir")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-ray", action="store_true")
    args = p.parse_args(argv)
    load_before, started = uptime(), time.monotonic()
    ray_dir = tempfile.mkdtemp(prefix="fgb-", dir="/tmp")  # short: Ray's unix socket paths
    with run_directory(args.data_dir, args.keep, "ferry-gang-") as run_dir:
        c = Cluster(run_dir / "cluster")
        try:
            c.start()
            freeze = freeze_part(c, args.members, args.mib, args.repeat)
            ray = [] if args.no_ray else ray_part(c, args.repeat, ray_dir)
        finally:
            c.stop()
            shutil.rmtree(ray_dir, ignore_errors=True)
        mach = machine(run_dir)
    result = {"config": {"members": args.members, "mib": args.mib, "repeat": args.repeat}, "machine": mach,
              "load_before": load_before, "load_after": uptime(), "elapsed_s": time.monotonic() - started,
              "freeze": freeze, "ray": ray}
    emit(result, markdown(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
