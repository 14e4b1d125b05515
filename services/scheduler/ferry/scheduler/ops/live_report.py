"""What `ferry migrate --live -o json` prints, computed from what the nodes measured."""

from typing import Any

from ferry.common.models import Job, Op
from ferry.common.opargs import LiveMove
from ferry.policy.lost import Lost, fields, lost


def live_result(job: Job, op: Op, now: float, restored_at: float | None = None) -> dict[str, Any]:
    """What the move measured; `restored_at`: when a pre-copy move's target ran (its node's clock)."""
    a = op.args
    assert isinstance(a, LiveMove)
    frozen, restored, local = a.frozen, a.restored, a.local
    last = frozen.last_write_at if frozen else None
    first = local.first_write_at if local else None
    running_at = restored.running_at if restored else None
    frozen_at = frozen.frozen_at if frozen else None
    return {
        "job": job.name, "from": a.source, "to": a.target, "mode": a.mode,
        "rounds": len(a.rounds),
        "round_why": a.round_why,
        "bytes_precopy": sum(r.bytes_uploaded for r in a.rounds),
        "bytes_final": frozen.bytes_final if frozen else a.final_bytes,
        "round_freeze_ms": [r.freeze_ms for r in a.rounds],
        "freeze_ms": frozen.freeze_ms if frozen else a.final_freeze_ms,
        "downtime_ms": (first - last) * 1000 if first is not None and last is not None else None,
        "switch_ms": (running_at - frozen_at) * 1000 if running_at and frozen_at else None,
        "restore_ms": restored.restore_ms if restored else None,
        "degraded_ms": local.degraded_ms if local else None,
        "bytes_lazy": local.bytes_lazy if local else None,
        "total_ms": (now - op.created) * 1000,
        **fields(move_lost(a, restored_at or now)),
    }


def move_lost(a: LiveMove, now: float) -> Lost | None:
    """What the live move cost the job (ferry.policy.lost): post-copy from its first round's dump to
    every page on the target; pre-copy to its restore, at `now`. None for a move that fell back to an
    older checkpoint (what it lost is the work since that checkpoint, not measured here)."""
    if a.fallback_error:
        return None
    first = a.rounds[0] if a.rounds else None
    paused = sum(r.freeze_ms for r in a.rounds) / 1000
    frozen, restored, local = a.frozen, a.restored, a.local
    if frozen is not None:  # post-copy
        if local is None or local.local_at is None or restored is None or restored.running_at is None:
            return None
        t0 = first.dumped_at if first is not None and first.dumped_at else frozen.started_at
        c0 = first.cpu_s if first is not None else frozen.cpu_s
        cores = first.cores if first is not None else frozen.cores
        used = None if None in (c0, frozen.cpu_s, local.cpu_s) else \
            (frozen.cpu_s or 0.0) - (c0 or 0.0) + (local.cpu_s or 0.0)
        paused += max(0.0, restored.running_at - (frozen.frozen_at or frozen.started_at))
        return lost(local.local_at - t0, used, cores, paused) if t0 else None
    if a.dumped_at is None:  # pre-copy, restored at `now` from its final checkpoint
        return None
    t0 = first.dumped_at if first is not None and first.dumped_at else a.dumped_at
    used = None if first is None or first.cpu_s is None or a.final_cpu_s is None else a.final_cpu_s - first.cpu_s
    return lost(now - t0, used, first.cores if first is not None else None, paused + now - a.dumped_at)
