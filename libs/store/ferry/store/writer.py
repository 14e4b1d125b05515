"""Writing a checkpoint: cut its files into chunks, hash them, upload what the store lacks (into
packs, ``ferry.store.packs``, or each chunk on its own), then commit the manifest.

Files are memory-mapped batch by batch and named in place (sha256, or a tenant's keyed BLAKE3);
only chunks that must be uploaded are copied (into their stored form, sealed with a store's keys).
Hashing, zstd and AES-GCM release the GIL, so the pool's threads use every core. The source files
must not change while they are written (CRIU images never do).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ferry.common.errors import ConflictError, UsageError
from ferry.store.backend import Backend
from ferry.store.chunkform import ChunkForm
from ferry.store.errors import StoreError
from ferry.store.leases import Leases
from ferry.store.manifest import (
    ChunkRef,
    FileEntry,
    Manifest,
    check_id,
    chunk_key,
    encode_manifest,
    manifest_key,
)
from ferry.store.packs import Packer, damage_key, patch_pack
from ferry.store.parallel import Progress, run_all
from ferry.store.reader import fetch_chunk
from ferry.store.sources import SourceFile, plan_sources
from ferry.store.verified import VerifiedChunks

log = logging.getLogger(__name__)

BATCH_BYTES = 8 * 1024 * 1024


class WriteResult(BaseModel):
    """What one write_checkpoint did; sizes in bytes."""

    manifest: Manifest
    bytes_logical: int
    bytes_uploaded: int
    bytes_stored: int = 0  # what the checkpoint's distinct chunks take in the store, compressed
    bytes_new_plain: int
    chunks_total: int
    chunks_new: int
    chunks_repaired: int = 0  # stored copies found damaged and uploaded again
    seconds: float


class _Uploads:
    """Decides, once per distinct chunk of a write, where it is stored: reused where the store
    already holds it whole, else uploaded (into a pack with a ``packer``, on its own without), and
    counts it. A chunk's ``ChunkRef`` says where it lies."""

    def __init__(self, backend: Backend, form: ChunkForm, verified: VerifiedChunks, job: str,
                 verify_all: bool, packer: Packer | None = None,
                 reusable: tuple[Mapping[str, ChunkRef], Collection[tuple[str, int]]] | None = None) -> None:
        self._backend, self._form, self._verified = backend, form, verified
        self._job, self._verify_all = job, verify_all
        self._packer = packer
        self._reusable, self._damaged = reusable or ({}, frozenset())
        self._patching = threading.Lock()  # one repair of a pack at a time: each stores it whole
        self._refs: dict[str, ChunkRef] = {}
        self._pending: dict[str, threading.Event] = {}  # placed by another thread right now
        self._lock = threading.Lock()
        self.chunks_new = self.bytes_uploaded = self.bytes_new_plain = self.chunks_repaired = 0
        self.bytes_stored = 0  # every distinct chunk the checkpoint uses, as stored (compressed)

    def offer(self, digest: str, plain: memoryview) -> ChunkRef:
        with self._lock:
            ref = self._refs.get(digest)
            if ref is not None:
                return ref
            waiting = self._pending.get(digest)
            if waiting is None:
                self._pending[digest] = threading.Event()
        if waiting is not None:
            waiting.wait()
            with self._lock:
                ref = self._refs.get(digest)
            if ref is None:  # the thread that placed it failed, and so does the write
                raise StoreError(f"chunk {digest[:12]}… could not be stored")
            return ref
        try:
            ref = self._place(digest, plain)
            with self._lock:
                self._refs[digest] = ref
        finally:
            with self._lock:
                done = self._pending.pop(digest)
            done.set()
        return ref

    def _place(self, digest: str, plain: memoryview) -> ChunkRef:
        old = self._reusable.get(digest) if self._packer is not None else None
        repaired = False
        stored: bytes | None = None
        if self._packer is None or (old is not None and old.pack is None):
            size = self._backend.stored_size(chunk_key(digest))  # on its own (a store from before packs)
            if size is not None:
                if self._trusted(digest) or self._whole(ChunkRef.model_construct(hash=digest, size=len(plain))):
                    return self._reused(ChunkRef.model_construct(hash=digest, size=len(plain)), size)
                log.warning("chunk %s… in the store is damaged: uploading it again", digest[:12])
                repaired = True
        elif old is not None:
            damaged = (old.pack, old.at) in self._damaged
            if not damaged and (self._trusted(digest) or self._whole(old)):
                return self._reused(old, old.stored)
            stored = self._form.encode(digest, plain)
            with self._patching:
                patched = patch_pack(self._backend, old, stored)
            if patched:  # mended where it lies: every checkpoint using that place is whole again
                log.warning("chunk %s… in pack %s… was damaged: written again in place", digest[:12], old.pack)
                self._count(len(plain), len(stored), repaired=True)
                return self._reused(old, 0)
            log.warning("chunk %s… in pack %s… is damaged: packing it again", digest[:12], old.pack)
            self._backend.put(damage_key(old.pack or "", old.at), b"")  # so no later checkpoint reuses it
            repaired = True
        if stored is None:  # not encoded yet for a repair in place that could not be made
            stored = self._form.encode(digest, plain)
        if self._packer is None:
            self._backend.put(chunk_key(digest), stored)
            ref = ChunkRef.model_construct(hash=digest, size=len(plain))
        else:
            pack, at = self._packer.add(stored)
            ref = ChunkRef.model_construct(hash=digest, size=len(plain), pack=pack, at=at, stored=len(stored))
        self._verified.mark(self._job, digest)
        self._count(len(plain), len(stored), repaired)
        return ref

    def _count(self, plain: int, stored: int, repaired: bool) -> None:
        with self._lock:
            self.chunks_new += 1
            self.chunks_repaired += repaired
            self.bytes_uploaded += stored
            self.bytes_stored += stored
            self.bytes_new_plain += plain

    def _trusted(self, digest: str) -> bool:
        return not self._verify_all and self._verified.trusted(self._job, digest)

    def _whole(self, ref: ChunkRef) -> bool:
        """Whether the stored copy decodes to bytes with this hash (a damaged one is replaced)."""
        return fetch_chunk(self._backend, self._form, ref)[1] is None

    def _reused(self, ref: ChunkRef, stored_size: int) -> ChunkRef:
        self._verified.mark(self._job, ref.hash)
        with self._lock:
            self.bytes_stored += stored_size
        return ref


