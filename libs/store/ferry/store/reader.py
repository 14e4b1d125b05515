"""Restoring the files of a checkpoint: fetch every chunk once, verify it, write it in place.

Each distinct chunk is fetched once and written to every place that uses it. From a backend whose
requests each cost a round trip (``CoalescedReads``: S3), neighbours in a pack are fetched
together, one ranged read per run of them (``plan_reads``). Nothing is reported good until every
chunk has verified: on any error the destination is left half written and the caller discards it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from ferry.store.backend import Backend, CoalescedReads
from ferry.store.chunkform import ChunkForm
from ferry.store.codec import UndecodableChunk
from ferry.store.errors import ChunkCorrupt, ManifestCorrupt, ObjectNotFound, RestoreRefused, StoreError
from ferry.store.manifest import ChunkRef, Manifest, chunk_key, pack_key
from ferry.store.packs import damage_key
from ferry.store.parallel import Progress, run_all

BATCH_BYTES = 8 * 1024 * 1024
READ_GAP = 64 * 1024  # bytes of chunks not wanted that one ranged read may carry to join two runs
log = logging.getLogger(__name__)


def _create(target: Path, size: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def fetch_chunk(backend: Backend, form: ChunkForm, ref: ChunkRef) -> tuple[memoryview | None, str | None, bytes]:
    """The chunk ``ref`` read back and verified: (its plain bytes, None, the stored bytes) when
    whole, else (None, why: "missing from the store", "undecodable: ..." or "hash mismatch", the
    stored bytes, empty when missing). The store's other errors (unreachable, say) are raised."""
    try:
        if ref.pack is None:
            stored = backend.get(chunk_key(ref.hash))
        else:
            stored = backend.get_range(pack_key(ref.pack), ref.at, ref.stored)
    except ObjectNotFound:
        return None, "missing from the store", b""
    if ref.pack is not None and len(stored) != ref.stored:
        return None, f"cut short: {len(stored)} of its {ref.stored} bytes are in its pack", stored
    plain, problem, _ = _verified(form, ref, stored)
    return plain, problem, stored


def _verified(form: ChunkForm, ref: ChunkRef, stored: bytes | memoryview
              ) -> tuple[memoryview | None, str | None, bytes]:
    try:
        plain = form.decode(ref.hash, stored, ref.size)
    except UndecodableChunk as exc:
        why = "hash mismatch" if str(exc) == "hash mismatch" else f"undecodable: {exc}"
        return None, why, bytes(stored)
    return plain, None, b""


def plan_reads(refs: Iterable[ChunkRef], *, gap: int = READ_GAP, most: int = BATCH_BYTES) -> list[list[ChunkRef]]:
    """The reads that fetch ``refs``: a pack's chunks in offset order, cut into runs one ranged
    read covers (the next starts at most ``gap`` bytes after the last ends, and a read is at most
    ``most`` bytes); a chunk stored on its own is a read by itself."""
    loose = [[ref] for ref in refs if ref.pack is None]
    packed = sorted((ref for ref in refs if ref.pack is not None), key=lambda r: (r.pack, r.at))
    runs: list[list[ChunkRef]] = []
    for ref in packed:
        run = runs[-1] if runs else None
        if run is not None:
            start, end = run[0].at, run[-1].at + run[-1].stored
            if ref.pack == run[0].pack and end <= ref.at <= end + gap and ref.at + ref.stored - start <= most:
                run.append(ref)
                continue
        runs.append([ref])
    return runs + loose


def fetch_run(backend: Backend, form: ChunkForm, run: list[ChunkRef]
              ) -> list[tuple[memoryview | None, str | None, bytes]]:
    """``fetch_chunk`` of every chunk of one of ``plan_reads``' runs, with one ranged read for all
    of them (a whole chunk's stored bytes come back empty: nothing needs them); a read that comes
    back short, or a chunk that fails to verify, is fetched again on its own, so that what is
    reported of it is what ``fetch_chunk`` says."""
    if len(run) == 1 or run[0].pack is None:
        return [fetch_chunk(backend, form, ref) for ref in run]
    start = run[0].at
    length = run[-1].at + run[-1].stored - start
    try:
        data = memoryview(backend.get_range(pack_key(run[0].pack), start, length))
    except ObjectNotFound:
        data = memoryview(b"")
    out = []
    for ref in run:
        piece = data[ref.at - start : ref.at - start + ref.stored]
        found = _verified(form, ref, piece) if len(piece) == ref.stored else (None, "short", b"")
        out.append(found if found[0] is not None else fetch_chunk(backend, form, ref))
    return out


def quarantine(backend: Backend, ref: ChunkRef, stored: bytes) -> None:
    """Sets a damaged chunk aside (a copy kept under ``quarantine/`` for a look) so that the next
    checkpoint that holds those bytes stores them again, which mends every checkpoint after it: a
    chunk of its own is moved there; a packed one gets a damage marker (``ferry.store.packs``)."""
    digest = ref.hash
    try:
        backend.put(f"quarantine/{digest}", stored)
        if ref.pack is None:
            backend.delete(chunk_key(digest))
        else:
            backend.put(damage_key(ref.pack, ref.at), b"")
    except StoreError as exc:
        log.warning("could not quarantine damaged chunk %s…: %s", digest[:12], exc)
    else:
        log.warning("damaged chunk %s… set aside under quarantine/", digest[:12])


