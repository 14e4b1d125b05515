"""Raw CRIU against Ferry, in one run, on identical memhog processes.

    .venv/bin/python bench/checkpoint.py [--mib 1024] [--dirty-pct 5] [--repeat 3] [--json PATH]
                                         [--data-dir DIR] [--interval S] [--no-drop-caches] [--keep]
                                         [--containers [--container-mib 64]]

It starts its own ``ferry up --nodes 2`` (a free gRPC port, data under a fresh directory) and, for
each repeat, two identical ``memhog.py --mib M --dirty-pct P`` processes: one launched for raw CRIU
the way Ferry launches (``ferry.criu.launch.launch``: a session leader, PID 1 of its own PID
namespace, stdin /dev/null, output to files), one with ``ferry run`` on node-1. It measures

1. checkpoint, leave-running: the wall time of a plain ``criu dump -t PID -D DIR -o dump.log -v4
   --leave-running`` subprocess against the wall time of ``ferry checkpoint JOB`` (the CLI, through
   the API, scheduler and checkpointer, into the cluster's local directory store);
2. restore: the wall time of a plain ``criu restore -D DIR -o restore.log -v4 -d --pidfile F
   --inherit-fd ...`` (the shim's command line) of the raw images into a new PID namespace, after
   the original was killed, against ``ferry restore JOB --node node-2`` after ``ferry checkpoint
   --stop``; the migrator's own ``restore_ms`` and the operation's ``total_ms`` are reported too;
3. incremental upload: the ``bytes_uploaded`` of the second checkpoint (the ``--stop`` one, taken
   right after exactly one memhog round) as a fraction of the first checkpoint's.

Fairness: raw and Ferry alternate which goes first in each repeat; each process is dumped right
after it printed "ready" (memhog's --interval is long enough that no round runs before the first
dump); dirty pages are written back (sync) before every measured step; the page cache is dropped
before each restore when the kernel lets us. Everything it started is stopped and its directory
removed at the end (unless --keep). Prints a Markdown table and the machine description.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import (
    BenchError,
    Cluster,
    copy_rate,
    dir_bytes,
    exit_on_sigterm,
    machine,
    median,
    read_bytes,
    run_directory,
    uptime,
    wait_for,
)

from ferry.criu.binary import find_criu
from ferry.criu.errors import ImageError
from ferry.criu.images import read_dump_stats
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import DUMP_MOUNTS, CriuRunner
from ferry.node.base import workload_env
from ferry.store.keys import KeyRing
from ferry.store.local import LocalBackend
from ferry.store.store import CheckpointStore

ROOT = Path(__file__).resolve().parent.parent
MEMHOG = ROOT / "examples" / "memhog.py"
BIN = Path(sys.executable).parent
PY = sys.executable
NODE_A, NODE_B = "node-1", "node-2"
GOAL_CHECKPOINT = 1.25
GOAL_RESTORE = 1.5
GOAL_INCREMENTAL = 0.10
_ROUND = re.compile(rb"^\d+ \d+$", re.MULTILINE)
_SHIM_CRIU = re.compile(r"criu restore exited 0 after (\d+) ms")


# ---- small helpers -----------------------------------------------------------------------------


def is_ready(stdout: Path) -> bool:
    return read_bytes(stdout).startswith(b"ready")


def rounds(stdout: Path) -> int:
    """How many memhog rounds the process has printed so far."""
    return len(_ROUND.findall(read_bytes(stdout)))


def settle(drop: bool) -> bool:
    """Write dirty pages back (outside any measurement); drop the page cache too when asked and allowed."""
    os.sync()
    if not drop:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def fmt_s(x: float) -> str:
    return f"{x:.2f} s"


def fmt_mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def samples_s(xs: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


# ---- the machine -------------------------------------------------------------------------------


# ---- the cluster -------------------------------------------------------------------------------


# ---- one pair of identical processes ----------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, run_dir: Path, cluster: Cluster) -> None:
        self.args = args
        self.run_dir = run_dir
        self.cluster = cluster
        self.criu = find_criu() or "criu"
        self.drop_ok = False
        self.raw_pids: set[int] = set()  # every raw workload we started or restored (for cleanup)
        self.ferry_jobs: list[str] = []

    def memhog(self, mib: int, interval: float) -> list[str]:
        return [PY, str(MEMHOG), "--mib", str(mib), "--dirty-pct", str(self.args.dirty_pct),
                "--interval", str(interval)]

    def settle(self, drop: bool = False) -> None:
        dropped = settle(drop and self.args.drop_caches)
        self.drop_ok = self.drop_ok or dropped
        if dropped:
            # Warm the two front ends again, so that the cold read measured is the images' alone.
            subprocess.run([self.criu, "--version"], capture_output=True, check=False)
            self.cluster.ferry("nodes")

    # -- raw CRIU --

    def raw_checkpoint(self, tag: str, mib: int, interval: float) -> dict[str, Any]:
        jd = JobDir(self.run_dir / "raw" / tag).create()
        images = self.run_dir / "raw" / f"{tag}-images"
        images.mkdir(parents=True)
        info = asyncio.run(launch(jd, self.memhog(mib, interval), cwd=str(ROOT), env=workload_env({}), incarnation=1))
        self.raw_pids.add(info.pid)
        wait_for(lambda: is_ready(jd.stdout), 300, f"raw memhog {tag} to print ready ({jd.stdout})")
        self.settle()
        # the job has its own mount namespace, as Ferry runs it: its host's mounts are external
        argv = [self.criu, "dump", "-t", str(info.pid), "-D", str(images), "-o", "dump.log", "-v4", "--leave-running",
                *DUMP_MOUNTS]
        t0 = time.monotonic()
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise BenchError(f"raw criu dump failed ({r.returncode}); see {images / 'dump.log'}: {r.stderr.strip()}")
        frozen_ms = None
        with contextlib.suppress(ImageError, OSError):
            frozen_ms = read_dump_stats(images / "stats-dump").frozen_time_us / 1000
        rounds_at_dump = rounds(jd.stdout)
        # The original goes away before the restore, as `ferry checkpoint --stop` ends Ferry's.
        self.kill_raw(info.pid)
        return {"wall_s": wall, "frozen_ms": frozen_ms, "image_bytes": dir_bytes(images),
                "rounds_at_dump": rounds_at_dump, "job_dir": str(jd.path), "images": str(images)}

    def raw_restore(self, ck: dict[str, Any]) -> dict[str, Any]:
        jd, images = JobDir(ck["job_dir"]), Path(ck["images"])
        pidfile = images / "restore.pid"
        self.settle(drop=True)
        fds: dict[int, str] = {}
        try:
            for f in (jd.stdout, jd.stderr):
                fds[os.open(f, os.O_WRONLY | os.O_APPEND)] = str(f)
            argv = CriuRunner(self.criu).restore_command(images, pidfile, fds)
            with open(images / "criu-restore.out", "wb") as out:
                t0 = time.monotonic()
                r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=list(fds),
                                   check=False)
                wall = time.monotonic() - t0
        finally:
            for fd in fds:
                os.close(fd)
        if r.returncode != 0:
            raise BenchError(f"raw criu restore failed ({r.returncode}); see {images / 'restore.log'}")
        pid = int(pidfile.read_text().strip())
        self.raw_pids.add(pid)
        nspid = ns_pids(pid)
        if is_gone(pid) or len(nspid) < 2 or nspid[-1] != 1:
            raise BenchError(f"raw restore: pid {pid} is not PID 1 of a new PID namespace (NSpid {nspid})")
        self.kill_raw(pid)
        shutil.rmtree(images, ignore_errors=True)
        return {"wall_s": wall}

    def kill_raw(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: is_gone(pid), 30, f"raw pid {pid} to end")
        self.raw_pids.discard(pid)

    # -- Ferry --

    def ferry_checkpoints(self, tag: str, mib: int, interval: float) -> dict[str, Any]:
        """``ferry run``; first checkpoint at "ready"; after exactly one round, ``checkpoint --stop``."""
        c = self.cluster
        # a host-network job, as raw CRIU's process is: the ratio compares like with like
        _, job = c.ferry("run", "--name", f"bench-{tag}", "--node", NODE_A, "--cwd", str(ROOT), "--network", "host",
                         "--", *self.memhog(mib, interval))
        job_id = str(job["id"])
        self.ferry_jobs.append(job_id)
        stdout = c.job_stdout(NODE_A, job_id)
        wait_for(lambda: is_ready(stdout), 300, f"ferry job bench-{tag} to print ready ({stdout})")
        self.settle()
        rounds_before_first = rounds(stdout)
        wall1, first = c.ferry("checkpoint", job_id)
        rounds_after_first = rounds(stdout)
        # The second checkpoint follows the first round after the first one (memhog's --interval
        # is chosen so that no round ran while the first checkpoint was taken).
        wait_for(lambda: rounds(stdout) > rounds_before_first, 2 * interval + 300,
                 f"a memhog round of bench-{tag}", interval=0.02)
        rounds_at_second = rounds(stdout)
        wall2, second = c.ferry("checkpoint", job_id, "--stop")
        return {"job": job_id, "wall_s": wall1, "first": first, "second": second, "second_wall_s": wall2,
                "rounds_at_first": rounds_before_first, "rounds_after_first_returned": rounds_after_first,
                "rounds_between": rounds_at_second - rounds_before_first,
                "incremental_fraction": second["bytes_uploaded"] / max(1, first["bytes_uploaded"])}

    def ferry_restore(self, ck: dict[str, Any]) -> dict[str, Any]:
        c, job_id = self.cluster, ck["job"]
        self.settle(drop=True)
        wall, out = c.ferry("restore", job_id, "--node", NODE_B)
        _, status = c.ferry("status", job_id)
        if status.get("state") != "running" or status.get("node") != NODE_B:
            raise BenchError(f"ferry restore: job {job_id} is {status.get('state')} on {status.get('node')}")
        c.ferry("kill", job_id, "--grace", "0s")
        # The shim on node-2 logs how long its `criu restore` ran: the rest of restore_ms is fetch + rebuild.
        shim_log = read_bytes(c.job_stdout(NODE_B, job_id).with_name("shim.log")).decode(errors="replace")
        found = _SHIM_CRIU.findall(shim_log)
        criu_ms = float(found[-1]) if found else None
        return {"wall_s": wall, "restore_ms": out.get("restore_ms"), "total_ms": out.get("total_ms"),
                "criu_restore_ms": criu_ms}

    # -- what sealing costs --

    def store_cost(self, tag: str, i: int, images: Path) -> dict[str, Any]:
        """The raw dump's images written to, and restored from, a local store in the data dir: plain
        and sealed (ferry.store.keys: AES-256-GCM, keyed names, a signed manifest), which one goes
        first alternating with the repeat. Ferry's own checkpoints are always sealed."""
        out: dict[str, Any] = {}
        order = [("plain", None), ("sealed", KeyRing.generate())]
        if i % 2:
            order.reverse()
        for name, ring in order:
            root = self.run_dir / f"store-{name}-{tag}"
            store = CheckpointStore(LocalBackend(root), keyring=ring)
            self.settle()
            t0 = time.monotonic()
            store.write_checkpoint(job="bench", tenant="bench", checkpoint="ck-1", parent=None, src_dir=images,
                                   files=sorted(str(p.relative_to(images)) for p in images.rglob("*.img")))
            write_s = time.monotonic() - t0
            dest = self.run_dir / f"restored-{name}-{tag}"
            self.settle(drop=True)
            t0 = time.monotonic()
            store.restore_files(store.read_manifest("bench", "ck-1", "bench"), dest)
            read_s = time.monotonic() - t0
            out[name] = {"write_s": write_s, "restore_s": read_s}
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
        return out

    # -- a whole repeat --

    def repeat(self, i: int, mib: int, interval: float) -> dict[str, Any]:
        tag = f"{mib}m-{i}-{os.getpid()}"
        raw_first = i % 2 == 0
        rate = copy_rate()
        if raw_first:
            raw_ck = self.raw_checkpoint(tag, mib, interval)
            sealing = self.store_cost(tag, i, Path(raw_ck["images"]))  # before the restore uses the images
            fer_ck = self.ferry_checkpoints(tag, mib, interval)
            raw_rs = self.raw_restore(raw_ck)
            fer_rs = self.ferry_restore(fer_ck)
        else:
            fer_ck = self.ferry_checkpoints(tag, mib, interval)
            raw_ck = self.raw_checkpoint(tag, mib, interval)
            sealing = self.store_cost(tag, i, Path(raw_ck["images"]))
            fer_rs = self.ferry_restore(fer_ck)
            raw_rs = self.raw_restore(raw_ck)
        shutil.rmtree(raw_ck["job_dir"], ignore_errors=True)
        return {"first": "raw" if raw_first else "ferry", "copy_gibs": rate, "raw_checkpoint": raw_ck,
                "ferry_checkpoint": fer_ck,
                "raw_restore": raw_rs, "ferry_restore": fer_rs, "sealing": sealing}

    def cleanup(self) -> None:
        for pid in list(self.raw_pids):
            with contextlib.suppress(ProcessLookupError, BenchError):
                self.kill_raw(pid)


