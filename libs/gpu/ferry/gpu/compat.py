"""Whether a GPU checkpoint can be restored on a target, checked before anything is touched. Pure code.

The CUDA driver restores device memory only onto GPUs of the same chip with enough memory, one for
each GPU the process had, and its checkpoint API exists from driver 570 on. Ferry asks for more than
the chip: the same model name (an "H100 PCIe" checkpoint is not restored on an "H100 SXM"), the same
count, healthy GPUs, and a driver no older (by major version) than the one that took the checkpoint;
by default the very same driver version (see ``check_restore_target``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ferry.gpu.errors import GpuMismatch
from ferry.gpu.models import GpuInfo, GpuSnapshot

__all__ = ["MIN_DRIVER_MAJOR", "check_restore_target", "device_map", "driver_major", "snapshot_of"]

MIN_DRIVER_MAJOR = 570  # the first driver with cuCheckpointProcess* and cuda-checkpoint --action


def driver_major(version: str | None) -> int | None:
    """570 for "570.86.10"; None when there is no version or it is not one."""
    m = re.match(r"^\s*(\d+)", version or "")
    return int(m.group(1)) if m else None


def _same_model(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def snapshot_of(gpus: Sequence[GpuInfo], driver_version: str) -> GpuSnapshot:
    """What to keep with a checkpoint of a job that ran on ``gpus`` (one model, see placement)."""
    return GpuSnapshot(
        model=gpus[0].model if gpus else "",
        count=len(gpus),
        driver_version=driver_version,
        uuids=[g.uuid for g in gpus],
    )


def check_restore_target(
    source: GpuSnapshot, target_gpus: Sequence[GpuInfo], target_driver: str | None, *, same_driver: bool = True
) -> None:
    """Raises ``GpuMismatch`` naming every difference (model, count, health, driver); returns when all fit.

    ``same_driver``: also refuse any other driver version than the checkpoint's, even a newer one. The
    dumped process maps the driver's versioned libraries (``libcuda.so.570.86.10``), and CRIU restores
    those mappings from the same paths, which only the same driver version provides.
    """
    diffs: list[str] = []
    n = len(target_gpus)
    if n != source.count:
        diffs.append(
            f"{'fewer' if n < source.count else 'more'} GPUs: the checkpoint used {source.count}, the target offers {n}"
        )
    others = sorted({g.model for g in target_gpus if not _same_model(g.model, source.model)})
    if others:
        diffs.append(f"GPU model differs: the checkpoint ran on {source.model}, the target has {', '.join(others)}")
    for g in target_gpus:
        if g.lost or not g.healthy:
            diffs.append(f"target GPU {g.index} ({g.uuid}) is unhealthy" + (f": {g.problems[0]}" if g.problems else ""))
    target_major, source_major = driver_major(target_driver), driver_major(source.driver_version)
    if target_major is None:
        diffs.append("the target's NVIDIA driver version is unknown (is the driver installed?)")
    elif target_major < MIN_DRIVER_MAJOR:
        diffs.append(
            f"NVIDIA driver {target_driver} on the target is older than {MIN_DRIVER_MAJOR}, "
            "the first with CUDA checkpoint and restore"
        )
    elif source_major is not None and target_major < source_major:
        diffs.append(
            f"NVIDIA driver {target_driver} on the target is older than the checkpoint's {source.driver_version}"
        )
    elif same_driver and (target_driver or "").strip() != source.driver_version.strip():
        diffs.append(
            f"NVIDIA driver differs: the checkpoint was taken with {source.driver_version}, the target has "
            f"{target_driver} (the job maps that driver's libcuda.so.{source.driver_version})"
        )
    if diffs:
        raise GpuMismatch(diffs)


def device_map(source_uuids: Sequence[str], target_gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """The restore's GPU remapping, checkpointed UUID -> target UUID, pairing them in order."""
    if len(source_uuids) != len(target_gpus):
        raise GpuMismatch(
            [f"cannot map {len(source_uuids)} checkpointed GPUs onto {len(target_gpus)} target GPUs"]
        )
    return {old: new.uuid for old, new in zip(source_uuids, target_gpus, strict=True)}
