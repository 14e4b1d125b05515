"""Garbage collection: delete the chunks and packs that no remaining manifest references.

Safety against concurrent writers (see ``leases``): chunks and packs are listed first, without
any lease, so one written after that listing is never a candidate. gc then takes the gc lease and waits
until no writer is active (new writers wait for gc); only then does it read every manifest, so
every checkpoint that could rely on a listed chunk has either committed its manifest (and keeps
the chunk) or has not yet looked at the store. If writers stay active past ``drain_timeout``, gc
deletes nothing and reports ``deferred``. An unreadable manifest stops gc before any deletion,
since the chunks it needs are unknown. While it holds the lease with no writer active, gc also
removes what writers killed mid-object left (a local pack's temporary file), when no one wrote to
it for a lease's lifetime.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from pydantic import BaseModel

from ferry.store.backend import Backend, SizedListing, UnfinishedWrites
from ferry.store.errors import ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.keys import KeyRing
from ferry.store.leases import Leases
from ferry.store.manifest import chunk_key, decode_manifest, pack_key
from ferry.store.packs import DAMAGED, parse_damage_key
from ferry.store.parallel import run_all

_CHUNK = re.compile(r"chunks/([0-9a-f]{64})")
_PACK = re.compile(r"packs/([0-9a-f]{32})")
_MANIFEST = re.compile(r"manifests/([^/]+)/([^/]+)\.json")
_BATCH = 256
_WRITTEN = ("chunks/", "packs/", "manifests/")  # what checkpoint writers write, under their leases


class GcResult(BaseModel):
    """What one gc did; ``bytes_freed`` counts stored bytes (0 for backends that list no sizes).
    Chunks are those stored on their own; packs hold many (``ferry.store.packs``)."""

    chunks_deleted: int = 0
    bytes_freed: int = 0
    chunks_kept: int = 0
    packs_deleted: int = 0
    packs_kept: int = 0
    quarantined_deleted: int = 0
    unfinished_deleted: int = 0  # partial objects killed writers left
    deferred: bool = False

    @property
    def objects_deleted(self) -> int:
        return self.chunks_deleted + self.packs_deleted


def _stored(backend: Backend, prefix: str, pattern: re.Pattern[str]) -> dict[str, int]:
    listing = (
        backend.list_sizes(prefix)
        if isinstance(backend, SizedListing)
        else ((key, 0) for key in backend.list(prefix))
    )
    return {m.group(1): size for key, size in listing if (m := pattern.fullmatch(key))}


def _referenced(backend: Backend, workers: int, keyring: KeyRing | None) -> tuple[set[str], set[str]]:
    """The chunk hashes and the packs the kept manifests use."""
    keys = [(key, m.group(2)) for key in backend.list("manifests/") if (m := _MANIFEST.fullmatch(key))]

    def read(key: str, checkpoint: str) -> tuple[set[str], set[str]]:
        try:
            manifest = decode_manifest(backend.get(key), checkpoint, keyring)
        except ObjectNotFound:  # deleted meanwhile
            return set(), set()
        except ManifestCorrupt as exc:
            raise StoreError(
                f"gc stopped before deleting anything: {key} is unreadable ({exc.reason}); "
                "remove that checkpoint (delete_checkpoint) and run gc again"
            ) from exc
        return manifest.chunk_hashes(), manifest.packs()

    tasks: list[Callable[[], tuple[set[str], set[str]]]] = [partial(read, k, c) for k, c in keys]
    hashes: set[str] = set()
    packs: set[str] = set()
    for used, in_packs in run_all(tasks, workers):
        hashes |= used
        packs |= in_packs
    return hashes, packs


def collect_garbage(backend: Backend, leases: Leases, *, workers: int, drain_timeout: float,
                    keyring: KeyRing | None = None) -> GcResult:
    """See CheckpointStore.gc."""
    stored = _stored(backend, "chunks/", _CHUNK)
    packed = _stored(backend, "packs/", _PACK)
    with leases.collecting(drain_timeout) as drained:
        if not drained:
            return GcResult(chunks_kept=len(stored), packs_kept=len(packed), deferred=True)
        referenced, used_packs = _referenced(backend, workers, keyring)
        orphans = [chunk_key(h) for h in stored if h not in referenced]
        dead_packs = [p for p in packed if p not in used_packs]

        def delete(batch: list[str]) -> None:
            for key in batch:
                backend.delete(key)

        doomed = orphans + [pack_key(p) for p in dead_packs]
        groups = [doomed[i : i + _BATCH] for i in range(0, len(doomed), _BATCH)]
        run_all([partial(delete, g) for g in groups], workers)
        # damage markers go with their pack (one listed after gc began names a pack still kept)
        for key in list(backend.list(DAMAGED)):
            if (found := parse_damage_key(key)) is None or found[0] not in used_packs:
                backend.delete(key)
        # damaged chunks a restore or verify set aside: they hold process memory, so they go too
        quarantined = list(backend.list("quarantine/"))
        for key in quarantined:
            backend.delete(key)
        unfinished = 0
        if isinstance(backend, UnfinishedWrites):
            unfinished = sum(backend.remove_unfinished(prefix, leases.ttl) for prefix in _WRITTEN)
    return GcResult(
        quarantined_deleted=len(quarantined),
        unfinished_deleted=unfinished,
        chunks_deleted=len(orphans),
        packs_deleted=len(dead_packs),
        bytes_freed=sum(stored[h] for h in stored if h not in referenced) + sum(packed[p] for p in dead_packs),
        chunks_kept=len(stored) - len(orphans),
        packs_kept=len(packed) - len(dead_packs),
    )
