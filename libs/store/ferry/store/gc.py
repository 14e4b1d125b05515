"""Garbage collection: delete the chunks that no remaining manifest references.

Safety against concurrent writers (see ``leases``): chunks are listed first, without any lease,
so a chunk written after that listing is never a candidate. gc then takes the gc lease and waits
until no writer is active (new writers wait for gc); only then does it read every manifest, so
every checkpoint that could rely on a listed chunk has either committed its manifest (and keeps
the chunk) or has not yet looked at the store. If writers stay active past ``drain_timeout``, gc
deletes nothing and reports ``deferred``. An unreadable manifest stops gc before any deletion,
since the chunks it needs are unknown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from pydantic import BaseModel

from ferry.store.backend import Backend, SizedListing
from ferry.store.errors import ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.keys import KeyRing
from ferry.store.leases import Leases
from ferry.store.manifest import chunk_key, decode_manifest
from ferry.store.parallel import run_all

_CHUNK = re.compile(r"chunks/([0-9a-f]{64})")
_MANIFEST = re.compile(r"manifests/([^/]+)/([^/]+)\.json")
_BATCH = 256


class GcResult(BaseModel):
    """What one gc did; ``bytes_freed`` counts stored bytes (0 for backends that list no sizes)."""

    chunks_deleted: int = 0
    bytes_freed: int = 0
    chunks_kept: int = 0
    quarantined_deleted: int = 0
    deferred: bool = False


def _stored_chunks(backend: Backend) -> dict[str, int]:
    listing = (
        backend.list_sizes("chunks/")
        if isinstance(backend, SizedListing)
        else ((key, 0) for key in backend.list("chunks/"))
    )
    return {m.group(1): size for key, size in listing if (m := _CHUNK.fullmatch(key))}


def _referenced(backend: Backend, workers: int, keyring: KeyRing | None) -> set[str]:
    keys = [(key, m.group(2)) for key in backend.list("manifests/") if (m := _MANIFEST.fullmatch(key))]

    def read(key: str, checkpoint: str) -> set[str]:
        try:
            return decode_manifest(backend.get(key), checkpoint, keyring).chunk_hashes()
        except ObjectNotFound:  # deleted meanwhile
            return set()
        except ManifestCorrupt as exc:
            raise StoreError(
                f"gc stopped before deleting anything: {key} is unreadable ({exc.reason}); "
                "remove that checkpoint (delete_checkpoint) and run gc again"
            ) from exc

    tasks: list[Callable[[], set[str]]] = [partial(read, k, c) for k, c in keys]
    referenced: set[str] = set()
    for hashes in run_all(tasks, workers):
        referenced |= hashes
    return referenced


def collect_garbage(backend: Backend, leases: Leases, *, workers: int, drain_timeout: float,
                    keyring: KeyRing | None = None) -> GcResult:
    """See CheckpointStore.gc."""
    stored = _stored_chunks(backend)
    with leases.collecting(drain_timeout) as drained:
        if not drained:
            return GcResult(chunks_kept=len(stored), deferred=True)
        referenced = _referenced(backend, workers, keyring)
        orphans = [h for h in stored if h not in referenced]

        def delete(batch: list[str]) -> None:
            for h in batch:
                backend.delete(chunk_key(h))

        groups = [orphans[i : i + _BATCH] for i in range(0, len(orphans), _BATCH)]
        run_all([partial(delete, g) for g in groups], workers)
        # damaged chunks a restore or verify set aside: they hold process memory, so they go too
        quarantined = list(backend.list("quarantine/"))
        for key in quarantined:
            backend.delete(key)
    return GcResult(
        quarantined_deleted=len(quarantined),
        chunks_deleted=len(orphans),
        bytes_freed=sum(stored[h] for h in orphans),
        chunks_kept=len(stored) - len(orphans),
    )
