"""Which stored chunks a writer may reuse without reading them back.

A writer deduplicates a chunk against the store only after verifying the stored copy (read back,
decoded, hashed) or uploading it itself. Trust is per job and short: a job's next checkpoint may
reuse, unread, the chunks of its own newest checkpoint that were verified or written within
``ttl`` seconds; a chunk another job wrote is read back first, and a final checkpoint (the job is
killed once it commits) reads back everything it reuses. A chunk damaged behind the writer's back
is then uploaded again by the next checkpoint that reads it; one deleted is seen missing at once.
"""

from __future__ import annotations

import threading
import time

DEFAULT_TTL = 600.0


class VerifiedChunks:
    """Thread-safe: per job, the chunks of its newest checkpoint and when each was last verified."""

    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        self.ttl = ttl
        self._jobs: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def trusted(self, job: str, digest: str) -> bool:
        with self._lock:
            when = self._jobs.get(job, {}).get(digest)
        return when is not None and time.monotonic() - when < self.ttl

    def mark(self, job: str, digest: str) -> None:
        with self._lock:
            self._jobs.setdefault(job, {})[digest] = time.monotonic()

    def keep_only(self, job: str, digests: set[str]) -> None:
        """After a commit: the job's trust covers what its newest checkpoint uses, nothing else."""
        with self._lock:
            known = self._jobs.get(job, {})
            self._jobs[job] = {d: when for d, when in known.items() if d in digests}
