"""What a node's interruption watch costs: the CPU of one AWS IMDSv2 poll (two GETs on a kept
connection: spot/instance-action, then the rebalance recommendation), made by Ferry's metadata
client (`ferry.node.metahttp`, h11 on an asyncio stream) and by httpx (the general client it
replaced, the raw tool here), in the same run, alternating, against the simulated metadata server
of `ferry up` (`ferry.sim.metadata_server`, in a process of its own). Every node service polls
its endpoint each `notice_poll_s` (1 s), so this is a standing cost of every node, idle or not.

    python bench/imds.py [--polls 300] [--repeat 5] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from benchkit import add_run_arguments, emit, machine, machine_line, median, run_directory, uptime, wait_for

from ferry.common.ports import free_port
from ferry.node import metahttp
from ferry.node.interruptions import AWS_TOKEN_HEADER, AWS_TOKEN_TTL_HEADER

PATHS = ("/latest/meta-data/spot/instance-action", "/latest/meta-data/events/recommendations/rebalance")

Poll = Callable[[], Awaitable[None]]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def clients(base: str) -> tuple[dict[str, Poll], Callable[[], Awaitable[None]]]:
    token = (await metahttp.request("PUT", f"{base}/latest/api/token", {AWS_TOKEN_TTL_HEADER: "21600"})).text()
    headers = {AWS_TOKEN_HEADER: token}
    general = httpx.AsyncClient(trust_env=False)

    async def ferry_poll() -> None:
        for path in PATHS:
            if (await metahttp.request("GET", base + path, headers)).status != 404:
                raise SystemExit(f"{path}: expected 404 (no notice armed)")

    async def httpx_poll() -> None:
        for path in PATHS:
            if (await general.get(base + path, headers=headers, timeout=2.0)).status_code != 404:
                raise SystemExit(f"{path}: expected 404 (no notice armed)")

    async def close() -> None:
        await general.aclose()
        await metahttp.close_all()

    return {"ferry.node.metahttp (h11)": ferry_poll, "httpx.AsyncClient": httpx_poll}, close


async def measure(base: str, polls: int, repeat: int) -> dict[str, dict[str, list[float]]]:
    polls_by, close = await clients(base)
    out: dict[str, dict[str, list[float]]] = {name: {"cpu_ms": [], "wall_ms": []} for name in polls_by}
    try:
        for poll in polls_by.values():  # warm: connections open, code paths imported
            for _ in range(20):
                await poll()
        for i in range(repeat):
            names = list(polls_by) if i % 2 == 0 else list(reversed(polls_by))
            for name in names:
                c0, t0 = cpu_s(), time.perf_counter()
                for _ in range(polls):
                    await polls_by[name]()
                out[name]["cpu_ms"].append(round((cpu_s() - c0) * 1000 / polls, 3))
                out[name]["wall_ms"].append(round((time.perf_counter() - t0) * 1000 / polls, 3))
    finally:
        await close()
    return out


def report(result: dict[str, Any]) -> str:
    raw = median(result["samples"]["httpx.AsyncClient"]["cpu_ms"])
    rows = []
    for name, s in result["samples"].items():
        m = median(s["cpu_ms"])
        rows.append(f"| {name} | {m:.2f} | {m / raw:.2f}x | {median(s['wall_ms']):.2f} | "
                    f"{', '.join(f'{x:.2f}' for x in s['cpu_ms'])} |")
    return "\n".join([
        f"One AWS IMDSv2 poll (two GETs on a kept connection), the client's CPU; median of {result['repeat']} "
        f"rounds of {result['polls']} polls, the two clients alternating:",
        "",
        "| client | CPU per poll (ms) | vs httpx | wall per poll (ms) | rounds (CPU ms) |",
        "|---|---|---|---|---|",
        *rows,
        "",
        machine_line(result["machine"], result["load_before"], result["load_after"]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    with run_directory(args.dir, args.keep, "ferry-imds-bench-") as run_dir:
        port = free_port()
        log = Path(run_dir) / "metadata.log"
        with open(log, "wb") as out:
            server = subprocess.Popen([sys.executable, "-m", "ferry.sim.metadata_server", "--port", str(port)],
                                      stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: b"http://" in log.read_bytes(), 30, f"the metadata server (log: {log})")
            load_before = uptime()
            samples = asyncio.run(measure(f"http://127.0.0.1:{port}", args.polls, args.repeat))
            load_after = uptime()
        finally:
            server.terminate()
            server.wait()
        result = {"polls": args.polls, "repeat": args.repeat, "samples": samples, "machine": machine(Path(run_dir)),
                  "load_before": load_before, "load_after": load_after}
    emit(result, report(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
