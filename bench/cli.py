"""The CLI's floor: how long one ``ferry`` call takes against a running cluster, next to the same
call made by the smallest gRPC client this Python can be (the raw tool: import grpc and the
generated stubs, open the channel, one call, print the answer as JSON) and to the interpreter
doing nothing, in the same run, alternating. The goal (issue 18) is ``ferry nodes -o json``
within 120 ms.

It starts its own ``ferry up --nodes 2`` on a free port, runs a few jobs so ``ferry ps`` has
something to list, then times each command ``--repeat`` times.

    python bench/cli.py [--repeat 15] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import FERRY, Cluster, add_run_arguments, emit, machine, machine_line, median, run_directory, uptime

PY = sys.executable
GOAL_MS = 120.0

RAW = """
import json, sys, grpc
from google.protobuf.json_format import MessageToDict
from ferry.v1 import ferry_pb2 as pb, ferry_pb2_grpc as rpc
stub = rpc.FerryAdminStub(grpc.insecure_channel(sys.argv[1]))
print(json.dumps(MessageToDict(stub.ListNodes(pb.ListNodesRequest(), timeout=10))))
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return took


def measure(cluster: Cluster, repeat: int) -> dict[str, list[float]]:
    env = cluster.env
    commands = {
        "python -c pass (the interpreter's floor)": [PY, "-c", "pass"],
        "raw gRPC client: ListNodes as JSON": [PY, "-c", RAW, cluster.addr],
        "ferry nodes -o json": [FERRY, "nodes", "-o", "json"],
        "ferry ps -a -o json": [FERRY, "ps", "-a", "-o", "json"],
        "ferry status JOB -o json": [FERRY, "status", "cli-0", "-o", "json"],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(2):  # warm the page cache and the API
        for argv in commands.values():
            timed(argv, env)
    for i in range(repeat):
        names = list(commands) if i % 2 == 0 else list(reversed(commands))
        for name in names:
            samples[name].append(timed(commands[name], env))
    return samples


def report(result: dict[str, Any]) -> str:
    rows = []
    raw = median(result["samples_s"]["raw gRPC client: ListNodes as JSON"])
    for name, xs in result["samples_s"].items():
        m = median(xs)
        ratio = f"{m / raw:.2f}x" if name.startswith("ferry") else "-"
        goal = (f"<= {GOAL_MS:.0f} ms | {'yes' if m * 1000 <= GOAL_MS else '**no**'}"
                if name == "ferry nodes -o json" else "- | -")
        rows.append(f"| {name} | {m * 1000:.0f} ms | {ratio} | {goal} | "
                    f"{', '.join(f'{x * 1000:.0f}' for x in xs)} |")
    mach = result["machine"]
    return "\n".join([
        f"CLI floor, median of {result['repeat']} (ms; ratio against the raw gRPC client in the same run):",
        "",
        "| command | median | vs raw gRPC | goal | met? | samples (ms) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        machine_line(mach, result["load_before"], result["load_after"]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    with run_directory(args.dir, args.keep, "ferry-cli-bench-") as run_dir:
        cluster = Cluster(Path(run_dir) / "cluster")
        cluster.start()
        try:
            for i in range(3):
                cluster.ferry("run", "--name", f"cli-{i}", "--", PY, "-c", "print('done')")
            load_before = uptime()
            samples = measure(cluster, args.repeat)
            load_after = uptime()
        finally:
            cluster.stop()
        result = {"repeat": args.repeat, "samples_s": samples, "goal_ms": GOAL_MS, "machine": machine(Path(run_dir)),
                  "load_before": load_before, "load_after": load_after}
    emit(result, report(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
