"""Retention: which checkpoints of a job to delete so that only the newest ``keep_last`` remain."""

from __future__ import annotations

from collections.abc import Iterable

from ferry.store.manifest import Manifest


def expired(manifests: Iterable[Manifest], keep_last: int) -> list[str]:
    """Ids of all but the ``keep_last`` newest (by ``created``, then id), oldest first."""
    ordered = sorted(manifests, key=lambda m: (m.created, m.checkpoint))
    return [m.checkpoint for m in ordered[: max(0, len(ordered) - keep_last)]]
