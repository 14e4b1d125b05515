"""Checking a whole store: which kept checkpoints would restore, and why the others would not.

Every manifest is read and checked (its digest), then every distinct stored chunk any of them
uses (a packed copy by its place) is fetched, decoded and hashed once. With ``repair``, damaged
chunks are quarantined (the next checkpoint holding those bytes uploads them again, mending every
checkpoint after it) and gc removes what no checkpoint uses. Nothing else is ever deleted: a
checkpoint that does not restore is reported, not removed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

from pydantic import BaseModel

from ferry.store.backend import Backend
from ferry.store.chunkform import ChunkForm
from ferry.store.errors import ManifestCorrupt, ObjectNotFound
from ferry.store.keys import KeyRing
from ferry.store.manifest import ChunkRef, Manifest, decode_manifest
from ferry.store.parallel import Progress, run_all
from ferry.store.reader import fetch_chunk, quarantine

_MANIFEST = re.compile(r"manifests/([^/]+)/([^/]+)\.json")


class CheckpointHealth(BaseModel):
    job: str
    checkpoint: str
    restorable: bool
    problem: str | None = None  # the first reason it would not restore


class StoreReport(BaseModel):
    checkpoints: list[CheckpointHealth]
    chunks_checked: int
    chunks_bad: int
    bytes_read: int
    quarantined: int = 0
    orphans_deleted: int = 0
    gc_error: str | None = None

    @property
    def ok(self) -> bool:
        return all(c.restorable for c in self.checkpoints)


def verify_store(backend: Backend, forms: Callable[[Manifest], ChunkForm], *, workers: int, repair: bool,
                 keyring: KeyRing | None = None, progress: Callable[[int, int], None] | None = None) -> StoreReport:
    """See the module's doc; gc (with ``repair``) is the caller's, which holds the leases."""
    health: list[CheckpointHealth] = []
    manifests: list[Manifest] = []
    for key in sorted(backend.list("manifests/")):
        if not (m := _MANIFEST.fullmatch(key)):
            continue
        job, checkpoint = m.groups()
        try:
            manifest = decode_manifest(backend.get(key), checkpoint, keyring)
        except ObjectNotFound:
            continue  # deleted meanwhile
        except ManifestCorrupt as exc:
            health.append(CheckpointHealth(job=job, checkpoint=checkpoint, restorable=False, problem=exc.reason))
            continue
        manifests.append(manifest)
    copies: dict[tuple[str, str | None, int], tuple[ChunkRef, ChunkForm]] = {}  # each stored copy once
    for mf in manifests:
        form = forms(mf)
        for f in mf.files:
            for ref in f.chunks:
                copies.setdefault(ref.where, (ref, form))
    places = sorted(copies, key=lambda w: (w[1] or "", w[2], w[0]))  # a pack's chunks in order
    tracker = Progress(progress, len(places))  # in chunks

    def check(where: tuple[str, str | None, int]) -> tuple[tuple[str, str | None, int], str | None, int]:
        ref, form = copies[where]
        _, problem, stored = fetch_chunk(backend, form, ref)
        if problem is not None and stored and repair:
            quarantine(backend, ref, stored)
        tracker.add(1)
        return where, problem, len(stored)

    results = run_all([partial(check, w) for w in places], workers)
    bad = {where: problem for where, problem, _ in results if problem is not None}
    for mf in manifests:
        first = next(((f.path, ref) for f in mf.files for ref in f.chunks if ref.where in bad), None)
        problem = f"chunk {first[1].hash[:12]}… of {first[0]}: {bad[first[1].where]}" if first else None
        health.append(CheckpointHealth(job=mf.job, checkpoint=mf.checkpoint, restorable=first is None,
                                       problem=problem))
    health.sort(key=lambda h: (h.job, h.checkpoint))
    return StoreReport(checkpoints=health, chunks_checked=len(places), chunks_bad=len(bad),
                       bytes_read=sum(read for _, _, read in results),
                       quarantined=sum(1 for p in bad.values() if p != "missing from the store") if repair else 0)
