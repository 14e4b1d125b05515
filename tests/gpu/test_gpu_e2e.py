"""GPU checkpoint and restore on a real NVIDIA GPU: a CUDA PyTorch training loop checkpointed midway
and restored continues exactly as an uninterrupted run, and the GPU times and sizes are printed.

These tests skip only when this machine has no NVIDIA GPU (``nvidia-smi -L`` lists none). With a GPU,
whatever else is missing (CRIU, a CUDA build of torch, nvidia-ml-py, cuda-python or cuda-checkpoint,
a driver older than 570) is a failure that says what to install: ``tests/gpu/run_gpu_check.sh``
installs all of it and runs them.

- ``test_library_*`` drives ``ferry.gpu`` and ``ferry.criu`` directly (no services): the GPU path itself.
- ``test_cli_*`` runs the job through ``ferry up`` and the real CLI (``ferry run --gpus 1``, ``ferry
  checkpoint``, ``ferry restore``), as a user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PY, Cluster, start_cluster, stop_cluster

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train_cuda.py"
STEPS = 300


def nvidia_gpus() -> list[str]:
    """The lines of ``nvidia-smi -L`` ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"), or none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


GPUS = nvidia_gpus()
pytestmark = [
    pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU on this machine (nvidia-smi -L lists none): "
                                        "the GPU checkpoint tests need one"),
    pytest.mark.criu,
    pytest.mark.timeout(1200),
]


def first_gpu_uuid() -> str:
    return GPUS[0].rsplit("UUID: ", 1)[1].rstrip(")")


def train_argv(steps: int = STEPS) -> list[str]:
    return [PY, str(TRAIN), "--steps", str(steps), "--sleep", "0.02", "--width", "2048", "--hold-mib", "512"]


