"""GPU health rules: from inventory samples to conditions. Pure code: no NVML, no clock, no IO.

A GPU is unhealthy while any condition names it; nothing new is placed on it and its jobs move:
checkpointed first when the GPU still answers (``gpu_responds``), from their last checkpoint otherwise.

- ``ecc``: uncorrectable ECC errors (NVML's volatile count, since the driver loaded or the GPU was reset)
  above zero; fatal.
- ``xid``: an XID in ``FATAL_XIDS`` was reported for the GPU; fatal.
- ``fell-off-bus``: NVML answers GPU_IS_LOST for the GPU, or XID 79; fatal, and the GPU no longer
  responds, so its jobs cannot be checkpointed.
- ``thermal``: HW or SW thermal slowdown in every sample for ``thermal_sustained_s`` or longer; not fatal
  (the GPU works, slowly), but unhealthy.
- ``driver``: NVML itself failed on this node (kind "driver", no GPU named); fatal for GPU work there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from ferry.gpu.models import ConditionKind, GpuCondition, GpuInfo, GpuInventory

__all__ = [
    "FATAL_XIDS",
    "THERMAL_REASONS",
    "HealthPolicy",
    "annotate",
    "can_checkpoint",
    "evaluate",
    "healthy_gpus",
]

# XIDs after which a GPU cannot be trusted until it is reset or replaced, with their meaning from
# NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors) and GPU memory error management guide.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error: an uncorrectable error in GPU memory",
    62: "internal micro-controller halt: the GPU needs a reset",
    64: "ECC page retirement or row remapping failed to be recorded: GPU memory is no longer protected",
    74: "NVLink error: a link to a peer GPU or NVSwitch failed",
    79: "GPU has fallen off the bus: the driver can no longer reach it over PCIe",
    92: "high single-bit ECC error rate: GPU memory is failing",
    94: "contained uncorrectable ECC error: the page is offlined, the GPU needs a reset to remap it",
    95: "uncontained uncorrectable ECC error: every application on the GPU is affected, it needs a reset",
    119: "GSP RPC timeout: the GPU System Processor stopped answering",
    120: "GSP error: the GPU System Processor firmware failed",
    140: "unrecovered ECC error in GPU memory",
}
XID_FELL_OFF_BUS = 79

# Clock event reasons (see ferry.gpu.nvml.CLOCK_EVENT_REASONS) that mean the GPU is too hot.
THERMAL_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})


class HealthPolicy(BaseModel):
    """The tunables of the rules."""

    model_config = ConfigDict(frozen=True)

    thermal_sustained_s: float = 60.0  # thermal slowdown this long marks the GPU unhealthy
    max_sample_gap_s: float = 30.0  # a longer gap between samples breaks a "sustained" run
    fatal_xids: frozenset[int] = frozenset(FATAL_XIDS)


def evaluate(
    inventory: GpuInventory, history: Sequence[GpuInventory] = (), policy: HealthPolicy | None = None
) -> list[GpuCondition]:
    """The conditions of the node's GPUs at ``inventory``, given earlier samples in ``history``."""
    policy = policy or HealthPolicy()
    samples = sorted((h for h in history if h.sampled_at < inventory.sampled_at), key=lambda h: h.sampled_at)
    samples.append(inventory)
    out: list[GpuCondition] = []
    if inventory.error is not None:
        since = _run_start(samples, lambda inv: inv.error is not None, policy)
        out.append(GpuCondition(kind="driver", detail=inventory.error, fatal=True, since=since))
    for gpu in inventory.gpus:
        out.extend(_gpu_conditions(gpu, samples, policy))
    return out


