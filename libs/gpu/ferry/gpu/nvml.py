"""NVML behind a small interface: the ``Nvml`` protocol, ``RealNvml`` over pynvml, and ``read_inventory``.

``RealNvml`` wraps the ``pynvml`` module of NVIDIA's ``nvidia-ml-py`` package, imported on first use: a
node without the package or without ``libnvidia-ml.so.1`` (no NVIDIA driver) raises ``NvmlUnavailable``
from ``init``, and ``read_inventory`` turns that into zero GPUs and no error. Any other NVML failure
becomes ``NvmlError`` with NVML's code, and ``read_inventory`` reports it instead of raising: a driver
error is a node condition, never a crash.

Devices are addressed by NVML index. The calls used (nvidia-ml-py 13.x names):

    nvmlInit / nvmlShutdown, nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion,
    nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetName,
    nvmlDeviceGetPciInfo (.busId), nvmlDeviceGetMemoryInfo (.total, .used),
    nvmlDeviceGetUtilizationRates (.gpu), nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU),
    nvmlDeviceGetPowerUsage (mW), nvmlDeviceGetTotalEccErrors(h, type, NVML_VOLATILE_ECC),
    nvmlDeviceGetCurrentClocksEventReasons (older drivers: ...ClocksThrottleReasons),
    nvmlDeviceGetComputeRunningProcesses (.pid, .usedGpuMemory),
    nvmlEventSetCreate, nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, set),
    nvmlEventSetWait(set, timeout_ms) (.device, .eventType, .eventData = the XID), nvmlEventSetFree.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum
from typing import Any, NamedTuple, Protocol, TypeVar

from ferry.gpu.errors import NvmlError, NvmlUnavailable
from ferry.gpu.models import GpuInfo, GpuInventory

__all__ = [
    "CLOCK_EVENT_REASONS",
    "EVENT_TYPE_XID_CRITICAL",
    "Nvml",
    "NvmlCode",
    "NvmlEvent",
    "RealNvml",
    "format_cuda_version",
    "read_inventory",
    "reason_names",
]

T = TypeVar("T")


class NvmlCode(IntEnum):
    """The ``nvmlReturn_t`` values Ferry acts on (values as in nvml.h / pynvml ``NVML_ERROR_*``)."""

    SUCCESS = 0
    UNINITIALIZED = 1
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    LIB_RM_VERSION_MISMATCH = 18
    UNKNOWN = 999


# nvmlEventTypeXidCriticalError: the event's data is the XID number.
EVENT_TYPE_XID_CRITICAL = 0x0000000000000008

# nvmlClocksEventReason* bits (the older name is nvmlClocksThrottleReason*, same values).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_NVML_TEMPERATURE_GPU = 0
_NVML_VOLATILE_ECC = 0
_NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1


def reason_names(mask: int) -> list[str]:
    """The names of the clock event (throttle) reasons set in ``mask``, lowest bit first."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


def format_cuda_version(version: int) -> str:
    """NVML's CUDA driver version (12080) as people write it ("12.8")."""
    return f"{version // 1000}.{version % 1000 // 10}"


class NvmlEvent(NamedTuple):
    """One event out of an NVML event set; ``data`` is the XID for an XID event."""

    gpu_index: int | None
    uuid: str | None
    event_type: int
    data: int