# ---- the report --------------------------------------------------------------------------------


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    raw_ck = [s["raw_checkpoint"]["wall_s"] for s in samples]
    fer_ck = [s["ferry_checkpoint"]["wall_s"] for s in samples]
    raw_rs = [s["raw_restore"]["wall_s"] for s in samples]
    fer_rs = [s["ferry_restore"]["wall_s"] for s in samples]
    firsts = [s["ferry_checkpoint"]["first"] for s in samples]
    seconds = [s["ferry_checkpoint"]["second"] for s in samples]
    inc = [s["ferry_checkpoint"]["incremental_fraction"] for s in samples]
    rs = [s["ferry_restore"] for s in samples]
    raw_frozen = [s["raw_checkpoint"]["frozen_ms"] for s in samples if s["raw_checkpoint"]["frozen_ms"] is not None]
    return {
        "checkpoint": {"raw_s": raw_ck, "ferry_s": fer_ck, "raw_median_s": median(raw_ck),
                       "ferry_median_s": median(fer_ck), "ratio": median(fer_ck) / median(raw_ck),
                       "goal": GOAL_CHECKPOINT,
                       "paired_ratios": [f / r for f, r in zip(fer_ck, raw_ck, strict=True)]},
        "restore": {"raw_s": raw_rs, "ferry_s": fer_rs, "raw_median_s": median(raw_rs),
                    "ferry_median_s": median(fer_rs), "ratio": median(fer_rs) / median(raw_rs),
                    "goal": GOAL_RESTORE,
                    "paired_ratios": [f / r for f, r in zip(fer_rs, raw_rs, strict=True)],
                    "migrator_restore_ms": [r["restore_ms"] for r in rs],
                    "op_total_ms": [r["total_ms"] for r in rs],
                    "criu_restore_ms": [r["criu_restore_ms"] for r in rs]},
        "incremental": {"fractions": inc, "median": median(inc), "goal": GOAL_INCREMENTAL,
                        "first_bytes_uploaded": [c["bytes_uploaded"] for c in firsts],
                        "second_bytes_uploaded": [c["bytes_uploaded"] for c in seconds],
                        "rounds_between": [s["ferry_checkpoint"]["rounds_between"] for s in samples]},
        "ferry_checkpoint_parts_ms": {k: [float(c[k]) for c in firsts]
                                      for k in ("freeze_ms", "dump_ms", "upload_ms", "total_ms")},
        "raw_frozen_ms": raw_frozen,
        "sealing": {f"{kind}_{what}": [s["sealing"][kind][what] for s in samples]
                    for kind in ("plain", "sealed") for what in ("write_s", "restore_s")},
        "raw_image_bytes": [s["raw_checkpoint"]["image_bytes"] for s in samples],
        "ferry_bytes_logical": [c["bytes_logical"] for c in firsts],
    }