def _batches(source: SourceFile) -> list[tuple[int, int]]:
    """Consecutive span ranges ``[first, end)`` of about BATCH_BYTES each."""
    out, first, size = [], 0, 0
    for i, (_, n) in enumerate(source.spans):
        size += n
        if size >= BATCH_BYTES:
            out.append((first, i + 1))
            first, size = i + 1, 0
    if first < len(source.spans):
        out.append((first, len(source.spans)))
    return out


def _chunk_batch(source: SourceFile, first: int, end: int, form: ChunkForm, uploads: _Uploads,
                 progress: Progress) -> list[ChunkRef]:
    spans = source.spans[first:end]
    start, stop = spans[0][0], spans[-1][0] + spans[-1][1]
    base = start - start % mmap.ALLOCATIONGRANULARITY
    refs = []
    try:
        with open(source.path, "rb") as f:
            if os.fstat(f.fileno()).st_size != source.size:
                raise StoreError(f"{source.path} changed size while being checkpointed")
            mm = mmap.mmap(f.fileno(), stop - base, offset=base, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise StoreError(f"cannot read {source.path}: {exc.strerror or exc}") from exc
    try:
        with memoryview(mm) as view:
            for off, n in spans:
                with view[off - base : off - base + n] as piece:
                    refs.append(uploads.offer(form.name(piece), piece))
                progress.add(n)
    finally:
        mm.close()
    return refs


def write_checkpoint(
    backend: Backend,
    form: ChunkForm,
    leases: Leases,
    *,
    workers: int,
    gc_wait: float,
    page_chunk: int,
    job: str,
    tenant: str,
    checkpoint: str,
    parent: str | None,
    src_dir: Path,
    files: Sequence[str] | None,
    page_maps: Mapping[str, Sequence[tuple[int, int]]] | None,
    meta: Mapping[str, Any] | None,
    verified: VerifiedChunks,
    verify_all: bool,
    progress: Callable[[int, int], None] | None,
    pack_bytes: int = 0,
    reusable: Callable[[], tuple[Mapping[str, ChunkRef], Collection[tuple[str, int]]]] | None = None,
) -> WriteResult:
    """See CheckpointStore.write_checkpoint."""
    started = time.monotonic()
    key = manifest_key(job, checkpoint)
    if parent is not None:
        check_id(parent, "parent checkpoint id")
    try:
        meta_dict = json.loads(json.dumps(to_jsonable_python(dict(meta or {})), allow_nan=False))
    except (PydanticSerializationError, ValueError) as exc:
        raise UsageError(f"checkpoint meta must be plain JSON data: {exc}") from exc
    sources = plan_sources(Path(src_dir), files, page_maps, page_chunk)
    tracker = Progress(progress, sum(s.size for s in sources))
    with leases.writing(gc_wait):
        if backend.exists(key):
            raise ConflictError(f"checkpoint {checkpoint} of job {job} already exists; use a new checkpoint id")
        packer = Packer(backend, pack_bytes) if pack_bytes else None
        uploads = _Uploads(backend, form, verified, job, verify_all, packer,
                           reusable() if packer is not None and reusable is not None else None)
        tasks: list[Callable[[], list[ChunkRef]]] = []
        owners: list[int] = []
        for index, source in enumerate(sources):
            for first, end in _batches(source):
                tasks.append(partial(_chunk_batch, source, first, end, form, uploads, tracker))
                owners.append(index)
        chunks: list[list[ChunkRef]] = [[] for _ in sources]
        try:
            for index, refs in zip(owners, run_all(tasks, workers), strict=True):
                chunks[index].extend(refs)
            if packer is not None:
                packer.flush()  # every pack stored before the manifest that names it
        except BaseException:
            if packer is not None:
                packer.abort()  # a pack not yet stored leaves nothing behind
            raise
        manifest = Manifest(
            job=job,
            checkpoint=checkpoint,
            parent=parent,
            created=time.time(),
            files=[
                FileEntry(path=s.rel, size=s.size, mode=s.mode, chunks=c) for s, c in zip(sources, chunks, strict=True)
            ],
            meta=meta_dict,
            tenant=tenant,
            key_id=form.keys.key_id if form.keys else "",
        )
        backend.put(key, encode_manifest(manifest, form.keys))
        verified.keep_only(job, manifest.chunk_hashes())
    return WriteResult(
        manifest=manifest,
        bytes_logical=manifest.bytes_logical,
        bytes_uploaded=uploads.bytes_uploaded,
        bytes_stored=uploads.bytes_stored,
        bytes_new_plain=uploads.bytes_new_plain,
        chunks_total=sum(len(c) for c in chunks),
        chunks_new=uploads.chunks_new,
        chunks_repaired=uploads.chunks_repaired,
        seconds=time.monotonic() - started,
    )
