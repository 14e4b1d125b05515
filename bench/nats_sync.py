"""What `sync_interval: always` costs Ferry: JetStream KV writes with NATS's default fsync interval
(2 minutes: acknowledged writes can be lost on power loss, per Jepsen's 2025 analysis of NATS 2.12)
against an fsync before every acknowledgement, in one run, on the same disk.

    .venv/bin/python bench/nats_sync.py [--writes 400] [--repeat 3] [--concurrency 8] [--json PATH]

For each repeat and each setting it starts a fresh nats-server (the one Ferry ships) on a fresh
store directory beside Ferry's data (the disk of --data-dir), writes a Ferry-sized record (a Job,
about 1 KiB) --writes times one after another (latency: what one state change waits), then as many
again --concurrency at a time (throughput: what a busy scheduler can do), and reports medians and
every sample. Ferry writes about 6 KV records per submitted job and 4 per checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from benchkit import machine, median

from ferry.common.models import Job
from ferry.common.ports import free_port
from ferry.common.wire import encode

BIN = Path(sys.executable).parent


async def _quiet(exc: Exception) -> None:  # the server is still starting: the loop retries
    return None


async def one_run(store: Path, sync: str | None, writes: int, concurrency: int) -> dict[str, float]:
    port = free_port()
    conf = store / "nats.conf"
    lines = [f"listen: 127.0.0.1:{port}", "jetstream {", f'  store_dir: "{store / "js"}"']
    if sync:
        lines.append(f"  sync_interval: {sync}")
    conf.write_text("\n".join([*lines, "}"]) + "\n")
    server = await asyncio.create_subprocess_exec(str(BIN / "nats-server"), "-c", str(conf),
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, error_cb=_quiet,
                                        allow_reconnect=False)
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise SystemExit("nats-server did not start")
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="bench", history=5)
        body = encode(Job(id="job-0123456789ab", name="bench", argv=["python", "train.py", "--steps", "400"],
                          env={f"VAR{i}": "x" * 20 for i in range(20)}))
        lat = []
        for i in range(writes):
            t0 = time.perf_counter()
            await kv.put(f"job-{i % 50}", body)
            lat.append(time.perf_counter() - t0)
        sem = asyncio.Semaphore(concurrency)

        async def put(i: int) -> None:
            async with sem:
                await kv.put(f"job-{i % 50}", body)

        t0 = time.perf_counter()
        await asyncio.gather(*(put(i) for i in range(writes)))
        elapsed = time.perf_counter() - t0
        await nc.close()
        lat.sort()
        return {"p50_ms": median(lat) * 1000, "p90_ms": lat[int(0.9 * len(lat))] * 1000,
                "writes_per_s": writes / elapsed}
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--data-dir", default=None, help="where the stores go (default: a temporary folder)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    base = Path(args.data_dir or tempfile.mkdtemp(prefix="ferry-nats-sync-"))
    base.mkdir(parents=True, exist_ok=True)
    samples: dict[str, list[dict[str, float]]] = {"default (2 min)": [], "always": []}
    for r in range(args.repeat):
        order = list(samples) if r % 2 == 0 else list(reversed(samples))  # alternate who goes first
        for name in order:
            store = Path(tempfile.mkdtemp(dir=base, prefix=name.split()[0] + "-"))
            sync = "always" if name == "always" else None
            samples[name].append(asyncio.run(one_run(store, sync, args.writes, args.concurrency)))
    out: dict[str, Any] = {"machine": machine(base), "writes": args.writes, "concurrency": args.concurrency,
                           "results": {}}
    print(f"| sync_interval | write p50 (ms) | write p90 (ms) | writes/s at {args.concurrency} in flight |")
    print("|---|---|---|---|")
    for name, runs in samples.items():
        med = {k: median([run[k] for run in runs]) for k in runs[0]}
        out["results"][name] = {"median": med, "samples": runs}
        print(f"| {name} | {med['p50_ms']:.2f} | {med['p90_ms']:.2f} | {med['writes_per_s']:.0f} |")
    d, a = out["results"]["default (2 min)"]["median"], out["results"]["always"]["median"]
    print(f"\nalways / default: p50 {a['p50_ms'] / d['p50_ms']:.2f}x, "
          f"throughput {a['writes_per_s'] / d['writes_per_s']:.2f}x")
    print(json.dumps(out["machine"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