class Nvml(Protocol):
    """The part of NVML Ferry uses. Every method raises ``NvmlError`` (``NvmlUnavailable`` from ``init``
    when there is no NVML at all); ``event_set_wait`` returns None when ``timeout_ms`` passed quietly."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str: ...
    def name(self, index: int) -> str: ...
    def pci_bus_id(self, index: int) -> str: ...
    def memory(self, index: int) -> tuple[int, int]:  # (total, used) bytes
        ...
    def utilization(self, index: int) -> int: ...
    def temperature(self, index: int) -> int: ...
    def power_mw(self, index: int) -> int: ...
    def ecc_errors(self, index: int, *, uncorrected: bool) -> int: ...
    def clock_event_reasons(self, index: int) -> int: ...
    def compute_processes(self, index: int) -> list[tuple[int, int | None]]:  # (pid, used bytes)
        ...
    def event_set_create(self) -> object: ...
    def register_xid_events(self, index: int, event_set: object) -> None: ...
    def event_set_wait(self, event_set: object, timeout_ms: int) -> NvmlEvent | None: ...
    def event_set_free(self, event_set: object) -> None: ...


class RealNvml:
    """``Nvml`` over pynvml (package ``nvidia-ml-py``), imported on first use."""

    def __init__(self, module: str = "pynvml") -> None:
        self._module_name = module
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------------

    def _lib(self) -> Any:
        if self._nv is None:
            try:
                self._nv = importlib.import_module(self._module_name)
            except ImportError as exc:
                raise NvmlUnavailable(
                    "import", None, f"the {self._module_name} module (pip package nvidia-ml-py) is not installed"
                ) from exc
        return self._nv

    def _call(self, call: str, fn: Callable[[], T]) -> T:
        nv = self._lib()
        try:
            return fn()
        except nv.NVMLError as exc:
            code = int(getattr(exc, "value", NvmlCode.UNKNOWN))
            if code == NvmlCode.LIBRARY_NOT_FOUND:
                raise NvmlUnavailable(call, code, "libnvidia-ml.so.1 not found: no NVIDIA driver here") from exc
            raise NvmlError(call, code, str(exc)) from exc

    def _handle(self, index: int) -> Any:
        with self._lock:
            handle = self._handles.get(index)
        if handle is None:
            nv = self._lib()
            handle = self._call("nvmlDeviceGetHandleByIndex", lambda: nv.nvmlDeviceGetHandleByIndex(index))
            with self._lock:
                self._handles[index] = handle
        return handle

    def _device(self, call: str, index: int, fn: Callable[[Any, Any], T]) -> T:
        nv, handle = self._lib(), self._handle(index)
        return self._call(call, lambda: fn(nv, handle))

    # -- lifecycle and system ---------------------------------------------------------------------

    def init(self) -> None:
        nv = self._lib()
        self._call("nvmlInit", lambda: nv.nvmlInit())

    def shutdown(self) -> None:
        nv = self._lib()
        with self._lock:
            self._handles.clear()
        self._call("nvmlShutdown", lambda: nv.nvmlShutdown())

    def driver_version(self) -> str:
        nv = self._lib()
        return _text(self._call("nvmlSystemGetDriverVersion", lambda: nv.nvmlSystemGetDriverVersion()))

    def cuda_driver_version(self) -> int:
        nv = self._lib()
        return int(self._call("nvmlSystemGetCudaDriverVersion", lambda: nv.nvmlSystemGetCudaDriverVersion()))

    def device_count(self) -> int:
        nv = self._lib()
        return int(self._call("nvmlDeviceGetCount", lambda: nv.nvmlDeviceGetCount()))

    # -- per device -------------------------------------------------------------------------------

    def uuid(self, index: int) -> str:
        return _text(self._device("nvmlDeviceGetUUID", index, lambda nv, h: nv.nvmlDeviceGetUUID(h)))

    def name(self, index: int) -> str:
        return _text(self._device("nvmlDeviceGetName", index, lambda nv, h: nv.nvmlDeviceGetName(h)))

    def pci_bus_id(self, index: int) -> str:
        return _text(self._device("nvmlDeviceGetPciInfo", index, lambda nv, h: nv.nvmlDeviceGetPciInfo(h).busId))

    def memory(self, index: int) -> tuple[int, int]:
        info = self._device("nvmlDeviceGetMemoryInfo", index, lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h))
        return int(info.total), int(info.used)

    def utilization(self, index: int) -> int:
        return int(
            self._device("nvmlDeviceGetUtilizationRates", index, lambda nv, h: nv.nvmlDeviceGetUtilizationRates(h).gpu)
        )

    def temperature(self, index: int) -> int:
        return int(
            self._device(
                "nvmlDeviceGetTemperature", index, lambda nv, h: nv.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU)
            )
        )

    def power_mw(self, index: int) -> int:
        return int(self._device("nvmlDeviceGetPowerUsage", index, lambda nv, h: nv.nvmlDeviceGetPowerUsage(h)))

    def ecc_errors(self, index: int, *, uncorrected: bool) -> int:
        kind = _NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else _NVML_MEMORY_ERROR_TYPE_CORRECTED
        return int(
            self._device(
                "nvmlDeviceGetTotalEccErrors",
                index,
                lambda nv, h: nv.nvmlDeviceGetTotalEccErrors(h, kind, _NVML_VOLATILE_ECC),
            )
        )

    def clock_event_reasons(self, index: int) -> int:
        nv = self._lib()
        if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            try:
                return int(
                    self._device(
                        "nvmlDeviceGetCurrentClocksEventReasons",
                        index,
                        lambda nv, h: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
                    )
                )
            except NvmlError as exc:
                if exc.code != NvmlCode.FUNCTION_NOT_FOUND:  # a driver older than the new name
                    raise
        return int(
            self._device(
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                index,
                lambda nv, h: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h),
            )
        )

    def compute_processes(self, index: int) -> list[tuple[int, int | None]]:
        procs = self._device(
            "nvmlDeviceGetComputeRunningProcesses", index, lambda nv, h: nv.nvmlDeviceGetComputeRunningProcesses(h)
        )
        out: list[tuple[int, int | None]] = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if used is not None else None))
        return out

    # -- events -----------------------------------------------------------------------------------

    def event_set_create(self) -> object:
        nv = self._lib()
        return self._call("nvmlEventSetCreate", lambda: nv.nvmlEventSetCreate())

    def register_xid_events(self, index: int, event_set: object) -> None:
        self._device(
            "nvmlDeviceRegisterEvents",
            index,
            lambda nv, h: nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set),
        )

    def event_set_wait(self, event_set: object, timeout_ms: int) -> NvmlEvent | None:
        nv = self._lib()
        try:
            data = self._call("nvmlEventSetWait", lambda: nv.nvmlEventSetWait(event_set, timeout_ms))
        except NvmlError as exc:
            if exc.code == NvmlCode.TIMEOUT:
                return None
            raise
        index: int | None = None
        uuid: str | None = None
        try:
            index = int(nv.nvmlDeviceGetIndex(data.device))
            uuid = _text(nv.nvmlDeviceGetUUID(data.device))
        except nv.NVMLError:
            pass  # a lost GPU may not answer any more; the event still counts
        return NvmlEvent(gpu_index=index, uuid=uuid, event_type=int(data.eventType), data=int(data.eventData))

    def event_set_free(self, event_set: object) -> None:
        nv = self._lib()
        self._call("nvmlEventSetFree", lambda: nv.nvmlEventSetFree(event_set))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


# -- the inventory --------------------------------------------------------------------------------


def read_inventory(
    nvml: Nvml,
    *,
    xids: Mapping[str, Sequence[int]] | None = None,
    previous: GpuInventory | None = None,
    now: float | None = None,
) -> GpuInventory:
    """Every GPU of this node with its health signals. Never raises.

    No NVML (no driver, no nvidia-ml-py): zero GPUs and ``error`` None. NVML failing to start or to count
    GPUs: zero GPUs and ``error`` saying why. A query a GPU does not support leaves its field None; a GPU
    that fell off the bus is ``lost``. ``xids`` are the recent XIDs per GPU UUID (from ``XidWatcher``);
    ``previous`` fills in the identity (UUID, model, bus id, memory) of a GPU that no longer answers.
    """
    sampled_at = time.time() if now is None else now
    try:
        nvml.init()
    except NvmlUnavailable:
        return GpuInventory(sampled_at=sampled_at)
    except NvmlError as exc:
        return GpuInventory(error=_driver_error(exc), sampled_at=sampled_at)
    except Exception as exc:  # a probe answers, whatever broke
        return GpuInventory(error=f"NVML could not start: {exc}", sampled_at=sampled_at)
    try:
        return _read_all(nvml, xids or {}, previous, sampled_at)
    except Exception as exc:
        return GpuInventory(error=f"reading GPUs failed: {exc}", sampled_at=sampled_at)
    finally:
        try:
            nvml.shutdown()
        except Exception:
            pass


def _driver_error(exc: NvmlError) -> str:
    hints: dict[int, str] = {
        NvmlCode.DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        NvmlCode.LIB_RM_VERSION_MISMATCH: "the NVML library and the kernel driver versions differ (reboot or reload)",
        NvmlCode.NO_PERMISSION: "no permission to use the NVIDIA driver",
    }
    hint = hints.get(exc.code) if exc.code is not None else None
    return f"NVIDIA driver error: {hint or exc.detail} ({exc.call}, NVML error {exc.code})"


def _read_all(
    nvml: Nvml, xids: Mapping[str, Sequence[int]], previous: GpuInventory | None, sampled_at: float
) -> GpuInventory:
    try:
        driver: str | None = nvml.driver_version()
    except NvmlError:
        driver = None
    try:
        cuda: str | None = format_cuda_version(nvml.cuda_driver_version())
    except NvmlError:
        cuda = None
    try:
        count = nvml.device_count()
    except NvmlError as exc:
        return GpuInventory(driver_version=driver, cuda_driver_version=cuda, error=_driver_error(exc),
                            sampled_at=sampled_at)
    before = {g.index: g for g in previous.gpus} if previous is not None else {}
    gpus = [_read_gpu(nvml, i, xids, before.get(i)) for i in range(count)]
    return GpuInventory(driver_version=driver, cuda_driver_version=cuda, gpus=gpus, sampled_at=sampled_at)


class _Reader:
    """Queries one GPU, noting which queries failed and whether the GPU is lost."""

    def __init__(self) -> None:
        self.lost = False
        self.problems: list[str] = []

    def get(self, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except NvmlError as exc:
            if exc.code == NvmlCode.GPU_IS_LOST:
                self.lost = True
            elif exc.code != NvmlCode.NOT_SUPPORTED:
                self.problems.append(str(exc))
            return None


def _read_gpu(nvml: Nvml, index: int, xids: Mapping[str, Sequence[int]], before: GpuInfo | None) -> GpuInfo:
    r = _Reader()
    uuid = r.get(lambda: nvml.uuid(index)) or (before.uuid if before else f"GPU-unknown-{index}")
    model = r.get(lambda: nvml.name(index)) or (before.model if before else "unknown")
    bus = r.get(lambda: nvml.pci_bus_id(index)) or (before.pci_bus_id if before else "")
    mem = r.get(lambda: nvml.memory(index))
    total, used = mem if mem is not None else ((before.memory_total if before else 0), 0)
    power = r.get(lambda: nvml.power_mw(index))
    reasons = r.get(lambda: nvml.clock_event_reasons(index))
    info = GpuInfo(
        index=index,
        uuid=uuid,
        model=model,
        memory_total=total,
        memory_used=used,
        utilization_pct=r.get(lambda: nvml.utilization(index)),
        temperature_c=r.get(lambda: nvml.temperature(index)),
        power_w=power / 1000 if power is not None else None,
        ecc_uncorrected=r.get(lambda: nvml.ecc_errors(index, uncorrected=True)),
        ecc_corrected=r.get(lambda: nvml.ecc_errors(index, uncorrected=False)),
        throttle_reasons=reason_names(reasons) if reasons is not None else [],
        xid_events=list(xids.get(uuid, ())),
        pci_bus_id=bus,
    )
    if r.lost:
        info.lost, info.healthy = True, False
        info.problems.append("GPU is lost: it fell off the bus (NVML GPU_IS_LOST)")
    info.problems.extend(r.problems)
    return info
