"""What `ferry migrate --live -o json` prints, computed from what the nodes measured."""

from typing import Any

from ferry.common.models import Job, Op
from ferry.common.opargs import LiveMove


def live_result(job: Job, op: Op, now: float) -> dict[str, Any]:
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
    }
