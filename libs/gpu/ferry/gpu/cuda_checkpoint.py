"""Driving the CUDA driver's process checkpoint API around a CRIU dump and restore.

The driver (570 and newer) moves a process's device memory into its host memory and releases the GPU
(lock, then checkpoint), so that CRIU can dump it like any process; after a restore it moves the memory
back (restore, optionally onto other GPUs) and lets the process call CUDA again (unlock). It acts on
one process at a time, so the helpers here find the CUDA processes of a workload's tree themselves.

Two ways to drive it, one protocol (``CudaCheckpointer``):

- ``DriverApiCheckpointer``: ``cuda.bindings.driver`` from NVIDIA's cuda-python (``cuCheckpointProcessGetState``,
  ``cuCheckpointProcessLock``, ``cuCheckpointProcessCheckpoint``, ``cuCheckpointProcessRestore``,
  ``cuCheckpointProcessUnlock``); restore calls ``cuInit(0)`` first, as the driver requires when GPUs
  are not in persistence mode.
- ``CudaCheckpointTool``: NVIDIA's ``cuda-checkpoint`` binary (``--get-state``, ``--action lock|checkpoint|
  restore|unlock``, ``--timeout`` for lock, ``--device-map old=new,...`` for restore from driver 580).

CRIU 4.1's CUDA plugin runs ``cuda-checkpoint`` itself when it is installed. The helpers look at each
process's state first and only do what is still to do, so they work with or without the plugin.

Sequence: ``suspend_for_dump`` (lock + checkpoint) -> ``criu dump`` -> either ``resume_after_dump``
(restore + unlock in place: leave-running, or a failed final dump once the tree runs again after
SIGCONT) or, on the target after ``criu restore``, ``resume_after_restore`` (restore with the GPU
remapping + unlock). A process whose state is "failed" cannot be recovered in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import logging
import re
import shutil
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

from ferry.gpu.errors import CudaCheckpointError, CudaCheckpointUnavailable, NvmlError
from ferry.gpu.models import GpuDumpStats, GpuRestoreStats
from ferry.gpu.nvml import Nvml

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_MS",
    "PROCESS_STATES",
    "CudaCheckpointTool",
    "CudaCheckpointer",
    "DriverApiCheckpointer",
    "cuda_processes",
    "default_checkpointer",
    "gpu_process_ids",
    "process_tree",
    "resume_after_dump",
    "resume_after_restore",
    "suspend_for_dump",
    "uses_gpu",
]

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_MS = 30_000
# CUprocessState values, by the names this module uses.
PROCESS_STATES: dict[int, str] = {
    0: "running",
    1: "locked",
    2: "checkpointed",
    3: "failed",
    4: "checkpointing",
    5: "restoring",
}
_UNAVAILABLE_HINT = "GPU checkpointing needs NVIDIA driver 570 or newer"


class CudaCheckpointer(Protocol):
    """The CUDA process checkpoint operations, on one process each; errors raise CudaCheckpointError."""

    def state(self, pid: int) -> str:
        """"running", "locked", "checkpointed", "failed", "checkpointing" or "restoring"."""
        ...

    def lock(self, pid: int, timeout_ms: int) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int, device_map: Mapping[str, str] | None = None) -> None:
        """``device_map``: checkpointed GPU UUID -> GPU UUID to restore onto; it must name every GPU."""
        ...

    def unlock(self, pid: int) -> None: ...


# -- the driver API through cuda-python -------------------------------------------------------------


class DriverApiCheckpointer:
    """``CudaCheckpointer`` over ``cuda.bindings.driver`` (cuda-python 12.6+; older: ``cuda.cuda``)."""

    def __init__(self, module: str | None = None) -> None:
        self._module_names = [module] if module else ["cuda.bindings.driver", "cuda.cuda"]
        self._d: Any = None
        self._initialised = False
        self._init_lock = threading.Lock()

    def _driver(self) -> Any:
        if self._d is None:
            for name in self._module_names:
                try:
                    self._d = importlib.import_module(name)
                    break
                except ImportError:
                    continue
            else:
                raise CudaCheckpointUnavailable(
                    f"import {self._module_names[0]}", "not installed", hint="pip install cuda-python"
                )
        return self._d

    def available(self) -> bool:
        try:
            self._driver()
        except CudaCheckpointUnavailable:
            return False
        return True

    def _call(self, call: str, pid: int | None, *args: Any) -> tuple[Any, ...]:
        d = self._driver()
        try:
            result = getattr(d, call)(*args)
        except Exception as exc:  # the driver library or the symbol is missing: not a CUresult
            raise CudaCheckpointUnavailable(call, f"{type(exc).__name__}: {exc}", pid, _UNAVAILABLE_HINT) from exc
        result = tuple(result) if isinstance(result, tuple | list) else (result,)
        err = result[0]
        if int(err) != 0:  # CUDA_SUCCESS
            raise CudaCheckpointError(call, _cu_error_name(d, err), pid)
        return result[1:]

    def _init(self) -> None:
        with self._init_lock:
            if not self._initialised:
                self._call("cuInit", None, 0)
                self._initialised = True

    def state(self, pid: int) -> str:
        (value,) = self._call("cuCheckpointProcessGetState", pid, pid)
        return PROCESS_STATES.get(int(value), f"unknown({int(value)})")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self._driver().CUcheckpointLockArgs()
        args.timeoutMs = timeout_ms
        self._call("cuCheckpointProcessLock", pid, pid, args)

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, pid, None)

    def restore(self, pid: int, device_map: Mapping[str, str] | None = None) -> None:
        self._init()
        d = self._driver()
        args = None
        pairs = []
        if device_map:
            try:
                for old, new in device_map.items():
                    pair = d.CUcheckpointGpuPair()
                    pair.oldUuid = _cu_uuid(d, old)
                    pair.newUuid = _cu_uuid(d, new)
                    pairs.append(pair)
                args = d.CUcheckpointRestoreArgs()
                args.gpuPairs = pairs
                args.gpuPairsCount = len(pairs)
            except AttributeError as exc:  # bindings older than CUDA 13 have no GPU pairs
                raise CudaCheckpointUnavailable(
                    "cuCheckpointProcessRestore", "these cuda-python bindings cannot remap GPUs", pid,
                    "restoring onto other GPUs needs CUDA 13: driver 580+ and cuda-python 13",
                ) from exc
        self._call("cuCheckpointProcessRestore", pid, pid, args)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, pid, None)


def uuid_bytes(gpu_uuid: str) -> bytes:
    """The 16 bytes of a GPU UUID as NVML and nvidia-smi write it ("GPU-eea0d83f-ebcd-...")."""
    text = re.sub(r"^(GPU|MIG)-", "", gpu_uuid.strip())
    try:
        return uuidlib.UUID(text).bytes
    except ValueError as exc:
        raise CudaCheckpointError("device map", f"{gpu_uuid!r} is not a GPU UUID") from exc


def _cu_uuid(d: Any, gpu_uuid: str) -> Any:
    raw = uuid_bytes(gpu_uuid)
    value = d.CUuuid()
    ctypes.memmove(int(value.getPtr()), raw, len(raw))  # its ``bytes`` attribute is read-only
    return value


def _cu_error_name(d: Any, err: Any) -> str:
    name = getattr(err, "name", None)
    if isinstance(name, str):
        return name
    with contextlib.suppress(Exception):
        status, text = d.cuGetErrorName(err)
        if int(status) == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    return f"CUresult {int(err)}"


# -- NVIDIA's cuda-checkpoint utility ---------------------------------------------------------------


class CudaCheckpointTool:
    """``CudaCheckpointer`` that runs NVIDIA's ``cuda-checkpoint`` binary."""

    def __init__(self, binary: str = "cuda-checkpoint", timeout_s: float = 900.0) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    def path(self) -> str | None:
        return shutil.which(self.binary)

    def _run(self, pid: int, args: Sequence[str]) -> str:
        path = self.path()
        call = "cuda-checkpoint " + " ".join(args[:2])
        if path is None:
            raise CudaCheckpointUnavailable(
                call, f"{self.binary} not found", pid, "install it from github.com/NVIDIA/cuda-checkpoint"
            )
        argv = [path, *args, "--pid", str(pid)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False,
                                 stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise CudaCheckpointError(call, f"timed out after {self.timeout_s:.0f} s", pid) from exc
        except OSError as exc:
            raise CudaCheckpointUnavailable(call, str(exc), pid) from exc
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0:
            raise CudaCheckpointError(call, _tool_error(text, out.returncode), pid)
        return text

    def state(self, pid: int) -> str:
        text = self._run(pid, ["--get-state"]).lower()
        words: list[str] = re.findall(r"[a-z]+", text)
        for word in words:
            if word in PROCESS_STATES.values():
                return word
        raise CudaCheckpointError("cuda-checkpoint --get-state", f"unexpected output {text!r}", pid)

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._run(pid, ["--action", "lock", "--timeout", str(timeout_ms)])

    def checkpoint(self, pid: int) -> None:
        self._run(pid, ["--action", "checkpoint"])

    def restore(self, pid: int, device_map: Mapping[str, str] | None = None) -> None:
        args = ["--action", "restore"]
        if device_map:
            args += ["--device-map", ",".join(f"{old}={new}" for old, new in device_map.items())]
        self._run(pid, args)

    def unlock(self, pid: int) -> None:
        self._run(pid, ["--action", "unlock"])


def _tool_error(text: str, rc: int) -> str:
    """The tool's reason: 'Could not restore on process ID 7: "invalid argument"' -> invalid argument."""
    quoted: list[str] = re.findall(r'"([^"]+)"', text)
    if quoted:
        return quoted[-1]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {rc}"


def default_checkpointer(tool: str = "cuda-checkpoint") -> CudaCheckpointer:
    """The driver API when cuda-python is installed, else the ``cuda-checkpoint`` tool when on PATH."""
    api = DriverApiCheckpointer()
    if api.available():
        return api
    binary = CudaCheckpointTool(tool)
    if binary.path() is not None:
        return binary
    raise CudaCheckpointUnavailable(
        "GPU checkpoint", "neither cuda-python nor cuda-checkpoint is installed",
        hint="pip install cuda-python, or put NVIDIA's cuda-checkpoint on PATH",
    )


# -- finding the CUDA processes of a workload -------------------------------------------------------


def process_tree(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """``pid`` and its descendants, parents first: psutil's, on this host's /proc; from
    ``<proc_root>/<pid>/task/*/children`` on another one (a host's /proc mounted into a container)."""
    if proc_root == Path("/proc"):
        try:
            return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            return [pid]
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        if p in out:
            continue
        out.append(p)
        for task in sorted((proc_root / str(p) / "task").glob("*")):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


def uses_gpu(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether the process has the CUDA driver library mapped (true before a checkpoint and after a
    restore alike, when NVML no longer lists it)."""
    try:
        maps = (proc_root / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return False
    return "/libcuda.so" in maps


def cuda_processes(root_pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The processes of the tree at ``root_pid`` that load the CUDA driver."""
    return [p for p in process_tree(root_pid, proc_root) if uses_gpu(p, proc_root)]


def gpu_process_ids(nvml: Nvml) -> dict[int, tuple[int, list[str]]]:
    """Every process NVML sees on a GPU: pid -> (device memory bytes, GPU UUIDs). Never raises."""
    out: dict[int, tuple[int, list[str]]] = {}
    try:
        nvml.init()
    except Exception:
        return out
    try:
        for index in range(nvml.device_count()):
            try:
                gpu = nvml.uuid(index)
                procs = nvml.compute_processes(index)
            except NvmlError:
                continue
            for pid, used in procs:
                total, gpus = out.get(pid, (0, []))
                out[pid] = (total + (used or 0), [*gpus, gpu] if gpu not in gpus else gpus)
    except Exception as exc:
        log.warning("listing GPU processes failed: %s", exc)
    finally:
        with contextlib.suppress(Exception):
            nvml.shutdown()
    return out


# -- around the dump and the restore ----------------------------------------------------------------


async def _states(ckpt: CudaCheckpointer, pids: Sequence[int], must: set[int]) -> dict[int, str]:
    """The CUDA state of each pid; a pid the driver does not know is skipped unless it is in ``must``."""
    out: dict[int, str] = {}
    for pid in pids:
        try:
            out[pid] = await asyncio.to_thread(ckpt.state, pid)
        except CudaCheckpointUnavailable:
            raise
        except CudaCheckpointError:
            if pid in must:
                raise
            log.debug("pid %d maps libcuda but is not a CUDA process", pid)
    return out


async def suspend_for_dump(
    pid: int,
    ckpt: CudaCheckpointer,
    *,
    nvml: Nvml | None = None,
    pids: Sequence[int] | None = None,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    proc_root: Path = Path("/proc"),
) -> GpuDumpStats:
    """Locks and checkpoints every CUDA process of the tree at ``pid``, before ``criu dump``.

    ``pids``: the CUDA processes, when the caller knows them (default: found in the tree). ``nvml``
    measures the device memory they hold. On failure, what was done is undone and the error raised:
    the job runs on as before. A tree without CUDA processes gives empty stats.
    """
    usage = await asyncio.to_thread(gpu_process_ids, nvml) if nvml is not None else {}
    if pids is None:
        tree = await asyncio.to_thread(process_tree, pid, proc_root)
        candidates, must = [p for p in tree if p in usage or uses_gpu(p, proc_root)], set(usage)
    else:
        candidates, must = list(pids), set(pids)
    states = await _states(ckpt, candidates, must)
    for p, st in states.items():
        if st not in ("running", "locked", "checkpointed"):
            raise CudaCheckpointError("cuCheckpointProcessGetState", f"process is {st}, cannot checkpoint it", p)
    to_lock = [p for p, st in states.items() if st == "running"]
    to_checkpoint = [p for p, st in states.items() if st in ("running", "locked")]
    locked: list[int] = []
    done: list[int] = []
    try:
        t0 = time.monotonic()
        for p in to_lock:
            await asyncio.to_thread(ckpt.lock, p, lock_timeout_ms)
            locked.append(p)
        t1 = time.monotonic()
        for p in to_checkpoint:
            await asyncio.to_thread(ckpt.checkpoint, p)
            done.append(p)
        t2 = time.monotonic()
    except BaseException:
        await _undo(ckpt, done, [p for p in locked if p not in done])
        raise
    suspended = list(states)
    uuids: list[str] = []
    for p in suspended:
        uuids += [u for u in usage.get(p, (0, []))[1] if u not in uuids]
    return GpuDumpStats(
        pids=suspended,
        lock_ms=(t1 - t0) * 1000,
        checkpoint_ms=(t2 - t1) * 1000,
        gpu_bytes=sum(usage.get(p, (0, []))[0] for p in suspended),
        gpu_uuids=uuids,
    )


async def _undo(ckpt: CudaCheckpointer, checkpointed: Sequence[int], locked: Sequence[int]) -> None:
    for p in checkpointed:
        try:
            await asyncio.to_thread(ckpt.restore, p, None)
            await asyncio.to_thread(ckpt.unlock, p)
        except CudaCheckpointError as exc:
            log.error("could not resume CUDA in pid %d after a failed checkpoint: %s", p, exc)
    for p in locked:
        try:
            await asyncio.to_thread(ckpt.unlock, p)
        except CudaCheckpointError as exc:
            log.error("could not unlock CUDA in pid %d after a failed checkpoint: %s", p, exc)


async def _resume(
    pid: int,
    ckpt: CudaCheckpointer,
    device_map: Mapping[str, str] | None,
    pids: Sequence[int] | None,
    expect: int | None,
    proc_root: Path,
) -> GpuRestoreStats:
    if pids is None:
        candidates = await asyncio.to_thread(cuda_processes, pid, proc_root)
        must: set[int] = set()
    else:
        candidates, must = list(pids), set(pids)
    states = await _states(ckpt, candidates, must)
    if expect is not None and len(states) < expect:
        raise CudaCheckpointError(
            "cuCheckpointProcessGetState", f"found {len(states)} of the {expect} CUDA processes of the dump", pid
        )
    for p, st in states.items():
        if st not in ("running", "locked", "checkpointed"):
            raise CudaCheckpointError("cuCheckpointProcessGetState", f"process is {st}, cannot resume it", p)
    if device_map and all(old == new for old, new in device_map.items()):
        device_map = None  # the same GPUs: no remapping (which needs CUDA 13) to ask for
    t0 = time.monotonic()
    for p, st in states.items():
        if st == "checkpointed":
            await asyncio.to_thread(ckpt.restore, p, device_map)
    t1 = time.monotonic()
    for p, st in states.items():
        if st in ("checkpointed", "locked"):
            await asyncio.to_thread(ckpt.unlock, p)
    t2 = time.monotonic()
    return GpuRestoreStats(pids=list(states), restore_ms=(t1 - t0) * 1000, unlock_ms=(t2 - t1) * 1000)


async def resume_after_dump(
    pid: int,
    ckpt: CudaCheckpointer,
    *,
    pids: Sequence[int] | None = None,
    proc_root: Path = Path("/proc"),
) -> GpuRestoreStats:
    """Restores and unlocks CUDA in place after a leave-running dump (or a failed final one, once the
    tree runs again: a stopped process cannot take its memory back). ``pids``: as from the dump's stats."""
    return await _resume(pid, ckpt, None, pids, None, proc_root)


async def resume_after_restore(
    pid: int,
    ckpt: CudaCheckpointer,
    device_map: Mapping[str, str] | None = None,
    *,
    expect: int | None = None,
    pids: Sequence[int] | None = None,
    proc_root: Path = Path("/proc"),
) -> GpuRestoreStats:
    """Restores CUDA in the tree CRIU restored at ``pid`` (onto ``device_map``'s GPUs) and unlocks it.

    ``expect``: how many CUDA processes the dump suspended (``len(GpuDumpStats.pids)``); finding fewer
    is an error. Processes already running (CRIU's CUDA plugin resumed them) are left alone.
    """
    return await _resume(pid, ckpt, device_map, pids, expect, proc_root)
