"""Which checkpoint a restore falls back to when the one it was given does not verify.

Pure: the job's checkpoint records in, the newest committed one that is older than every
checkpoint already found unverifiable (and is none of them) out.
"""

from collections.abc import Iterable

from ferry.common.models import CheckpointRecord


def older_checkpoint(records: Iterable[CheckpointRecord], unverifiable: dict[str, float]) -> CheckpointRecord | None:
    """`unverifiable` maps the checkpoints that failed to their creation times; None: nothing left."""
    oldest_bad = min(unverifiable.values(), default=float("inf"))
    candidates = [r for r in records if r.state == "committed" and r.id not in unverifiable
                  and r.created < oldest_bad]
    return max(candidates, key=lambda r: r.created, default=None)
