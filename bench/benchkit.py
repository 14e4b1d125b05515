"""What the benchmarks in bench/ share: the machine they ran on, a run directory, small helpers."""

import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ferry.common.ports import free_port
from ferry.criu.binary import find_criu

FERRY = str(Path(sys.executable).parent / "ferry")


class BenchError(Exception):
    """A step of a benchmark failed; the message says which and where to look."""


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Returns once ``predicate()`` holds; BenchError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def machine(data_dir: Path) -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    mem = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    criu = find_criu() or "criu"
    version = subprocess.run([criu, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    df = (
        subprocess.run(
            ["df", "-h", "--output=source,fstype,size,avail,target", str(data_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        .stdout.strip()
        .splitlines()
    )
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "kernel": platform.release(),
        "criu": version.splitlines()[0] if version else "unknown",
        "python": platform.python_version(),
        "data_dir": str(data_dir),
        "disk": df[-1] if df else "unknown",
        "pipe_max_size": Path("/proc/sys/fs/pipe-max-size").read_text().strip(),
    }


def copy_rate() -> float:
    """GiB/s of copying 256 MiB into fresh memory, the best of 3: what this VM's host lends its
    memory at the moment. On the 2-core VMs it varies between runs minutes apart, and CRIU's dump
    and Ferry's upload (both copies of the job's memory) vary with it; benchmarks record it with
    each sample so that their spread can be read."""
    src = bytearray(b"\x01") * (256 << 20)  # touched: not the shared zero page
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        copy = bytes(src)
        best = min(best, time.perf_counter() - t0)
        del copy
    return (256 / 1024) / best


def uptime() -> str:
    out = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return out or " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def run_directory(base: str | None, keep: bool, prefix: str) -> Iterator[Path]:
    parent = Path(base).resolve() if base else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        if keep:
            print(f"kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def add_run_arguments(parser: Any) -> None:
    """The options every cluster benchmark takes: where its run lives, keeping it, its outputs."""
    parser.add_argument("--dir", help="where the run's cluster lives (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    parser.add_argument("--json", help="write the result here as JSON")
    parser.add_argument("--md", help="write the report here as Markdown")


def machine_line(mach: dict[str, Any], load_before: str, load_after: str) -> str:
    """The report's last line: the machine and its load around the run."""
    return (f"Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB, kernel {mach['kernel']}, "
            f"Python {mach['python']}. Load before: `{load_before}`; after: `{load_after}`.")


def emit(result: dict[str, Any], report: str, json_path: str | None, md_path: str | None) -> None:
    """A benchmark's result as JSON (``--json``), its report as Markdown (``--md``), and the report printed."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        Path(md_path).write_text(report + "\n")
    print(report)


class Cluster:
    """Its own ``ferry up --nodes N`` and the ``ferry`` CLI against it."""

    def __init__(self, data_dir: Path, nodes: int = 2) -> None:
        self.data_dir = data_dir
        self.nodes = nodes
        self.addr = f"127.0.0.1:{free_port()}"
        # as a user's shell has it: Python writes its bytecode caches (a caller's PYTHONDONTWRITEBYTECODE
        # made every command compile Ferry's modules anew, 25 ms of each call)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_") and k != "PYTHONDONTWRITEBYTECODE"}
        self.env = {**env, "FERRY_ADDR": self.addr, "PYTHONUNBUFFERED": "1"}
        self.log = data_dir / "up.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [FERRY, "up", "--nodes", str(self.nodes), "--data-dir", str(self.data_dir), "--grpc", self.addr],
                env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise BenchError(f"ferry up exited with {proc.returncode}; see {self.log}")
            return b"ferry: ready" in read_bytes(self.log)

        wait_for(ready, 120, f"ferry up (log: {self.log})", interval=0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def ferry(self, *args: str, timeout: float = 600) -> tuple[float, Any]:
        """Run ``ferry <args[0]> -o json <args[1:]>``; return its wall time (s) and its JSON."""
        argv = [FERRY, args[0], "-o", "json", *args[1:]]
        t0 = time.monotonic()
        r = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout, check=False)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise BenchError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
        return wall, json.loads(r.stdout)

    def logs(self, job: str) -> str:
        r = subprocess.run([FERRY, "logs", job], env=self.env, capture_output=True, text=True, check=False)
        return r.stdout

    def job_stdout(self, node: str, job_id: str) -> Path:
        return self.data_dir / "nodes" / node / "jobs" / job_id / "stdout"


def _exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> None:
    """SIGTERM ends a benchmark as Ctrl-C does: its ``finally`` blocks stop what it started."""
    signal.signal(signal.SIGTERM, _exit)
