"""Driving the CUDA process checkpoint API around a dump and a restore, without a GPU.

``FakeCheckpointer`` is a test double with the driver's state machine (running -> locked ->
checkpointed -> locked -> running); the shipped ``DriverApiCheckpointer`` and ``CudaCheckpointTool`` are
tested against a stand-in ``cuda.bindings.driver`` module and a stand-in ``cuda-checkpoint`` binary.
"""

from __future__ import annotations

import ctypes
import enum
import os
import subprocess
import sys
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ferry.gpu import cuda_checkpoint as cc
from ferry.gpu.cuda_checkpoint import (
    CudaCheckpointTool,
    DriverApiCheckpointer,
    cuda_processes,
    default_checkpointer,
    gpu_process_ids,
    process_tree,
    resume_after_dump,
    resume_after_restore,
    suspend_for_dump,
    uses_gpu,
)
from ferry.gpu.errors import CudaCheckpointError, CudaCheckpointUnavailable
from tests.gpu_fakes import H100_0, H100_1, FakeGpu, FakeNvml

GiB = 1 << 30
CALLS = {
    "state": "cuCheckpointProcessGetState",
    "lock": "cuCheckpointProcessLock",
    "checkpoint": "cuCheckpointProcessCheckpoint",
    "restore": "cuCheckpointProcessRestore",
    "unlock": "cuCheckpointProcessUnlock",
}
MOVES = {"lock": ("running", "locked"), "checkpoint": ("locked", "checkpointed"),
         "restore": ("checkpointed", "locked"), "unlock": ("locked", "running")}


class FakeCheckpointer:
    """Test double of ``CudaCheckpointer``: the driver's per-process state machine, with scripted failures."""

    def __init__(self, states: dict[int, str], *, delay_s: float = 0.0, fail: dict[tuple[str, int], str] | None = None):
        self.states = dict(states)
        self.delay_s = delay_s
        self.fail = fail or {}
        self.calls: list[tuple[str, int]] = []
        self.maps: list[Mapping[str, str] | None] = []

    def _move(self, op: str, pid: int) -> None:
        self.calls.append((op, pid))
        time.sleep(self.delay_s)
        if (op, pid) in self.fail:
            raise CudaCheckpointError(CALLS[op], self.fail[op, pid], pid)
        before, after = MOVES[op]
        if self.states.get(pid) != before:
            raise CudaCheckpointError(CALLS[op], "CUDA_ERROR_ILLEGAL_STATE", pid)
        self.states[pid] = after

    def state(self, pid: int) -> str:
        if pid not in self.states:
            raise CudaCheckpointError(CALLS["state"], "CUDA_ERROR_NOT_INITIALIZED", pid)
        return self.states[pid]

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._move("checkpoint", pid)

    def restore(self, pid: int, device_map: Mapping[str, str] | None = None) -> None:
        self.maps.append(device_map)
        self._move("restore", pid)

    def unlock(self, pid: int) -> None:
        self._move("unlock", pid)


def nvml_with_processes() -> FakeNvml:
    return FakeNvml([
        FakeGpu(**H100_0, procs=[(100, 2 * GiB), (555, GiB)]),
        FakeGpu(**H100_1, procs=[(100, GiB), (102, 3 * GiB)]),
    ])


def fake_proc(root: Path, tree: dict[int, list[int]], cuda: set[int]) -> Path:
    """A /proc with ``tree`` (pid -> children) whose ``cuda`` pids map libcuda."""
    for pid, children in tree.items():
        task = root / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (task / "children").write_text(" ".join(map(str, children)) + (" " if children else ""))
        lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.10" if pid in cuda else "/usr/lib/libc.so.6"
        (root / str(pid) / "maps").write_text(f"7f0000000000-7f0000001000 r-xp 00000000 08:01 42 {lib}\n")
    return root


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return fake_proc(tmp_path / "proc", {100: [101, 102], 101: [103], 102: [], 103: []}, cuda={100, 102, 103})


# -- finding the processes --------------------------------------------------------------------------


