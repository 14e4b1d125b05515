"""Packs: the stored forms of many chunks in one object, so that a gigabyte of checkpoint is a
few dozen objects instead of thousands (creating one file per 512 KiB window cost more than
writing its bytes: ``bench/storewrite.py``).

    packs/<name>             stored chunks one after another; ``name`` is 32 random hex digits.
                             Written whole, once, before the manifest that names it; changed only
                             by a repair, which writes a damaged chunk's own bytes again in place
    damaged/<name>-<at>      empty: the chunk at offset ``at`` of that pack was found damaged (by a
                             restore or ``ferry store verify``); the next checkpoint that holds its
                             bytes repairs it, and gc drops the marker with its pack

A manifest names, for each chunk, its pack, offset and stored size; a reader fetches it with a
ranged read. A writer reuses a chunk of the parent checkpoint where it lies (after reading it
back, unless it verified it recently: ``ferry.store.verified``), but only while the parent still
uses at least ``PACK_LIVE_MIN`` of that pack's bytes: otherwise the chunk is packed again, so the
packs a job's kept checkpoints hold stay within about twice what they use, and gc (which deletes
packs no manifest names) reclaims the old ones once retention drops their checkpoints. Chunks
are reused along a job's parent checkpoints only, not between jobs.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Mapping

from ferry.store.backend import Backend, ObjectWriter, object_writer
from ferry.store.errors import ObjectNotFound
from ferry.store.manifest import ChunkRef, Manifest, pack_key

PACK_BYTES = 16 << 20
PACK_LIVE_MIN = 0.5
DAMAGED = "damaged/"
_DAMAGE = re.compile(r"damaged/([0-9a-f]{32})-([0-9]+)")


def new_pack_name() -> str:
    return uuid.uuid4().hex


def damage_key(pack: str, at: int) -> str:
    return f"{DAMAGED}{pack}-{at}"


def parse_damage_key(key: str) -> tuple[str, int] | None:
    """(pack, offset) of a ``damaged/`` marker's key; None for any other key."""
    m = _DAMAGE.fullmatch(key)
    return (m.group(1), int(m.group(2))) if m else None


def live_bytes(manifest: Manifest) -> dict[str, int]:
    """Per pack, the stored bytes of the distinct chunks ``manifest`` uses there."""
    live: dict[str, int] = {}
    seen: set[tuple[str, str | None, int]] = set()
    for entry in manifest.files:
        for ref in entry.chunks:
            if ref.pack is not None and ref.where not in seen:
                seen.add(ref.where)
                live[ref.pack] = live.get(ref.pack, 0) + ref.stored
    return live


def reusable_refs(parent: Manifest, pack_sizes: Mapping[str, int | None]) -> dict[str, ChunkRef]:
    """The parent's chunks a new checkpoint may point at where they lie, by hash: those stored on
    their own, and those in a pack that exists (``pack_sizes``: None for a missing one) and that
    the parent uses at least ``PACK_LIVE_MIN`` of. (Whether each is whole is the writer's to check.)"""
    live = live_bytes(parent)
    dense = {p for p, used in live.items() if (size := pack_sizes.get(p)) and used >= PACK_LIVE_MIN * size}
    out: dict[str, ChunkRef] = {}
    for entry in parent.files:
        for ref in entry.chunks:
            if ref.pack is None or ref.pack in dense:
                out.setdefault(ref.hash, ref)
    return out


def patch_pack(backend: Backend, ref: ChunkRef, stored: bytes) -> bool:
    """Writes ``stored``, a fresh stored form of the damaged chunk ``ref``, over its place in its
    pack (the whole pack stored again, atomically), and drops the place's damage marker: every
    checkpoint that uses that place is whole again. False, changing nothing, when the pack is gone
    or the new form is not the same length (then the caller packs the chunk anew)."""
    if ref.pack is None or len(stored) != ref.stored:
        return False
    try:
        data = bytearray(backend.get(pack_key(ref.pack)))
    except ObjectNotFound:
        return False
    if ref.at + ref.stored > len(data):
        return False
    data[ref.at : ref.at + ref.stored] = stored
    backend.put(pack_key(ref.pack), bytes(data))
    backend.delete(damage_key(ref.pack, ref.at))
    return True


class Packer:
    """Appends stored chunks to packs of about ``pack_bytes`` each, written as they come
    (``backend.object_writer``: a local pack goes straight to its file), and stores a pack once it
    is full; ``flush`` stores the last one, ``abort`` drops what is not stored. Thread-safe. A
    chunk's place is given at once, its pack stored later: no manifest goes before ``flush``."""

    def __init__(self, backend: Backend, pack_bytes: int = PACK_BYTES) -> None:
        self._backend, self._pack_bytes = backend, pack_bytes
        self._lock = threading.Lock()
        self._open: _OpenPack | None = None
        self._closing: list[_OpenPack] = []  # full, being stored by another thread
        self.sizes: dict[str, int] = {}  # the packs stored so far

    def add(self, stored: bytes) -> tuple[str, int]:
        """Where ``stored`` goes: (pack name, offset)."""
        with self._lock:
            if self._open is None:
                name = new_pack_name()
                self._open = _OpenPack(name, object_writer(self._backend, pack_key(name)))
            pack = self._open
            at = pack.size
            pack.writer.write(stored)
            pack.size += len(stored)
            full = pack.size >= self._pack_bytes
            if full:
                self._open = None
                self._closing.append(pack)
        if full:
            self._store(pack)
        return pack.name, at

    def flush(self) -> None:
        with self._lock:
            pack, self._open = self._open, None
            if pack is not None:
                self._closing.append(pack)
        if pack is not None:
            self._store(pack)

    def abort(self) -> None:
        with self._lock:
            doomed = [p for p in [self._open, *self._closing] if p is not None]
            self._open, self._closing = None, []
        for pack in doomed:
            pack.writer.abort()

    def _store(self, pack: _OpenPack) -> None:
        pack.writer.commit()
        with self._lock:
            if pack in self._closing:
                self._closing.remove(pack)
            self.sizes[pack.name] = pack.size


class _OpenPack:
    def __init__(self, name: str, writer: ObjectWriter) -> None:
        self.name, self.writer, self.size = name, writer, 0
