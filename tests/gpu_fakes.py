"""Test doubles for the GPU layer: a fake NVML with recorded values and scripted events.

``FakeNvml`` implements the ``ferry.gpu.nvml.Nvml`` protocol for tests only; the shipped path is
``RealNvml`` over nvidia-ml-py.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

from ferry.gpu.errors import NvmlError, NvmlUnavailable
from ferry.gpu.nvml import EVENT_TYPE_XID_CRITICAL, NvmlCode, NvmlEvent

GiB = 1 << 30
HW_THERMAL = 0x40
SW_POWER_CAP = 0x04

# Values as NVML reported them on an 8 x H100 SXM node (two GPUs kept), driver 570.86.10, CUDA 12.8.
H100_0: dict[str, Any] = {
    "uuid": "GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160",
    "name": "NVIDIA H100 80GB HBM3",
    "bus_id": "00000000:18:00.0",
    "total": 85520809984,
    "used": 568328192,
    "util": 0,
    "temp": 31,
    "power_mw": 71843,
    "reasons": 0x1,  # gpu_idle
}
H100_1: dict[str, Any] = {
    "uuid": "GPU-6fbeda44-9d0c-67a9-1dd4-44a22fb5ff2c",
    "name": "NVIDIA H100 80GB HBM3",
    "bus_id": "00000000:2A:00.0",
    "total": 85520809984,
    "used": 40233861120,
    "util": 97,
    "temp": 64,
    "power_mw": 612004,
    "reasons": SW_POWER_CAP,
}


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str
    total: int
    used: int
    util: int = 0
    temp: int = 40
    power_mw: int = 100_000
    reasons: int = 0
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    procs: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # query ("*": all) -> NVML code to raise
    events: bool = True  # accepts nvmlDeviceRegisterEvents


class FakeNvml:
    """Test double of ``ferry.gpu.nvml.Nvml``: recorded values per GPU, scripted failures and events."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver: str = "570.86.10",
        cuda: int = 12080,
        init_error: int | None = None,
        unavailable: bool = False,
        count_error: int | None = None,
    ) -> None:
        self.gpus = gpus or []
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.unavailable = unavailable
        self.count_error = count_error
        self.events: queue.Queue[NvmlEvent | NvmlError] = queue.Queue()
        self.registered: set[int] = set()
        self.inits = 0
        self.shutdowns = 0

    # scripted events
    def push_xid(self, index: int, xid: int, *, with_uuid: bool = True) -> None:
        uuid = self.gpus[index].uuid if with_uuid else None
        self.events.put(NvmlEvent(gpu_index=index, uuid=uuid, event_type=EVENT_TYPE_XID_CRITICAL, data=xid))

    def push_wait_error(self, code: int) -> None:
        self.events.put(NvmlError("nvmlEventSetWait", code, "scripted"))

    def _q(self, call: str, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        code = gpu.errors.get(call, gpu.errors.get("*"))
        if code is not None:
            raise NvmlError(call, code, NvmlCode(code).name)
        return gpu

    def init(self) -> None:
        if self.unavailable:
            raise NvmlUnavailable("import", None, "the pynvml module is not installed")
        if self.init_error is not None:
            raise NvmlError("nvmlInit", self.init_error, NvmlCode(self.init_error).name)
        self.inits += 1

    def shutdown(self) -> None:
        self.shutdowns += 1

    def driver_version(self) -> str:
        return self.driver

    def cuda_driver_version(self) -> int:
        return self.cuda

    def device_count(self) -> int:
        if self.count_error is not None:
            raise NvmlError("nvmlDeviceGetCount", self.count_error, NvmlCode(self.count_error).name)
        return len(self.gpus)

    def uuid(self, index: int) -> str:
        return self._q("uuid", index).uuid

    def name(self, index: int) -> str:
        return self._q("name", index).name

    def pci_bus_id(self, index: int) -> str:
        return self._q("pci_bus_id", index).bus_id

    def memory(self, index: int) -> tuple[int, int]:
        g = self._q("memory", index)
        return g.total, g.used

    def utilization(self, index: int) -> int:
        return self._q("utilization", index).util

    def temperature(self, index: int) -> int:
        return self._q("temperature", index).temp

    def power_mw(self, index: int) -> int:
        return self._q("power_mw", index).power_mw

    def ecc_errors(self, index: int, *, uncorrected: bool) -> int:
        g = self._q("ecc_errors", index)
        return g.ecc_uncorrected if uncorrected else g.ecc_corrected

    def clock_event_reasons(self, index: int) -> int:
        return self._q("clock_event_reasons", index).reasons

    def compute_processes(self, index: int) -> list[tuple[int, int | None]]:
        return list(self._q("compute_processes", index).procs)

    def event_set_create(self) -> object:
        return object()

    def register_xid_events(self, index: int, event_set: object) -> None:
        if not self.gpus[index].events:
            raise NvmlError("nvmlDeviceRegisterEvents", NvmlCode.NOT_SUPPORTED, "Not Supported")
        self.registered.add(index)

    def event_set_wait(self, event_set: object, timeout_ms: int) -> NvmlEvent | None:
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None
        if isinstance(item, NvmlError):
            raise item
        return item

    def event_set_free(self, event_set: object) -> None:
        pass