def test_process_tree_and_cuda_processes(proc: Path) -> None:
    assert process_tree(100, proc) == [100, 101, 102, 103]
    assert uses_gpu(100, proc) and not uses_gpu(101, proc) and not uses_gpu(999, proc)
    assert cuda_processes(100, proc) == [100, 102, 103]


def test_process_tree_on_the_real_proc() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        assert not uses_gpu(child.pid)  # sleep does not load libcuda
    finally:
        child.kill()
        child.wait()


def test_gpu_process_ids_sums_memory_per_pid() -> None:
    assert gpu_process_ids(nvml_with_processes()) == {
        100: (3 * GiB, [H100_0["uuid"], H100_1["uuid"]]),
        555: (GiB, [H100_0["uuid"]]),
        102: (3 * GiB, [H100_1["uuid"]]),
    }
    assert gpu_process_ids(FakeNvml(unavailable=True)) == {}


# -- around the dump --------------------------------------------------------------------------------


async def test_suspend_locks_every_cuda_process_then_checkpoints_them(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "running", 102: "running"}, delay_s=0.02)
    stats = await suspend_for_dump(100, ckpt, nvml=nvml_with_processes(), proc_root=proc)
    # 103 maps libcuda but never initialised CUDA (the driver does not know it): left alone
    assert ckpt.calls == [("lock", 100), ("lock", 102), ("checkpoint", 100), ("checkpoint", 102)]
    assert ckpt.states == {100: "checkpointed", 102: "checkpointed"}
    assert stats.pids == [100, 102]
    assert stats.gpu_bytes == 6 * GiB  # NVML's usage before the lock; 555 is another job's
    assert stats.gpu_uuids == [H100_0["uuid"], H100_1["uuid"]]
    assert stats.lock_ms >= 40 and stats.checkpoint_ms >= 40


async def test_resume_after_dump_restores_and_unlocks_in_place(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "checkpointed", 102: "checkpointed"}, delay_s=0.01)
    stats = await resume_after_dump(100, ckpt, proc_root=proc)
    assert ckpt.calls == [("restore", 100), ("restore", 102), ("unlock", 100), ("unlock", 102)]
    assert ckpt.maps == [None, None]
    assert ckpt.states == {100: "running", 102: "running"}
    assert stats.pids == [100, 102] and stats.restore_ms >= 20 and stats.unlock_ms >= 20


async def test_resume_after_restore_remaps_the_gpus(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "checkpointed", 102: "checkpointed"})
    mapping = {"GPU-old-0": "GPU-new-3"}
    stats = await resume_after_restore(100, ckpt, mapping, expect=2, proc_root=proc)
    assert ckpt.maps == [mapping, mapping] and ckpt.states == {100: "running", 102: "running"}
    assert stats.pids == [100, 102]


async def test_a_full_cycle_leaves_the_processes_running(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "running", 102: "running"})
    dumped = await suspend_for_dump(100, ckpt, proc_root=proc)
    assert dumped.gpu_bytes == 0 and dumped.gpu_uuids == []  # no NVML given: nothing measured
    await resume_after_restore(100, ckpt, expect=len(dumped.pids), proc_root=proc)
    assert ckpt.states == {100: "running", 102: "running"}


async def test_what_criu_cuda_plugin_already_did_is_not_repeated(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "checkpointed", 102: "locked"})
    stats = await suspend_for_dump(100, ckpt, proc_root=proc)
    assert ckpt.calls == [("checkpoint", 102)] and stats.pids == [100, 102]
    ckpt = FakeCheckpointer({100: "running", 102: "locked"})
    await resume_after_restore(100, ckpt, proc_root=proc)
    assert ckpt.calls == [("unlock", 102)]


async def test_a_tree_without_cuda_gives_empty_stats(tmp_path: Path) -> None:
    root = fake_proc(tmp_path / "proc", {7: [8], 8: []}, cuda=set())
    ckpt = FakeCheckpointer({})
    stats = await suspend_for_dump(7, ckpt, proc_root=root)
    assert stats.pids == [] and stats.lock_ms < 50 and ckpt.calls == []
    assert (await resume_after_dump(7, ckpt, proc_root=root)).pids == []