@pytest.fixture(scope="module")
def gpu_ready() -> str:
    """The driver version; fails (never skips) when the GPU path lacks something."""
    from ferry.gpu.compat import MIN_DRIVER_MAJOR, driver_major
    from ferry.gpu.nvml import RealNvml, read_inventory

    inv = read_inventory(RealNvml())
    if inv.error or not inv.gpus:
        pytest.fail(f"NVML sees no GPU ({inv.error or 'is nvidia-ml-py installed?'}): run tests/gpu/run_gpu_check.sh",
                    pytrace=False)
    major = driver_major(inv.driver_version)
    if major is None or major < MIN_DRIVER_MAJOR:
        pytest.fail(f"NVIDIA driver {inv.driver_version} is older than {MIN_DRIVER_MAJOR}: no CUDA checkpoint API",
                    pytrace=False)
    probe = subprocess.run([PY, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA'"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.fail(f"{PY} has no CUDA build of torch ({probe.stderr.strip()[-200:]}): "
                    "run tests/gpu/run_gpu_check.sh", pytrace=False)
    assert inv.driver_version is not None
    return inv.driver_version


@pytest.fixture(scope="module")
def reference() -> str:
    """The output of an uninterrupted run on the same GPU."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": first_gpu_uuid()}
    out = subprocess.run(train_argv(), capture_output=True, text=True, timeout=900, check=True, env=env)
    return out.stdout


def report(capsys: pytest.CaptureFixture[str], title: str, values: dict[str, Any]) -> None:
    """Prints the measurements (even without -s) and appends them to $FERRY_GPU_REPORT when set."""
    with capsys.disabled():
        print(f"\n== {title}")
        for key, value in values.items():
            shown = f"{value / 2**20:.1f} MiB" if key.endswith("bytes") and isinstance(value, int) else value
            shown = f"{value:.1f} ms" if key.endswith("_ms") and isinstance(value, float) else shown
            print(f"   {key:28} {shown}")
    path = os.environ.get("FERRY_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": title, **values}) + "\n")


# -- the library path -------------------------------------------------------------------------------


async def _wait_lines(path: Path, n: int, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().count("\n") >= n):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {n} lines in {path}")
        await asyncio.sleep(0.1)


async def test_library_gpu_checkpoint_restore_continues_identically(
    tmp_path: Path, criu_bin: str, gpu_ready: str, reference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ferry.criu.jobdir import JobDir
    from ferry.criu.launch import launch, restore
    from ferry.criu.runner import CriuRunner
    from ferry.criu.treekill import kill_tree
    from ferry.gpu.compat import check_restore_target, device_map, snapshot_of
    from ferry.gpu.cuda_checkpoint import (
        default_checkpointer,
        resume_after_dump,
        resume_after_restore,
        suspend_for_dump,
    )
    from ferry.gpu.nvml import RealNvml, read_inventory
    from ferry.gpu.placement import GpuRequest, assign, cuda_visible_devices

    nvml = RealNvml()
    ckpt = default_checkpointer()
    runner = CriuRunner(criu_bin)
    gpus = assign(GpuRequest(count=1), read_inventory(nvml).gpus)
    assert isinstance(gpus, list), gpus
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_VISIBLE_DEVICES": cuda_visible_devices(gpus)}
    src = JobDir(tmp_path / "src")
    info = await launch(src, train_argv(), cwd=tmp_path, env=env, incarnation=1)
    try:
        await _wait_lines(src.stdout, 40)
        # 1. a leave-running checkpoint: suspend CUDA, dump, resume in place
        t0 = time.monotonic()
        first = await suspend_for_dump(info.pid, ckpt, nvml=nvml)
        dump1 = await runner.dump(info.pid, tmp_path / "images-1", leave_running=True,
                                  record_sizes=[src.stdout, src.stderr])
        resumed = await resume_after_dump(info.pid, ckpt, pids=first.pids)
        leave_running_ms = (time.monotonic() - t0) * 1000
        assert first.pids and first.gpu_bytes >= 512 << 20, first
        # 2. a final checkpoint: suspend, dump (CRIU kills the tree), restore elsewhere, resume there
        await _wait_lines(src.stdout, 120)
        second = await suspend_for_dump(info.pid, ckpt, nvml=nvml)
        dump2 = await runner.dump(info.pid, tmp_path / "images-2", leave_running=False,
                                  record_sizes=[src.stdout, src.stderr])
    finally:
        await kill_tree(info.pid, 0)
    snapshot = snapshot_of(gpus, gpu_ready)
    target = read_inventory(nvml).gpus
    check_restore_target(snapshot, target[:1], read_inventory(nvml).driver_version)
    dst = JobDir(tmp_path / "dst")
    dst.create()
    inherit = {}
    for name, path in (("stdout", src.stdout), ("stderr", src.stderr)):
        (dst.path / name).write_bytes(path.read_bytes()[: dump2.file_sizes[str(path)]])
        inherit[name] = str(path)
    t0 = time.monotonic()
    restored = await restore(dst, tmp_path / "images-2", inherit=inherit, incarnation=2, criu_bin=criu_bin)
    criu_restore_ms = (time.monotonic() - t0) * 1000
    try:
        back = await resume_after_restore(restored.pid, ckpt, device_map(snapshot.uuids, target[:1]),
                                          expect=len(second.pids))
        deadline = time.monotonic() + 600
        while dst.read_exit() is None:
            assert time.monotonic() < deadline, "the restored job did not finish"
            await asyncio.sleep(0.2)
    finally:
        await kill_tree(restored.pid, 0)
    ended = dst.read_exit()
    assert ended is not None and ended.code == 0, (ended, dst.stderr.read_text()[-2000:])
    assert dst.stdout.read_text().splitlines() == reference.splitlines()
    images = sum(f.stat().st_size for f in (tmp_path / "images-2").rglob("*") if f.is_file())
    report(capsys, "library: GPU checkpoint and restore (train_cuda.py, 512 MiB held)", {
        "gpu": gpus[0].model,
        "checkpointer": type(ckpt).__name__,
        "gpu_bytes": second.gpu_bytes,
        "images_bytes": images,
        "gpu_lock_ms": second.lock_ms,
        "gpu_checkpoint_ms": second.checkpoint_ms,
        "criu_dump_ms": dump2.wall_ms,
        "criu_restore_ms": criu_restore_ms,
        "gpu_restore_ms": back.restore_ms,
        "gpu_unlock_ms": back.unlock_ms,
        "leave_running_total_ms": leave_running_ms,
        "leave_running_dump_ms": dump1.wall_ms,
        "leave_running_gpu_restore_ms": resumed.restore_ms,
    })


# -- through ferry up and the CLI -------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_cluster(criu_bin: str, gpu_ready: str) -> Iterator[Cluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-gpu-e2e-"))
    cluster = start_cluster(data_dir, nodes=1)
    yield cluster
    stop_cluster(cluster)


def test_cli_node_reports_its_gpus(gpu_cluster: Cluster) -> None:
    (node,) = gpu_cluster.json("nodes")
    assert node["gpus"] >= 1
    assert first_gpu_uuid() in json.dumps(node), "the GPU inventory is missing from `ferry nodes -o json`"


def test_cli_more_gpus_than_any_node_stays_pending_with_the_reason(gpu_cluster: Cluster) -> None:
    job = gpu_cluster.json("run", "--name", "gpu-too-many", "--gpus", str(len(GPUS) + 7), "--", PY, "-c", "pass")
    assert job["state"] == "pending"
    status = gpu_cluster.json("status", "gpu-too-many")
    assert status["state"] == "pending" and "GPU" in (status.get("reason") or "")
    gpu_cluster.ferry("kill", "gpu-too-many")


def test_cli_gpu_job_checkpointed_and_restored_continues_identically(
    gpu_cluster: Cluster, reference: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = gpu_cluster.json("run", "--name", "gpu-train", "--gpus", "1", "--", *train_argv())
    assert job["state"] == "running"
    machine = {g.rsplit("UUID: ", 1)[1].rstrip(")") for g in GPUS}
    assigned = gpu_cluster.json("status", "gpu-train")["gpu_uuids"]
    assert len(assigned) == 1 and assigned[0] in machine, (assigned, machine)
    gpu_cluster.wait_lines("gpu-train", 40, timeout=300)
    mid = gpu_cluster.json("checkpoint", "gpu-train", timeout=600)  # leave-running
    assert mid["state"] == "committed" and mid.get("gpu_bytes", 0) >= 512 << 20, mid
    gpu_cluster.wait_lines("gpu-train", 120, timeout=300)
    final = gpu_cluster.json("checkpoint", "gpu-train", "--stop", timeout=600)
    assert final["state"] == "committed" and final["final"] is True, final
    t0 = time.monotonic()
    moved = gpu_cluster.json("restore", "gpu-train", "--node", "node-1", timeout=600)
    restore_wall_ms = (time.monotonic() - t0) * 1000
    assert moved["state"] == "running", moved
    done = gpu_cluster.ferry("wait", "gpu-train", "--timeout", "900", timeout=960)
    assert done.returncode == 0, gpu_cluster.ferry("logs", "gpu-train", check=False).stdout[-2000:]
    assert gpu_cluster.logs("gpu-train").splitlines() == reference.splitlines()
    values: dict[str, Any] = {k: v for k, v in final.items() if k.startswith("gpu") or k.endswith(("_ms", "bytes"))}
    values["restore_wall_ms"] = restore_wall_ms
    values.update({f"restore_{k}": v for k, v in moved.items() if "gpu" in k or k.endswith("_ms")})
    report(capsys, "ferry CLI: GPU checkpoint --stop and restore (train_cuda.py, 512 MiB held)", values)
