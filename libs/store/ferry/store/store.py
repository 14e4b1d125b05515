"""The checkpoint store: content-addressed chunks plus one manifest per checkpoint.

    chunks/<sha256 of the plain bytes>      header byte (0 raw, 1 zstd) + payload
    manifests/<job>/<checkpoint>.json       canonical JSON with a digest, written last
    locks/...                               leases between writers and gc (see ``leases``)

A checkpoint exists once its manifest does, so a half-written checkpoint is invisible; a chunk
that fails its hash on restore raises ChunkCorrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ferry.common.errors import UsageError
from ferry.store.backend import Backend
from ferry.store.codec import ChunkCodec
from ferry.store.errors import ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.gc import GcResult, collect_garbage
from ferry.store.leases import DEFAULT_TTL, Leases
from ferry.store.manifest import Manifest, check_id, decode_manifest, manifest_key
from ferry.store.reader import restore_files
from ferry.store.retention import expired
from ferry.store.verified import DEFAULT_TTL as VERIFY_TTL
from ferry.store.verified import VerifiedChunks
from ferry.store.verify import StoreReport, verify_store
from ferry.store.writer import WriteResult, write_checkpoint

log = logging.getLogger(__name__)


class CheckpointStore:
    """Writes, reads, restores and reclaims checkpoints on one backend; safe to share between threads.

    ``workers`` threads hash, compress and move chunks; ``zstd_level`` sets compression. Writers
    wait at most ``gc_wait`` seconds for a running gc; ``lease_ttl`` is when a lease left by a
    crashed writer or gc stops counting; a job's chunks verified whole are trusted by its next
    checkpoint for ``verify_ttl`` seconds.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        workers: int = 2,
        zstd_level: int = 1,
        gc_wait: float = 300.0,
        lease_ttl: float = DEFAULT_TTL,
        verify_ttl: float = VERIFY_TTL,
    ) -> None:
        if workers < 1:
            raise UsageError(f"workers must be at least 1, got {workers}")
        self.backend = backend
        self.workers = workers
        self.gc_wait = gc_wait
        self._codec = ChunkCodec(zstd_level)
        self._leases = Leases(backend, ttl=lease_ttl)
        self._verified = VerifiedChunks(verify_ttl)

    def write_checkpoint(
        self,
        *,
        job: str,
        checkpoint: str,
        parent: str | None,
        src_dir: Path,
        files: Sequence[str] | None = None,
        page_maps: Mapping[str, Sequence[tuple[int, int]]] | None = None,
        meta: Mapping[str, Any] | None = None,
        progress: Callable[[int, int], None] | None = None,
        verify_all: bool = False,
    ) -> WriteResult:
        """Store the files of ``src_dir`` as checkpoint ``checkpoint`` of ``job``.

        ``files`` (relative paths) defaults to every regular file under ``src_dir``, sorted.
        Files named in ``page_maps`` are CRIU pages images cut by virtual address (``page_spans``
        over their ``(vaddr, nr_pages)`` entries); others at fixed offsets. A chunk is uploaded
        unless the store holds it whole: written or verified for this job's newest checkpoint
        within ``verify_ttl`` seconds (not with ``verify_all``: for final checkpoints), or read
        back and verified now; a damaged copy is replaced (see ``ferry.store.verified``). The
        manifest is written last. ``progress(done, total)`` is called from worker threads, one call at a time.
        Raises UsageError for bad input, ConflictError if the checkpoint exists, StoreError.
        """
        return write_checkpoint(
            self.backend,
            self._codec,
            self._leases,
            workers=self.workers,
            gc_wait=self.gc_wait,
            job=job,
            checkpoint=checkpoint,
            parent=parent,
            src_dir=src_dir,
            files=files,
            page_maps=page_maps,
            meta=meta,
            verified=self._verified,
            verify_all=verify_all,
            progress=progress,
        )

    def read_manifest(self, job: str, checkpoint: str) -> Manifest:
        """The verified manifest; ObjectNotFound if there is none, ManifestCorrupt if it is bad."""
        manifest = decode_manifest(self.backend.get(manifest_key(job, checkpoint)), checkpoint)
        if manifest.job != job:
            raise ManifestCorrupt(checkpoint, f"it belongs to job {manifest.job}")
        return manifest

    def list_checkpoints(self, job: str) -> list[str]:
        """Ids of the checkpoints of ``job`` whose manifest exists, sorted by id."""
        prefix = f"manifests/{check_id(job, 'job id')}/"
        ids = (key[len(prefix) : -len(".json")] for key in self.backend.list(prefix) if key.endswith(".json"))
        return sorted(i for i in ids if "/" not in i)

    def restore_files(
        self, manifest: Manifest, dest_dir: Path, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Write the files of ``manifest`` under ``dest_dir`` and return the bytes written.

        Every chunk is verified (sha256 of its plain bytes); the first missing, undecodable or
        mismatching chunk raises ChunkCorrupt, after which ``dest_dir`` must be discarded.
        """
        return restore_files(self.backend, self._codec, manifest, dest_dir, workers=self.workers, progress=progress)

    def delete_checkpoint(self, job: str, checkpoint: str) -> None:
        """Delete the manifest (chunks go at the next gc); deleting a missing checkpoint is fine."""
        self.backend.delete(manifest_key(job, checkpoint))

    def verify(self, *, repair: bool = False, progress: Callable[[int, int], None] | None = None) -> StoreReport:
        """Which kept checkpoints would restore (every manifest and distinct chunk read and hashed);
        with ``repair``, damaged chunks are quarantined and gc runs (see ``ferry.store.verify``)."""
        report = verify_store(self.backend, self._codec, workers=self.workers, repair=repair, progress=progress)
        if repair:
            try:
                report.orphans_deleted = self.gc().chunks_deleted
            except StoreError as exc:  # an unreadable manifest stops gc: its chunks are unknown
                report.gc_error = str(exc)
        return report

    def gc(self, *, drain_timeout: float = 30.0) -> GcResult:
        """Delete chunks no manifest references (see ``ferry.store.gc`` for concurrent writers)."""
        return collect_garbage(self.backend, self._leases, workers=self.workers, drain_timeout=drain_timeout)

    def apply_retention(self, job: str, keep_last: int) -> list[str]:
        """Delete all but the ``keep_last`` newest checkpoints of ``job``; return the deleted ids.

        Unreadable manifests are left alone (gc reports them).
        """
        if keep_last < 0:
            raise UsageError(f"keep_last must be 0 or more, got {keep_last}")
        manifests = []
        for checkpoint in self.list_checkpoints(job):
            try:
                manifests.append(self.read_manifest(job, checkpoint))
            except ObjectNotFound:
                continue
            except ManifestCorrupt as exc:
                log.warning("retention skips %s: %s", checkpoint, exc)
        doomed = expired(manifests, keep_last)
        for checkpoint in doomed:
            self.delete_checkpoint(job, checkpoint)
        return doomed