def _gpu_conditions(gpu: GpuInfo, samples: list[GpuInventory], policy: HealthPolicy) -> list[GpuCondition]:
    def start(pred: Callable[[GpuInfo], bool]) -> float:
        return _run_start(samples, lambda inv: (g := inv.by_uuid(gpu.uuid)) is not None and pred(g), policy)

    def condition(
        kind: ConditionKind, detail: str, since: float, *, fatal: bool = True, responds: bool = True
    ) -> GpuCondition:
        return GpuCondition(kind=kind, gpu_uuid=gpu.uuid, gpu_index=gpu.index, detail=f"GPU {gpu.index}: {detail}",
                            fatal=fatal, gpu_responds=responds, since=since)

    out: list[GpuCondition] = []
    if gpu.lost or XID_FELL_OFF_BUS in gpu.xid_events:
        why = "NVML reports GPU_IS_LOST" if gpu.lost else "XID 79"
        since = start(lambda g: g.lost or XID_FELL_OFF_BUS in g.xid_events)
        out.append(condition("fell-off-bus", f"fell off the bus ({why})", since, responds=False))
    if gpu.ecc_uncorrected:
        detail = f"{gpu.ecc_uncorrected} uncorrectable ECC errors since the driver loaded"
        before = samples[-2].by_uuid(gpu.uuid) if len(samples) > 1 else None
        if before is not None and before.ecc_uncorrected is not None and gpu.ecc_uncorrected > before.ecc_uncorrected:
            detail += f" (+{gpu.ecc_uncorrected - before.ecc_uncorrected} since the last sample)"
        out.append(condition("ecc", detail, start(lambda g: bool(g.ecc_uncorrected))))
    for xid in sorted(set(gpu.xid_events) & policy.fatal_xids - {XID_FELL_OFF_BUS}):
        meaning = FATAL_XIDS.get(xid, "an XID this node treats as fatal")
        out.append(condition("xid", f"XID {xid}, {meaning}", start(_has_xid(xid))))
    hot = sorted(THERMAL_REASONS & set(gpu.throttle_reasons))
    if hot:
        since = start(lambda g: bool(THERMAL_REASONS & set(g.throttle_reasons)))
        lasted = samples[-1].sampled_at - since
        if lasted >= policy.thermal_sustained_s:
            temp = f" at {gpu.temperature_c} C" if gpu.temperature_c is not None else ""
            detail = f"thermal slowdown ({', '.join(hot)}) for {lasted:.0f} s{temp}"
            out.append(condition("thermal", detail, since, fatal=False))
    return out


def _has_xid(xid: int) -> Callable[[GpuInfo], bool]:
    return lambda g: xid in g.xid_events


def _run_start(samples: list[GpuInventory], pred: Callable[[GpuInventory], bool], policy: HealthPolicy) -> float:
    """When the run of samples ending at the last one, all matching ``pred``, began."""
    since = samples[-1].sampled_at
    for i in range(len(samples) - 2, -1, -1):
        if not pred(samples[i]) or samples[i + 1].sampled_at - samples[i].sampled_at > policy.max_sample_gap_s:
            break
        since = samples[i].sampled_at
    return since


def annotate(inventory: GpuInventory, conditions: Iterable[GpuCondition]) -> GpuInventory:
    """A copy of ``inventory`` with each GPU's ``healthy`` and ``problems`` set from ``conditions``."""
    conds = list(conditions)
    gpus = []
    for gpu in inventory.gpus:
        mine = [c for c in conds if c.gpu_uuid == gpu.uuid]
        problems = list(gpu.problems) + [c.detail for c in mine if c.detail not in gpu.problems]
        gpus.append(gpu.model_copy(update={"healthy": not gpu.lost and not mine, "problems": problems}))
    return inventory.model_copy(update={"gpus": gpus})


def healthy_gpus(inventory: GpuInventory, conditions: Iterable[GpuCondition]) -> list[GpuInfo]:
    """The GPUs that may take work: none while the driver is in error, else those no condition names."""
    conds = list(conditions)
    if inventory.error is not None or any(c.kind == "driver" for c in conds):
        return []
    bad = {c.gpu_uuid for c in conds if c.gpu_uuid is not None}
    return [g for g in inventory.gpus if not g.lost and g.uuid not in bad]


def can_checkpoint(conditions: Iterable[GpuCondition], gpu_uuids: Iterable[str]) -> bool:
    """Whether a job on ``gpu_uuids`` can still be checkpointed: none of its GPUs stopped answering.

    When False, the scheduler restores the job from its last checkpoint instead.
    """
    uuids = set(gpu_uuids)
    return not any(c.gpu_uuid in uuids and not c.gpu_responds for c in conditions)
