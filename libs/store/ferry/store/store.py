"""The checkpoint store: content-addressed chunks plus one manifest per checkpoint.

    packs/<name>                            many chunks' stored forms, each one: with keys, header
                                            byte 2 + AES-256-GCM of (header 0 raw | 1 zstd + payload)
                                            under the tenant's HMAC-SHA256 name of its plain bytes;
                                            without keys, header 0 or 1 + payload, named by sha256
                                            (``ferry.store.packs``; ``pack_bytes=0``: each chunk on
                                            its own as chunks/<name>, as stores before packs hold)
    damaged/<pack>-<offset>                 a packed chunk found damaged: never reused
    manifests/<job>/<checkpoint>.json       canonical JSON with a digest and, with keys, the
                                            tenant's signature; written last
    locks/...                               leases between writers and gc (see ``leases``)

A checkpoint exists once its manifest does, so a half-written checkpoint is invisible; a chunk
that fails its hash or seal on restore raises ChunkCorrupt; a manifest that is unsigned, signed
for another tenant or altered raises ManifestRefused (see ``ferry.store.keys``).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ferry.common.errors import UsageError
from ferry.store.backend import Backend
from ferry.store.chunkform import ChunkForm
from ferry.store.chunking import PAGE_CHUNK, PAGE_SIZE
from ferry.store.codec import ZSTD_LEVEL, ChunkCodec
from ferry.store.errors import ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.gc import GcResult, collect_garbage
from ferry.store.keys import KeyRing
from ferry.store.leases import DEFAULT_TTL, Leases
from ferry.store.manifest import DEFAULT_TENANT, ChunkRef, Manifest, check_id, decode_manifest, manifest_key, pack_key
from ferry.store.packs import DAMAGED, PACK_BYTES, parse_damage_key, reusable_refs
from ferry.store.parallel import run_all
from ferry.store.reader import restore_files
from ferry.store.retention import expired
from ferry.store.verified import DEFAULT_TTL as VERIFY_TTL
from ferry.store.verified import VerifiedChunks
from ferry.store.verify import StoreReport, verify_store
from ferry.store.writer import WriteResult, write_checkpoint

OUTPUT = "output"  # the reserved checkpoint id under which an ended job's output is kept

log = logging.getLogger(__name__)


class CheckpointStore:
    """Writes, reads, restores and reclaims checkpoints on one backend; safe to share between threads.

    ``workers`` threads hash, compress and move chunks; ``zstd_level`` sets compression. Writers
    wait at most ``gc_wait`` seconds for a running gc; ``lease_ttl`` is when a lease left by a
    crashed writer or gc stops counting; a job's chunks verified whole are trusted by its next
    checkpoint for ``verify_ttl`` seconds; CRIU pages images are cut in ``page_chunk``-byte windows of
    their virtual addresses (``ferry.store.chunking``); new chunks go into packs of about ``pack_bytes``
    (``ferry.store.packs``; 0: each on its own, as before packs). With ``keyring`` (what Ferry's services always pass),
    chunks are sealed per tenant and manifests signed; without, they are plain (tools and tests).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        workers: int = 2,
        zstd_level: int = ZSTD_LEVEL,
        gc_wait: float = 300.0,
        lease_ttl: float = DEFAULT_TTL,
        verify_ttl: float = VERIFY_TTL,
        keyring: KeyRing | None = None,
        page_chunk: int = PAGE_CHUNK,
        pack_bytes: int = PACK_BYTES,
    ) -> None:
        if workers < 1:
            raise UsageError(f"workers must be at least 1, got {workers}")
        if page_chunk < PAGE_SIZE or page_chunk % PAGE_SIZE:
            raise UsageError(f"page_chunk must be a multiple of {PAGE_SIZE} bytes, got {page_chunk}")
        if pack_bytes < 0:
            raise UsageError(f"pack_bytes must be 0 (each chunk on its own) or more, got {pack_bytes}")
        self.page_chunk = page_chunk
        self.pack_bytes = pack_bytes
        self.backend = backend
        self.workers = workers
        self.gc_wait = gc_wait
        self._codec = ChunkCodec(zstd_level)
        self.keyring = keyring
        self._leases = Leases(backend, ttl=lease_ttl)
        self._verified = VerifiedChunks(verify_ttl)

    @property
    def sealed(self) -> bool:
        return self.keyring is not None

    def form(self, tenant: str, key_id: str | None = None) -> ChunkForm:
        """How ``tenant``'s chunks are named and stored (under ``key_id``, else the current key)."""
        return ChunkForm(self._codec, self.keyring.tenant(tenant, key_id) if self.keyring else None)

    def _manifest_form(self, manifest: Manifest) -> ChunkForm:
        return self.form(manifest.tenant, manifest.key_id or None)

    def write_checkpoint(
        self,
        *,
        job: str,
        tenant: str = DEFAULT_TENANT,
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
            self.form(tenant),
            self._leases,
            workers=self.workers,
            gc_wait=self.gc_wait,
            page_chunk=self.page_chunk,
            job=job,
            tenant=tenant,
            checkpoint=checkpoint,
            parent=parent,
            src_dir=src_dir,
            files=files,
            page_maps=page_maps,
            meta=meta,
            verified=self._verified,
            verify_all=verify_all,
            progress=progress,
            pack_bytes=self.pack_bytes,
            reusable=partial(self._reusable, job, tenant, parent),
        )

    def _reusable(self, job: str, tenant: str, parent: str | None
                  ) -> tuple[dict[str, ChunkRef], set[tuple[str, int]]]:
        """The chunks of ``parent`` a new checkpoint of ``job`` may point at (``packs.reusable_refs``),
        none when there is no readable parent (then every chunk is packed anew); and the places
        marked damaged."""
        if parent is None:
            return {}, set()
        try:
            manifest = self.read_manifest(job, parent, tenant)
        except (ObjectNotFound, ManifestCorrupt) as exc:  # refused too: a subclass
            log.warning("checkpoint of %s: its parent %s is unreadable (%s); every chunk is stored anew", job,
                        parent, exc)
            return {}, set()
        packs = sorted(manifest.packs())  # each asked for: one deleted behind the store's back is not reused
        stat = [partial(self.backend.stored_size, pack_key(p)) for p in packs]
        sizes = dict(zip(packs, run_all(stat, self.workers), strict=True))
        damaged = {found for key in self.backend.list(DAMAGED) if (found := parse_damage_key(key))}
        return reusable_refs(manifest, sizes), damaged

    def read_manifest(self, job: str, checkpoint: str, tenant: str | None = None) -> Manifest:
        """The verified manifest; ObjectNotFound if there is none, ManifestCorrupt if it is bad,
        ManifestRefused if it is unsigned, altered or (given ``tenant``) another tenant's."""
        manifest = decode_manifest(self.backend.get(manifest_key(job, checkpoint)), checkpoint, self.keyring, tenant)
        if manifest.job != job:
            raise ManifestCorrupt(checkpoint, f"it belongs to job {manifest.job}")
        return manifest

    def list_checkpoints(self, job: str) -> list[str]:
        """Ids of the checkpoints of ``job`` whose manifest exists, sorted by id (not its output's)."""
        prefix = f"manifests/{check_id(job, 'job id')}/"
        ids = (key[len(prefix) : -len(".json")] for key in self.backend.list(prefix) if key.endswith(".json"))
        return sorted(i for i in ids if "/" not in i and i != OUTPUT)

    def write_output(self, *, job: str, tenant: str = DEFAULT_TENANT, src_dir: Path,
                     files: Sequence[str] = ("stdout", "stderr")) -> None:
        """Keeps an ended job's output (its stdout and stderr files in ``src_dir``) in the store,
        sealed like its checkpoints, under the reserved id ``OUTPUT``: readable after its node is
        gone (``read_output``). A newer one replaces it (a job restored after it ended). Output
        that is all empty is not written: it reads as none kept (an older one is removed)."""
        present = [f for f in files if (src_dir / f).is_file()]
        self.backend.delete(manifest_key(job, OUTPUT))
        if all((src_dir / f).stat().st_size == 0 for f in present):
            return
        self.write_checkpoint(job=job, tenant=tenant, checkpoint=OUTPUT, parent=None, src_dir=src_dir,
                              files=present, meta={"kind": "output"})

    def read_output(self, job: str, stream: str, offset: int, size: int, tenant: str | None = None) -> bytes:
        """Up to ``size`` bytes of an ended job's kept output from ``offset``; ObjectNotFound if none
        was kept."""
        manifest = self.read_manifest(job, OUTPUT, tenant)
        wanted = [f for f in manifest.files if f.path == stream]
        if not wanted:
            return b""
        with tempfile.TemporaryDirectory(prefix="ferry-output-") as tmp:  # that stream only
            self.restore_files(manifest.model_copy(update={"files": wanted}), Path(tmp))
            with open(Path(tmp) / stream, "rb") as f:
                f.seek(offset)
                return f.read(size)

    def restore_files(
        self, manifest: Manifest, dest_dir: Path, progress: Callable[[int, int], None] | None = None, *,
        max_bytes: int | None = None, reserve: int = 0,
    ) -> int:
        """Write the files of ``manifest`` under ``dest_dir`` and return the bytes written.

        Refused (RestoreRefused) before anything is written when the manifest declares more than
        ``max_bytes`` or than the free space under ``dest_dir`` less ``reserve``. Every chunk is
        verified (its seal, or sha256 of its plain bytes); the first missing, undecodable or
        mismatching chunk raises ChunkCorrupt, after which ``dest_dir`` must be discarded.
        """
        return restore_files(self.backend, self._manifest_form(manifest), manifest, dest_dir, workers=self.workers,
                             progress=progress, max_bytes=max_bytes, reserve=reserve)

    def delete_checkpoint(self, job: str, checkpoint: str) -> None:
        """Delete the manifest (chunks go at the next gc); deleting a missing checkpoint is fine."""
        self.backend.delete(manifest_key(job, checkpoint))

    def delete_job(self, job: str) -> list[str]:
        """Delete every checkpoint of ``job``, readable or not (its chunks go at the next gc); return their ids."""
        doomed = self.list_checkpoints(job)
        for checkpoint in doomed:
            self.delete_checkpoint(job, checkpoint)
        self.backend.delete(manifest_key(job, OUTPUT))  # its kept output goes with them
        return doomed

    def verify(self, *, repair: bool = False, progress: Callable[[int, int], None] | None = None) -> StoreReport:
        """Which kept checkpoints would restore (every manifest and distinct chunk read and hashed);
        with ``repair``, damaged chunks are quarantined and gc runs (see ``ferry.store.verify``)."""
        report = verify_store(self.backend, self._manifest_form, workers=self.workers, repair=repair,
                              keyring=self.keyring, progress=progress)
        if repair:
            try:
                report.orphans_deleted = self.gc().objects_deleted
            except StoreError as exc:  # an unreadable manifest stops gc: its chunks are unknown
                report.gc_error = str(exc)
        return report

    def gc(self, *, drain_timeout: float = 30.0) -> GcResult:
        """Delete the chunks and packs no manifest references (see ``ferry.store.gc`` for concurrent writers)."""
        return collect_garbage(self.backend, self._leases, workers=self.workers, drain_timeout=drain_timeout,
                               keyring=self.keyring)

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