def markdown(result: dict[str, Any]) -> str:
    s, cfg, m = result["summary"], result["config"], result["machine"]
    ck, rs, inc = s["checkpoint"], s["restore"], s["incremental"]
    parts = s["ferry_checkpoint_parts_ms"]
    seal = s["sealing"]
    n = cfg["repeat"]

    def met(ok: bool) -> str:
        return "yes" if ok else "**no**"

    med_ms = {k: median(v) for k, v in parts.items()}
    restore_ms = median([float(x) for x in rs["migrator_restore_ms"] if x is not None])
    op_ms = median([float(x) for x in rs["op_total_ms"] if x is not None])
    criu_ms = median([float(x) for x in rs["criu_restore_ms"] if x is not None])
    lines = [
        f"memhog.py --mib {cfg['mib']} --dirty-pct {cfg['dirty_pct']} --interval {cfg['interval']:g}; "
        f"median of {n} (samples in brackets); raw and Ferry alternate which goes first.",
        "",
        "| metric | raw CRIU | Ferry | ratio | goal | met? |",
        "|---|---|---|---|---|---|",
        f"| checkpoint, leave running: wall time (`criu dump` vs `ferry checkpoint`) | {fmt_s(ck['raw_median_s'])} "
        f"[{samples_s(ck['raw_s'])}] | {fmt_s(ck['ferry_median_s'])} [{samples_s(ck['ferry_s'])}] | "
        f"{ck['ratio']:.2f}x | <= {GOAL_CHECKPOINT}x | {met(ck['ratio'] <= GOAL_CHECKPOINT)} |",
        f"| restore into a new PID namespace: wall time (`criu restore -d` vs `ferry restore --node {NODE_B}`) | "
        f"{fmt_s(rs['raw_median_s'])} [{samples_s(rs['raw_s'])}] | {fmt_s(rs['ferry_median_s'])} "
        f"[{samples_s(rs['ferry_s'])}] | {rs['ratio']:.2f}x | <= {GOAL_RESTORE}x "
        f"| {met(rs['ratio'] <= GOAL_RESTORE)} |",
        f"| second checkpoint after one round at {cfg['dirty_pct']:g}% dirty: bytes uploaded / first checkpoint's "
        f"| - | {inc['median']:.1%} [{', '.join(f'{x:.1%}' for x in inc['fractions'])}] "
        f"({fmt_mib(median([float(x) for x in inc['second_bytes_uploaded']]))} of "
        f"{fmt_mib(median([float(x) for x in inc['first_bytes_uploaded']]))}) | - | <= {GOAL_INCREMENTAL:.0%} "
        f"| {met(inc['median'] <= GOAL_INCREMENTAL)} |",
        f"| frozen time during the checkpoint (CRIU stats-dump / Ferry freeze_ms) | "
        f"{median(s['raw_frozen_ms']):.0f} ms | {med_ms['freeze_ms']:.0f} ms | "
        f"{med_ms['freeze_ms'] / median(s['raw_frozen_ms']):.2f}x | - | - |",
        f"| Ferry checkpoint, its parts: criu dump / upload to the store / checkpointer total "
        f"(ratio: checkpointer total vs raw) | - | {med_ms['dump_ms']:.0f} / {med_ms['upload_ms']:.0f} / "
        f"{med_ms['total_ms']:.0f} ms | {med_ms['total_ms'] / 1000 / ck['raw_median_s']:.2f}x | - | - |",
        f"| Ferry restore, its parts: `criu restore` in the shim / migrator restore_ms (fetch + rebuild + criu "
        f"restore) / operation total_ms (ratio: restore_ms vs raw) | - | {criu_ms:.0f} / {restore_ms:.0f} / "
        f"{op_ms:.0f} ms "
        f"| {restore_ms / 1000 / rs['raw_median_s']:.2f}x | - | - |",
        f"| what sealing costs: the raw images into a local store, plain vs sealed (AES-256-GCM, keyed names, "
        f"signed manifest): write | {fmt_s(median(seal['plain_write_s']))} [{samples_s(seal['plain_write_s'])}] | "
        f"{fmt_s(median(seal['sealed_write_s']))} [{samples_s(seal['sealed_write_s'])}] | "
        f"{median(seal['sealed_write_s']) / median(seal['plain_write_s']):.2f}x | - | - |",
        f"| ... and restore from it | {fmt_s(median(seal['plain_restore_s']))} [{samples_s(seal['plain_restore_s'])}] "
        f"| {fmt_s(median(seal['sealed_restore_s']))} [{samples_s(seal['sealed_restore_s'])}] | "
        f"{median(seal['sealed_restore_s']) / median(seal['plain_restore_s']):.2f}x | - | - |",
        f"| CLI + API round trip floor (`ferry nodes`) | - | {median(result['cli_floor_s']) * 1000:.0f} ms "
        "| - | - | - |",
        "",
        f"Rounds between the two Ferry checkpoints: {inc['rounds_between']}. Image size: raw "
        f"{fmt_mib(median([float(x) for x in s['raw_image_bytes']]))}, Ferry logical "
        f"{fmt_mib(median([float(x) for x in s['ferry_bytes_logical']]))}. Paired ratios (Ferry/raw per repeat): "
        f"checkpoint {', '.join(f'{x:.2f}' for x in ck['paired_ratios'])}; restore "
        f"{', '.join(f'{x:.2f}' for x in rs['paired_ratios'])}.",
        f"Page cache dropped before each restore: {'yes' if result['page_cache_dropped'] else 'no (not allowed)'}"
        "; dirty pages synced before every measured step. Memory copy rate at the start of each repeat "
        f"(`benchkit.copy_rate`): {', '.join(format(x['copy_gibs'], '.2f') for x in result['samples'])} GiB/s.",
        "",
        "Machine:",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores; RAM {m['memory_gib']} GiB; kernel {m['kernel']}; {m['criu']}; "
        f"Python {m['python']}",
        f"- data dir {m['data_dir']}: `{m['disk']}` (df -h: source fstype size used avail target)",
        f"- load before: `{result['load_before']}`",
        f"- load after: `{result['load_after']}`",
        f"- run took {result['elapsed_s']:.0f} s",
    ]
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=1024, help="memhog size in MiB (default 1024)")
    p.add_argument("--dirty-pct", type=float, default=5.0, help="memhog's --dirty-pct (default 5)")
    p.add_argument("--repeat", type=int, default=3, help="repeats; the median is reported (default 3)")
    p.add_argument("--interval", type=float, default=None,
                   help="memhog's --interval in s; must exceed one Ferry checkpoint (default: max(8, mib/80))")
    p.add_argument("--json", help="also write the results (all samples) to this JSON file")
    p.add_argument("--data-dir", help="where the run directory goes (default: the system's temp dir)")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                   help="do not drop the page cache before the restores")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the small unrecorded round that warms both paths first")
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs, store) for inspection")
    p.add_argument("--containers", action="store_true", help="also compare `ferry checkpoint` of a container "
                   "(`ferry run --bundle`) with a raw `runc checkpoint` of an identical one (bench/containerbench.py)")
    p.add_argument("--container-mib", type=int, default=64, help="memory the containers hold (default 64)")
    args = p.parse_args(argv)
    if args.mib < 1 or args.repeat < 1 or not 0 < args.dirty_pct <= 100:
        p.error("need --mib >= 1, --repeat >= 1 and 0 < --dirty-pct <= 100")
    if args.interval is None:
        args.interval = max(8.0, args.mib / 80)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    if find_criu() is None:
        print("criu not found: run ./setup.sh", file=sys.stderr)
        return 1
    started = time.monotonic()
    load_before = uptime()
    with run_directory(args.data_dir, args.keep, "ferry-bench-") as run_dir:
        cluster = Cluster(run_dir / "cluster")
        bench = Bench(args, run_dir, cluster)
        try:
            print(f"starting ferry up in {cluster.data_dir} ...", file=sys.stderr, flush=True)
            cluster.start()
            if args.warmup:
                print("warm-up (16 MiB, not recorded) ...", file=sys.stderr, flush=True)
                bench.repeat(-1, min(16, args.mib), 3.0)
            samples = []
            for i in range(args.repeat):
                print(f"repeat {i + 1}/{args.repeat} ({args.mib} MiB) ...", file=sys.stderr, flush=True)
                samples.append(bench.repeat(i, args.mib, args.interval))
                last = samples[-1]
                print(f"  checkpoint raw {last['raw_checkpoint']['wall_s']:.2f} s, ferry "
                      f"{last['ferry_checkpoint']['wall_s']:.2f} s; restore raw {last['raw_restore']['wall_s']:.2f} s, "
                      f"ferry {last['ferry_restore']['wall_s']:.2f} s; incremental "
                      f"{last['ferry_checkpoint']['incremental_fraction']:.1%}", file=sys.stderr, flush=True)
            containers = None
            if args.containers:
                import containerbench  # runc and the busybox bundle load only for --containers

                print(f"containers ({args.container_mib} MiB) ...", file=sys.stderr, flush=True)
                containers = containerbench.run(cluster, run_dir, args.container_mib, args.repeat,
                                                lambda job: cluster.logs(job))
            cli_floor = [cluster.ferry("nodes")[0] for _ in range(3)]
            mach = machine(run_dir)
        finally:
            bench.cleanup()
            cluster.stop()
    result = {
        "config": {"mib": args.mib, "dirty_pct": args.dirty_pct, "repeat": args.repeat, "interval": args.interval,
                   "drop_caches": args.drop_caches, "warmup": args.warmup},
        "machine": mach,
        "load_before": load_before,
        "load_after": uptime(),
        "page_cache_dropped": bench.drop_ok,
        "cli_floor_s": cli_floor,
        "elapsed_s": time.monotonic() - started,
        "samples": samples,
        "summary": summarize(samples),
        "containers": containers,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    if containers is not None:
        import containerbench

        print("\n".join(containerbench.markdown(containers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
