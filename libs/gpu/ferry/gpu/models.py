"""The GPU records Ferry reports and keeps: inventory, conditions, snapshots and checkpoint statistics.

Sizes are bytes, times are seconds since the epoch (``time.time()``) unless a name says ``_ms``.
A value NVML does not support on a GPU (power on some boards, ECC with ECC off) is ``None``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ferry.common.models import now
from ferry.common.record import Record

__all__ = [
    "ConditionKind",
    "GpuCondition",
    "GpuDumpStats",
    "GpuInfo",
    "GpuInventory",
    "GpuReport",
    "GpuRestoreStats",
    "GpuSnapshot",
]

ConditionKind = Literal["ecc", "xid", "fell-off-bus", "thermal", "driver"]


class GpuInfo(Record):
    """One GPU as NVML saw it at one sample."""

    index: int
    uuid: str  # "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
    model: str  # NVML's name: "NVIDIA H100 80GB HBM3"
    memory_total: int = 0
    memory_used: int = 0
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    # Volatile counts: since the driver was loaded or the GPU was last reset.
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    throttle_reasons: list[str] = Field(default_factory=list)  # "hw_thermal_slowdown", "sw_power_cap", ...
    xid_events: list[int] = Field(default_factory=list)  # recent XIDs, oldest first
    pci_bus_id: str = ""  # "00000000:65:00.0"
    lost: bool = False  # NVML said GPU_IS_LOST: it fell off the bus
    healthy: bool = True
    problems: list[str] = Field(default_factory=list)


class GpuInventory(Record):
    """A node's GPUs at one sample. No NVIDIA driver: no GPUs and no error; a broken one: ``error``."""

    driver_version: str | None = None  # "570.86.10"
    cuda_driver_version: str | None = None  # "12.8"
    gpus: list[GpuInfo] = Field(default_factory=list)
    error: str | None = None
    sampled_at: float = Field(default_factory=now)

    def by_uuid(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


class GpuCondition(Record):
    """Something wrong with one GPU (``gpu_uuid`` set) or with the node's driver (``kind`` "driver").

    Every condition on a GPU makes it unhealthy: nothing new is placed on it and its jobs move.
    ``fatal``: the GPU (or the driver) cannot be trusted any more, not just slowed down.
    ``gpu_responds``: whether the GPU still answers, so a job on it can still be checkpointed; when it
    does not, its jobs come back from their last checkpoint.
    """

    kind: ConditionKind
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    detail: str
    fatal: bool
    gpu_responds: bool = True
    since: float = Field(default_factory=now)


class GpuReport(Record):
    """What a node's GPU monitor says in each heartbeat: the annotated inventory and its conditions."""

    inventory: GpuInventory = Field(default_factory=GpuInventory)
    conditions: list[GpuCondition] = Field(default_factory=list)
    xid_mode: str = "off"  # how XIDs are watched: "events" (NVML), "polling" (kernel log) or "off"


class GpuSnapshot(Record):
    """The GPUs a checkpointed job ran on, kept with its checkpoint to vet a restore target."""

    model: str
    count: int
    driver_version: str
    uuids: list[str] = Field(default_factory=list)


class GpuDumpStats(Record):
    """The CUDA side of one dump: the processes suspended, how long it took, what they held."""

    pids: list[int] = Field(default_factory=list)  # host pids of the CUDA processes suspended
    lock_ms: float = 0.0
    checkpoint_ms: float = 0.0
    gpu_bytes: int = 0  # device memory the processes held before the lock (NVML), now in host memory
    gpu_uuids: list[str] = Field(default_factory=list)  # the GPUs they used (NVML), in index order


class GpuRestoreStats(Record):
    """The CUDA side of one restore (or of resuming after a leave-running dump)."""

    pids: list[int] = Field(default_factory=list)
    restore_ms: float = 0.0
    unlock_ms: float = 0.0