async def test_a_failed_checkpoint_is_undone_and_names_the_call(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "running", 102: "running"}, fail={("checkpoint", 102): "CUDA_ERROR_NOT_SUPPORTED"})
    with pytest.raises(CudaCheckpointError) as err:
        await suspend_for_dump(100, ckpt, proc_root=proc)
    assert err.value.call == "cuCheckpointProcessCheckpoint" and err.value.error_name == "CUDA_ERROR_NOT_SUPPORTED"
    assert err.value.pid == 102
    assert str(err.value) == "cuCheckpointProcessCheckpoint on pid 102 failed: CUDA_ERROR_NOT_SUPPORTED"
    assert ckpt.states == {100: "running", 102: "running"}  # the job runs on as before
    assert ckpt.calls[-3:] == [("restore", 100), ("unlock", 100), ("unlock", 102)]


async def test_a_lock_timeout_unlocks_what_was_locked(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "running", 102: "running"}, fail={("lock", 102): "CUDA_ERROR_NOT_READY"})
    with pytest.raises(CudaCheckpointError, match="cuCheckpointProcessLock on pid 102 failed: CUDA_ERROR_NOT_READY"):
        await suspend_for_dump(100, ckpt, proc_root=proc, lock_timeout_ms=10)
    assert ckpt.states == {100: "running", 102: "running"}


async def test_a_failed_process_is_reported(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "failed", 102: "running"})
    with pytest.raises(CudaCheckpointError, match="pid 100 failed: process is failed"):
        await suspend_for_dump(100, ckpt, proc_root=proc)
    with pytest.raises(CudaCheckpointError, match="cannot resume"):
        await resume_after_restore(100, ckpt, proc_root=proc)
    assert ckpt.calls == []


async def test_a_gpu_process_the_driver_does_not_know_is_an_error(proc: Path) -> None:
    # NVML lists 102 on a GPU, yet the checkpoint API cannot query it
    with pytest.raises(CudaCheckpointError, match="CUDA_ERROR_NOT_INITIALIZED"):
        await suspend_for_dump(100, FakeCheckpointer({100: "running"}), nvml=nvml_with_processes(), proc_root=proc)


async def test_restore_must_find_the_processes_of_the_dump(proc: Path) -> None:
    with pytest.raises(CudaCheckpointError, match="found 2 of the 3 CUDA processes"):
        await resume_after_restore(100, FakeCheckpointer({100: "checkpointed", 102: "checkpointed"}), expect=3,
                                   proc_root=proc)


async def test_explicit_pids_must_answer(proc: Path) -> None:
    with pytest.raises(CudaCheckpointError, match="pid 5"):
        await resume_after_dump(100, FakeCheckpointer({}), pids=[5], proc_root=proc)


# -- the driver API through cuda-python (a stand-in module) ---------------------------------------


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUprocessState(enum.IntEnum):
    CU_PROCESS_STATE_RUNNING = 0
    CU_PROCESS_STATE_LOCKED = 1
    CU_PROCESS_STATE_CHECKPOINTED = 2


class CUuuid:
    def __init__(self) -> None:
        self._raw = (ctypes.c_char * 16)()

    def getPtr(self) -> int:  # cuda-python's name
        return ctypes.addressof(self._raw)

    @property
    def bytes(self) -> bytes:
        return bytes(self._raw)


