"""Which GPUs of a node a job gets. Pure code: the scheduler passes the node's GPUs and who uses them.

A GPU fits a request when its model contains the requested one (case-insensitive: "H100" matches
"NVIDIA H100 80GB HBM3"), its total memory is at least the requested memory, it is healthy, and it is
free; a ``shared`` request may also take a GPU whose every user asked to share. All GPUs of one job are
of one model (a restore needs the same model and count, and CUDA works best that way); among those
that fit, the lowest indexes are taken (for shared requests: GPUs already shared, least used first).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ferry.common.units import format_bytes
from ferry.gpu.models import GpuInfo

__all__ = ["GpuRequest", "assign", "available", "cuda_visible_devices", "model_matches"]


class GpuRequest(BaseModel):
    """What a job asks for: ``ferry run --gpus 2 --gpu-model H100 --gpu-memory 40GiB [--gpu-shared]``."""

    model_config = ConfigDict(frozen=True)

    count: int = Field(default=0, ge=0)
    model: str | None = None
    memory_bytes: int | None = Field(default=None, ge=0)  # total memory of each GPU, at least
    shared: bool = False

    def describe(self) -> str:
        """ "2 H100 GPUs with >= 40.0 GiB each" """
        what = f"{self.count} {self.model + ' ' if self.model else ''}GPU{'s' if self.count != 1 else ''}"
        if self.memory_bytes:
            what += f" with >= {format_bytes(self.memory_bytes)}" + (" each" if self.count > 1 else "")
        return what + (" (shared)" if self.shared else "")


def model_matches(wanted: str, model: str) -> bool:
    """Case-insensitive substring match, blanks ignored: "h100" matches "NVIDIA H100 80GB HBM3"."""
    return "".join(wanted.lower().split()) in "".join(model.lower().split())


def _misfit(
    request: GpuRequest, gpu: GpuInfo, in_use: Mapping[str, Sequence[str]], shared_jobs: Collection[str]
) -> str | None:
    """Why ``gpu`` cannot take the request, as a category, or None when it can."""
    if request.model and not model_matches(request.model, gpu.model):
        return "model"
    if request.memory_bytes and gpu.memory_total < request.memory_bytes:
        return "memory"
    if not gpu.healthy or gpu.lost:
        return "unhealthy"
    users = in_use.get(gpu.uuid, ())
    if users and not (request.shared and all(u in shared_jobs for u in users)):
        return "busy"
    return None


def available(
    request: GpuRequest,
    gpus: Sequence[GpuInfo],
    in_use: Mapping[str, Sequence[str]] | None = None,
    *,
    shared_jobs: Collection[str] = (),
) -> list[GpuInfo]:
    """Every GPU that could take (one GPU of) the request now, in index order."""
    used = in_use or {}
    return sorted((g for g in gpus if _misfit(request, g, used, shared_jobs) is None), key=lambda g: g.index)


def assign(
    request: GpuRequest,
    gpus: Sequence[GpuInfo],
    in_use: Mapping[str, Sequence[str]] | None = None,
    *,
    shared_jobs: Collection[str] = (),
) -> list[GpuInfo] | str:
    """The GPUs to give the job (index order), or one line saying why the node cannot.

    ``in_use`` maps a GPU UUID to the jobs holding it; ``shared_jobs`` are the jobs that asked to share.
    """
    if request.count == 0:
        return []
    used = in_use or {}
    fit = available(request, gpus, used, shared_jobs=shared_jobs)
    if request.shared:
        fit.sort(key=lambda g: (not used.get(g.uuid), len(used.get(g.uuid, ())), g.index))
    groups: dict[str, list[GpuInfo]] = {}
    for g in fit:
        groups.setdefault(g.model, []).append(g)
    for group in groups.values():
        if len(group) >= request.count:
            return sorted(group[: request.count], key=lambda g: g.index)
    return _reason(request, gpus, used, shared_jobs, groups)


def _reason(
    request: GpuRequest,
    gpus: Sequence[GpuInfo],
    used: Mapping[str, Sequence[str]],
    shared_jobs: Collection[str],
    groups: Mapping[str, list[GpuInfo]],
) -> str:
    wants = f"needs {request.describe()}"
    if not gpus:
        return f"{wants}, the node has no GPUs"
    fitting = sum(len(g) for g in groups.values())
    if fitting >= request.count:
        mix = ", ".join(f"{len(g)} {model}" for model, g in groups.items())
        return f"{wants} of one model, the node has {mix}"
    counts: dict[str, int] = {}
    busy_jobs: list[str] = []
    for g in gpus:
        why = _misfit(request, g, used, shared_jobs)
        if why is not None:
            counts[why] = counts.get(why, 0) + 1
        if why == "busy":
            busy_jobs += [j for j in used.get(g.uuid, ()) if j not in busy_jobs]
    holders = f" by {', '.join(busy_jobs[:3])}{' ...' if len(busy_jobs) > 3 else ''}" if busy_jobs else ""
    labels = {
        "model": f"not {request.model}",
        "memory": f"under {format_bytes(request.memory_bytes or 0)}",
        "unhealthy": "unhealthy",
        "busy": f"in use{holders}",
    }
    parts = [f"{counts[why]} {label}" for why, label in labels.items() if why in counts]
    return f"{wants}, {fitting} of the node's {len(gpus)} fit ({'; '.join(parts)})"


def cuda_visible_devices(gpus: Sequence[GpuInfo]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a job: the GPUs' UUIDs, comma-separated, in the given order.

    UUIDs, not indexes: NVML's and CUDA's indexes can differ (CUDA orders by speed unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID) and change when a GPU is added, removed or falls off the bus; a UUID
    always names the same GPU. An empty list gives "": the job sees no GPU at all.
    """
    return ",".join(g.uuid for g in gpus)