class _Placer:
    """Fetches, verifies and writes a group of distinct chunks."""

    def __init__(
        self,
        backend: Backend,
        form: ChunkForm,
        manifest: Manifest,
        targets: list[Path],
        places: dict[str, list[tuple[int, int]]],
        refs: dict[str, ChunkRef],
        progress: Progress,
    ) -> None:
        self.backend, self.form, self.manifest = backend, form, manifest
        self.targets, self.places, self.refs, self.progress = targets, places, refs, progress

    def _corrupt(self, digest: str, reason: str) -> ChunkCorrupt:
        path = self.manifest.files[self.places[digest][0][0]].path
        return ChunkCorrupt(self.manifest.checkpoint, digest, path, reason)

    def _plain(self, ref: ChunkRef, found: tuple[memoryview | None, str | None, bytes]) -> memoryview:
        plain, problem, stored = found
        if plain is None:
            if stored:  # there, but damaged
                quarantine(self.backend, ref, stored)
            raise self._corrupt(ref.hash, problem or "unreadable")
        return plain

    def __call__(self, runs: list[list[ChunkRef]]) -> None:
        fds: dict[int, int] = {}
        try:
            for run in runs:
                for ref, found in zip(run, fetch_run(self.backend, self.form, run), strict=True):
                    plain = self._plain(ref, found)
                    for index, offset in self.places[ref.hash]:
                        if index not in fds:
                            fds[index] = os.open(self.targets[index], os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                        _write_at(fds[index], plain, offset)
                        self.progress.add(len(plain))
        except OSError as exc:
            raise StoreError(f"cannot write the restored files: {exc}") from exc
        finally:
            for fd in fds.values():
                os.close(fd)


def check_room(manifest: Manifest, dest: Path, *, max_bytes: int | None, reserve: int) -> None:
    """Refuses a restore that would write more than ``max_bytes`` (what the checkpoint was
    recorded to hold) or more than the free space under ``dest`` less ``reserve``."""
    declared = manifest.bytes_logical
    if max_bytes is not None and declared > max_bytes:
        raise RestoreRefused(f"checkpoint {manifest.checkpoint}: its manifest declares {declared} bytes, more than "
                             f"the {max_bytes} recorded for it; not restored")
    probe = dest
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError as exc:
        raise StoreError(f"cannot see the free space under {dest}: {exc}") from exc
    if declared > free - reserve:
        raise RestoreRefused(f"checkpoint {manifest.checkpoint}: restoring it needs {declared >> 20} MiB, "
                             f"{dest} has {max(0, free - reserve) >> 20} MiB free to use; free some space")


def restore_files(
    backend: Backend,
    form: ChunkForm,
    manifest: Manifest,
    dest_dir: Path,
    *,
    workers: int,
    progress: Callable[[int, int], None] | None,
    max_bytes: int | None = None,
    reserve: int = 0,
) -> int:
    """See CheckpointStore.restore_files."""
    check_room(manifest, Path(dest_dir), max_bytes=max_bytes, reserve=reserve)
    places: dict[str, list[tuple[int, int]]] = {}
    refs: dict[str, ChunkRef] = {}  # one stored copy per distinct chunk
    for index, entry in enumerate(manifest.files):
        offset = 0
        for ref in entry.chunks:
            if refs.setdefault(ref.hash, ref).size != ref.size:
                raise ManifestCorrupt(manifest.checkpoint, f"chunk {ref.hash[:12]}… appears with two sizes")
            places.setdefault(ref.hash, []).append((index, offset))
            offset += ref.size
    dest = Path(dest_dir)
    targets = [dest.joinpath(*entry.path.split("/")) for entry in manifest.files]
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for target, entry in zip(targets, manifest.files, strict=True):
            _create(target, entry.size)
    except OSError as exc:
        raise StoreError(f"cannot create the restored files in {dest}: {exc}") from exc
    placer = _Placer(backend, form, manifest, targets, places, refs, Progress(progress, manifest.bytes_logical))
    groups: list[list[list[ChunkRef]]] = [[]]  # reads, in groups of about BATCH_BYTES for the workers
    size = 0
    most = backend.coalesce_bytes if isinstance(backend, CoalescedReads) else 0
    for run in plan_reads(refs.values(), most=most):
        if size >= BATCH_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(run)
        size += sum(ref.size * len(places[ref.hash]) for ref in run)
    run_all([partial(placer, group) for group in groups if group], workers)
    try:
        for target, entry in zip(targets, manifest.files, strict=True):
            os.chmod(target, entry.mode)
    except OSError as exc:
        raise StoreError(f"cannot set the mode of the restored files: {exc}") from exc
    return manifest.bytes_logical