def stand_in_driver(log: list[tuple[Any, ...]], results: dict[str, CUresult] | None = None) -> types.ModuleType:
    """A module with the names and shapes of ``cuda.bindings.driver`` (cuda-bindings 13.x)."""
    mod = types.ModuleType("stand_in_driver")
    res = results or {}

    def fn(name: str, *extra: Any) -> Any:
        def call(*args: Any) -> tuple[Any, ...]:
            log.append((name, *args))
            return (res.get(name, CUresult.CUDA_SUCCESS), *extra)

        return call

    mod.CUresult = CUresult  # type: ignore[attr-defined]
    mod.CUuuid = CUuuid  # type: ignore[attr-defined]
    mod.CUcheckpointLockArgs = type("CUcheckpointLockArgs", (), {"timeoutMs": 0})  # type: ignore[attr-defined]
    mod.CUcheckpointGpuPair = type("CUcheckpointGpuPair", (), {"oldUuid": None, "newUuid": None})  # type: ignore[attr-defined]
    mod.CUcheckpointRestoreArgs = type("CUcheckpointRestoreArgs", (), {"gpuPairs": None, "gpuPairsCount": 0})  # type: ignore[attr-defined]
    mod.cuInit = fn("cuInit")  # type: ignore[attr-defined]
    mod.cuCheckpointProcessGetState = fn(  # type: ignore[attr-defined]
        "cuCheckpointProcessGetState", CUprocessState.CU_PROCESS_STATE_CHECKPOINTED
    )
    for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                 "cuCheckpointProcessUnlock"):
        setattr(mod, name, fn(name))
    return mod


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(results: dict[str, CUresult] | None = None) -> tuple[DriverApiCheckpointer, list[tuple[Any, ...]]]:
        log: list[tuple[Any, ...]] = []
        monkeypatch.setitem(sys.modules, "stand_in_driver", stand_in_driver(log, results))
        return DriverApiCheckpointer(module="stand_in_driver"), log

    return install


def test_driver_api_calls_and_arguments(driver: Any) -> None:
    api, log = driver()
    assert api.available() and api.state(42) == "checkpointed"
    api.lock(42, 5000)
    api.checkpoint(42)
    api.unlock(42)
    assert [entry[0] for entry in log] == ["cuCheckpointProcessGetState", "cuCheckpointProcessLock",
                                           "cuCheckpointProcessCheckpoint", "cuCheckpointProcessUnlock"]
    assert log[1][1] == 42 and log[1][2].timeoutMs == 5000
    assert log[2][1:] == (42, None) and log[3][1:] == (42, None)


def test_driver_api_restore_initialises_cuda_once_and_passes_uuid_pairs(driver: Any) -> None:
    api, log = driver()
    old, new = "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6", "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
    api.restore(42, {old: new})
    api.restore(43)
    assert [entry[0] for entry in log] == ["cuInit", "cuCheckpointProcessRestore", "cuCheckpointProcessRestore"]
    args = log[1][2]
    assert args.gpuPairsCount == 1
    (pair,) = args.gpuPairs
    assert pair.oldUuid.bytes.hex() == "eea0d83febcdac276b3ebec2a19724e6"
    assert pair.newUuid.bytes.hex() == "8f4022bae0cb1298286e225c953a7feb"
    assert log[2][1:] == (43, None)


def test_driver_api_errors_name_the_call_and_the_cuda_error(driver: Any) -> None:
    api, _ = driver({"cuCheckpointProcessLock": CUresult.CUDA_ERROR_NOT_READY})
    with pytest.raises(CudaCheckpointError) as err:
        api.lock(42, 100)
    assert (err.value.call, err.value.error_name, err.value.pid) == (
        "cuCheckpointProcessLock", "CUDA_ERROR_NOT_READY", 42)


def test_driver_api_without_the_symbol_is_unavailable(driver: Any) -> None:
    api, _ = driver()
    mod = sys.modules["stand_in_driver"]

    def missing(*args: Any) -> Any:
        raise RuntimeError('Function "cuCheckpointProcessCheckpoint" not found')

    mod.cuCheckpointProcessCheckpoint = missing  # type: ignore[attr-defined]
    with pytest.raises(CudaCheckpointUnavailable, match="needs NVIDIA driver 570") as err:
        api.checkpoint(42)
    assert err.value.call == "cuCheckpointProcessCheckpoint"


def test_driver_api_without_cuda_python() -> None:
    api = DriverApiCheckpointer(module="ferry_no_such_cuda_module")
    assert not api.available()
    with pytest.raises(CudaCheckpointUnavailable, match="pip install cuda-python"):
        api.state(1)


def test_bad_uuid_in_a_device_map(driver: Any) -> None:
    api, _ = driver()
    with pytest.raises(CudaCheckpointError, match="not a GPU UUID"):
        api.restore(1, {"GPU-x": "GPU-y"})


# -- NVIDIA's cuda-checkpoint tool (a stand-in binary) ---------------------------------------------


