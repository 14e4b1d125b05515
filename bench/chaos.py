"""Chaos: N random faults over M job lifecycles of the shared workloads, on a real cluster.

    .venv/bin/python bench/chaos.py [--faults 20] [--jobs 6] [--seed 1] [--nodes 3] [--json PATH] [--keep]

It starts its own ``ferry up`` (fast heartbeats: a loss is noticed after 3 s) and runs the jobs one
after another, alternating the shared ``train.py`` and ``memhog.py``, each with periodic checkpoints
every 2 s. While a job runs, its share of the faults hits at random moments, mixed with ordinary
operations (a checkpoint, a cold move). The faults:

    kill-service   SIGKILL of a random service (api, scheduler, health, pricing, a checkpointer or
                   migrator); ``ferry up`` starts it again
    pause-service  SIGSTOP of a random service for 2 to 6 s, then SIGCONT
    kill-nats      SIGKILL of the NATS server; ``ferry up`` starts it again
    kill-node      ``ferry chaos kill-node``: a node's services and workloads die, the node stays dead
                   (at most nodes - 1 times per run)
    corrupt-chunk  one byte flipped in a random chunk of the store
    delete-chunk   a random chunk removed from the store
    store-outage   the store's chunks folder read-only for 3 to 8 s (a read-only bind mount over it):
                   every write fails as with a store that refuses writes, reads go on
    full-disk      the disk under the cluster's state (NATS' stores and the checkpoint store) filled
                   to the last byte for 3 to 8 s, then freed. That disk is a 3 GiB tmpfs of this run;
                   the nodes' work directories, where the jobs write their output, are bind-mounted
                   from the host's disk (a job whose own disk is full fails by itself, which no
                   checkpoint can help)

After each job it checks: the job ended ``succeeded`` (else *lost*, or *stuck* when it had not
ended after 5 minutes), its output is identical to an uninterrupted run of the same command (else
*corrupt*), no two copies of it ever ran at once (a sampler counts its running processes every
0.1 s: else *duplicated*), and no process of it is left afterwards, stopped or not (else *stuck*).
Each goal is 0. Prints the counts, every fault with its time, and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from benchkit import machine, run_directory, uptime

from ferry.sim.copies import CopyCounter, copies_of

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FERRY_SHARED_DIR", ROOT.parent / "shared")) / "workloads"
WORKLOADS = SHARED if SHARED.is_dir() else ROOT / "examples"
PY = sys.executable
FERRY = str(Path(PY).parent / "ferry")
FAST = {"FERRY_HEARTBEAT_TIMEOUT_S": "3", "FERRY_HEARTBEAT_INTERVAL_S": "0.5", "FERRY_REBALANCE_EVERY_S": "600"}
FAULTS = ("kill-service", "pause-service", "kill-nats", "kill-node", "corrupt-chunk", "delete-chunk", "store-outage",
          "full-disk")
STATE_DISK = "3g"  # the tmpfs that holds the cluster's state: NATS' stores and the checkpoint store


def workload(i: int) -> list[str]:
    if i % 2 == 0:
        return [PY, str(WORKLOADS / "train.py"), "--steps", "600", "--sleep", "0.05", "--width", "256"]
    memhog = WORKLOADS / "memhog.py"  # both run about 30 s: longer than a job's share of the faults
    return [PY, str(memhog), "--mib", "48", "--rounds", "300", "--interval", "0.1", "--dirty-pct", "5"]


class Cluster:
    def __init__(self, data: Path, nodes: int, keep: bool = False) -> None:
        self.data, self.keep = data, keep
        self.host_nodes = data.parent / f"{data.name}-nodes"  # the nodes' work dirs, on the host's disk
        self.host_nodes.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_DISK},mode=0700", "tmpfs", str(data)], check=True)
        (data / "nodes").mkdir()
        subprocess.run(["mount", "--bind", str(self.host_nodes), str(data / "nodes")], check=True)
        port = _free_port()
        self.env = {**os.environ, **FAST, "FERRY_ADDR": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([FERRY, "up", "--nodes", str(nodes), "--data-dir", str(data), "--grpc",
                                      f"127.0.0.1:{port}"], env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "ready" in line:
                break
        else:
            raise SystemExit("chaos: ferry up did not become ready")
        self.restarts: list[str] = []  # `ferry up`'s lines for the services it started again
        threading.Thread(target=self._drain, daemon=True).start()  # keep the pipe drained

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "starting it again" in line:
                self.restarts.append(line.strip())

    def ferry(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([FERRY, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([FERRY, *args], 124, "", "timed out")

    def json(self, *args: str) -> Any:
        out = self.ferry(args[0], "-o", "json", *args[1:])
        return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else None

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.data / "up.json").read_text()))

    def stop(self) -> None:
        chunks = self.data / "store" / "chunks"
        while os.path.ismount(chunks):  # a store outage still under way
            subprocess.run(["umount", "-l", str(chunks)], check=False)
        (self.data / "ballast").unlink(missing_ok=True)  # a full disk still under way
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.keep:  # what the tmpfs held, for a look afterwards
            shutil.copytree(self.data, self.data.parent / f"{self.data.name}-state", symlinks=True,
                            ignore=shutil.ignore_patterns("nodes"), dirs_exist_ok=True)
        subprocess.run(["umount", "-l", str(self.data / "nodes")], check=False)
        subprocess.run(["umount", "-l", str(self.data)], check=False)
        if not self.keep:
            shutil.rmtree(self.host_nodes, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # killed meanwhile (a node killed by a later fault)
        os.kill(pid, signal.SIGCONT)


def inject(c: Cluster, kind: str, rng: random.Random, dead: set[str], nodes: list[str]) -> str:
    # the services running now: one killed by an earlier fault may not be started again yet
    # (`ferry up` writes its new pid when it is), and its old pid names no process
    services = {k: v for k, v in c.state()["services"].items()
                if v and k != "nats" and not k.startswith("metadata@") and k.partition("@")[2] not in dead
                and _running(v)}
    if kind in ("kill-service", "pause-service"):
        name = rng.choice(sorted(services))
        if kind == "kill-service":
            os.kill(services[name], signal.SIGKILL)
            return f"SIGKILL {name}"
        pause = rng.uniform(2, 6)
        os.kill(services[name], signal.SIGSTOP)
        threading.Timer(pause, _resume, (services[name],)).start()
        return f"SIGSTOP {name} for {pause:.1f}s"
    if kind == "kill-nats":
        os.kill(c.state()["services"]["nats"], signal.SIGKILL)
        return "SIGKILL nats"
    if kind == "kill-node":
        alive = [n for n in nodes if n not in dead]
        if len(alive) < 2:
            return inject(c, "kill-service", rng, dead, nodes)
        node = rng.choice(alive)
        dead.add(node)
        c.ferry("chaos", "kill-node", node)
        return f"kill-node {node}"
    if kind == "store-outage":
        folder = c.data / "store" / "chunks"
        if not folder.is_dir():
            return inject(c, "kill-service", rng, dead, nodes)
        outage = rng.uniform(3, 8)
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        threading.Timer(outage, lambda: subprocess.run(["umount", "-l", str(folder)], check=False)).start()
        return f"store read-only for {outage:.1f}s"
    if kind == "full-disk":
        hold = rng.uniform(3, 8)
        fill(c.data / "ballast")
        threading.Timer(hold, lambda: (c.data / "ballast").unlink(missing_ok=True)).start()
        return f"disk full for {hold:.1f}s"
    chunks = sorted((c.data / "store" / "chunks").glob("*"))
    if not chunks:  # nothing to damage yet: hit a service instead
        return inject(c, "kill-service", rng, dead, nodes)
    victim = rng.choice(chunks)
    if kind == "delete-chunk":
        victim.unlink(missing_ok=True)
        return f"deleted chunk {victim.name[:12]}"
    data = bytearray(victim.read_bytes())
    data[rng.randrange(len(data))] ^= 0xFF
    victim.write_bytes(bytes(data))
    return f"corrupted chunk {victim.name[:12]}"


def fill(path: Path) -> None:
    """Writes `path` until not one more byte fits."""
    block = b"\0" * (1 << 20)
    with open(path, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            while True:
                try:
                    f.write(block[:size])
                except OSError:
                    break


def _kind_of(what: str) -> str:
    """The fault that really hit (inject falls back to another when its first pick cannot)."""
    for prefix, kind in (("SIGKILL nats", "kill-nats"), ("SIGKILL", "kill-service"), ("SIGSTOP", "pause-service"),
                         ("kill-node", "kill-node"), ("corrupted", "corrupt-chunk"), ("deleted", "delete-chunk"),
                         ("store read-only", "store-outage"), ("disk full", "full-disk")):
        if what.startswith(prefix):
            return kind
    raise AssertionError(what)


def operate(c: Cluster, name: str, rng: random.Random, dead: set[str], nodes: list[str]) -> str:
    """An ordinary operation between faults: it may fail under a fault, which is fine."""
    if rng.random() < 0.5:
        out = c.ferry("checkpoint", name)
        return f"checkpoint {name}: {_outcome(out)}"
    status = c.json("status", name) or {}
    others = [n for n in nodes if n not in dead and n != status.get("node")]
    if status.get("state") != "running" or not others:
        return f"no move of {name} ({status.get('state')})"
    target = rng.choice(others)
    out = c.ferry("migrate", name, "--to", target)
    return f"migrate {name} to {target}: {_outcome(out)}"


def _outcome(out: subprocess.CompletedProcess[str]) -> str:
    return "ok" if out.returncode == 0 else f"exit {out.returncode}: {(out.stderr.strip() or '?')[:160]}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    nodes = [f"node-{i}" for i in range(1, args.nodes + 1)]
    counts = {"lost": 0, "duplicated": 0, "stuck": 0, "corrupt": 0}
    log: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []
    # each workload's uninterrupted output, made while the jobs run (they mostly sleep)
    pool = ThreadPoolExecutor(max_workers=2)
    references = {key: pool.submit(lambda k: subprocess.run(list(k), capture_output=True, text=True,
                                                            check=True).stdout, key)
                  for key in {tuple(workload(i)) for i in range(args.jobs)}}
    dead: set[str] = set()
    per_job = [args.faults // args.jobs + (1 if i < args.faults % args.jobs else 0) for i in range(args.jobs)]
    with run_directory(args.data_dir, args.keep, "ferry-chaos-") as data:
        c = Cluster(data, args.nodes, args.keep)
        t0 = time.monotonic()
        try:
            for i in range(args.jobs):
                argv = workload(i)
                key = tuple(argv)
                name = f"chaos-{i}"
                sampler = CopyCounter(argv, 0.1, os.getpid(), t0)  # not the reference runs: our children
                sampler.start()
                c.ferry("run", "--name", name, "--checkpoint-every", "2s", "--network", "host", "--", *argv)
                for _ in range(per_job[i]):
                    time.sleep(rng.uniform(1, 4))
                    kind = rng.choice([k for k in FAULTS if k != "kill-node" or len(dead) < args.nodes - 1])
                    what = inject(c, kind, rng, dead, nodes)
                    kind = _kind_of(what)
                    log.append({"t": round(time.monotonic() - t0, 1), "job": name, "fault": kind, "what": what})
                    time.sleep(rng.uniform(1, 3))
                    log.append({"t": round(time.monotonic() - t0, 1), "job": name,
                                "op": operate(c, name, rng, dead, nodes)})
                deadline = time.monotonic() + 300
                status: dict[str, Any] = {}
                while time.monotonic() < deadline:
                    status = c.json("status", name) or status
                    if status.get("state") in ("succeeded", "failed", "killed"):
                        break
                    if status.get("state") == "preempted":  # parked with a final checkpoint: bring it back
                        c.ferry("restore", name)
                    time.sleep(1)
                sampler.stop()
                time.sleep(1)
                found = copies_of(argv, os.getpid())
                left = (sum(c.running for c in found), sum(c.state in ('T', 't') for c in found))
                out = c.ferry("logs", name).stdout
                verdict = "ok"
                if status.get("state") not in ("succeeded", "failed", "killed"):
                    verdict = "stuck"
                elif status.get("state") != "succeeded":
                    verdict = "lost"
                elif sampler.most > 1:
                    verdict = "duplicated"
                elif out != references[key].result():
                    verdict = "corrupt"
                elif sum(left):
                    verdict = "stuck"
                if verdict != "ok":
                    counts[verdict] += 1
                jobs.append({"job": name, "workload": Path(argv[1]).name, "verdict": verdict,
                             "state": status.get("state"), "restarts": status.get("restarts"),
                             "most_copies": sampler.most, "first_many": sampler.first_many,
                             "left_running_stopped": left,
                             "faults": per_job[i]})
        finally:
            c.stop()
            pool.shutdown(cancel_futures=True)
    # every service `ferry up` had to start again, killed by a fault or ended by itself: the latter,
    # with its exit code here and its log in the kept state (--keep), is worth a look
    return {"seed": args.seed, "faults": args.faults, "jobs": args.jobs, "nodes": args.nodes, "counts": counts,
            "service_restarts": c.restarts,
            "by_kind": {k: sum(1 for e in log if e.get("fault") == k) for k in FAULTS}, "results": jobs,
            "log": log, "load": uptime(), "machine": machine(Path(args.data_dir or "/tmp"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", help="write the report here too")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's data dir")
    args = parser.parse_args()
    if args.jobs < 1 or args.faults < 0 or args.nodes < 2:
        parser.error("need --jobs >= 1, --faults >= 0 and --nodes >= 2")
    report = run(args)
    for e in report["log"]:
        print(f"{e['t']:7.1f}s {e['job']:9} " + (f"FAULT {e['what']}" if "fault" in e else e["op"]))
    for j in report["results"]:
        print(f"{j['job']:9} {j['workload']:10} {j['verdict']:10} restarts {j['restarts']}, "
              f"most copies at once {j['most_copies']}, {j['faults']} faults")
        if j["first_many"]:
            print(f"{'':9} more than one at once: " + "; ".join(j["first_many"]))
    n = report["counts"]
    print(f"\n{args.faults} faults over {args.jobs} jobs (seed {args.seed}): lost {n['lost']}, duplicated "
          f"{n['duplicated']}, stuck {n['stuck']}, corrupt {n['corrupt']}; by kind {report['by_kind']}")
    for line in report["service_restarts"]:
        print(line)
    print(f"load: {report['load']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    sys.exit(1 if any(n.values()) else 0)


if __name__ == "__main__":
    main()