def stand_in_tool(tmp_path: Path, state: str = "checkpointed", fail: str = "") -> tuple[str, Path]:
    log = tmp_path / "argv.log"
    tool = tmp_path / "cuda-checkpoint"
    failing = (f'  *"--action {fail}"*) echo \'Could not {fail} on process ID 7: "operation not supported"\' >&2;'
               " exit 1;;\n") if fail else ""
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        'case "$*" in\n'
        f'  *--get-state*) echo "{state}";;\n'
        f"{failing}"
        "esac\n"
    )
    tool.chmod(0o755)
    return str(tool), log


def test_tool_command_lines(tmp_path: Path) -> None:
    binary, log = stand_in_tool(tmp_path)
    tool = CudaCheckpointTool(binary)
    assert tool.state(7) == "checkpointed"
    tool.lock(7, 2500)
    tool.checkpoint(7)
    tool.restore(7)
    tool.restore(7, {"GPU-a": "GPU-b", "GPU-c": "GPU-d"})
    tool.unlock(7)
    assert log.read_text().splitlines() == [
        "--get-state --pid 7",
        "--action lock --timeout 2500 --pid 7",
        "--action checkpoint --pid 7",
        "--action restore --pid 7",
        "--action restore --device-map GPU-a=GPU-b,GPU-c=GPU-d --pid 7",
        "--action unlock --pid 7",
    ]


def test_tool_errors_name_the_action_and_the_reason(tmp_path: Path) -> None:
    binary, _ = stand_in_tool(tmp_path, fail="checkpoint")
    with pytest.raises(CudaCheckpointError) as err:
        CudaCheckpointTool(binary).checkpoint(7)
    assert err.value.call == "cuda-checkpoint --action checkpoint"
    assert err.value.error_name == "operation not supported" and err.value.pid == 7


def test_tool_with_odd_state_output(tmp_path: Path) -> None:
    binary, _ = stand_in_tool(tmp_path, state="banana")
    with pytest.raises(CudaCheckpointError, match="unexpected output"):
        CudaCheckpointTool(binary).state(7)


async def test_tool_drives_the_high_level_sequence(tmp_path: Path, proc: Path) -> None:
    binary, log = stand_in_tool(tmp_path, state="running")
    stats = await suspend_for_dump(100, CudaCheckpointTool(binary), pids=[100], proc_root=proc)
    assert stats.pids == [100]
    assert log.read_text().splitlines()[1:] == ["--action lock --timeout 30000 --pid 100",
                                                "--action checkpoint --pid 100"]


def test_missing_tool_and_no_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CudaCheckpointUnavailable, match="not found"):
        CudaCheckpointTool("ferry-no-such-cuda-checkpoint").state(1)
    monkeypatch.setattr(cc.DriverApiCheckpointer, "available", lambda self: False)
    with pytest.raises(CudaCheckpointUnavailable, match="neither cuda-python nor cuda-checkpoint"):
        default_checkpointer("ferry-no-such-cuda-checkpoint")


def test_default_prefers_the_driver_api_then_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cc.DriverApiCheckpointer, "available", lambda self: True)
    assert isinstance(default_checkpointer(), DriverApiCheckpointer)
    monkeypatch.setattr(cc.DriverApiCheckpointer, "available", lambda self: False)
    binary, _ = stand_in_tool(tmp_path)
    assert isinstance(default_checkpointer(binary), CudaCheckpointTool)


async def test_restoring_onto_the_same_gpus_asks_for_no_remapping(proc: Path) -> None:
    ckpt = FakeCheckpointer({100: "checkpointed"})
    await resume_after_restore(100, ckpt, {"GPU-a": "GPU-a"}, pids=[100], proc_root=proc)
    assert ckpt.maps == [None]


def test_bindings_without_gpu_pairs_cannot_remap(driver: Any) -> None:
    api, _ = driver()
    del sys.modules["stand_in_driver"].CUcheckpointGpuPair
    with pytest.raises(CudaCheckpointUnavailable, match="needs CUDA 13"):
        api.restore(1, {"GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6": "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"})


async def test_explicit_pids_must_answer_at_the_dump_too(proc: Path) -> None:
    with pytest.raises(CudaCheckpointError, match="pid 5"):
        await suspend_for_dump(100, FakeCheckpointer({}), pids=[5], proc_root=proc)
