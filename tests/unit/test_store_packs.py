"""Packs: where a chunk lies in one, which of a parent's chunks a new checkpoint may reuse, and
the manifest's form for packed and unpacked chunks, and a repair in place."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from ferry.store.errors import ChunkCorrupt
from ferry.store.local import LocalBackend
from ferry.store.manifest import ChunkRef, FileEntry, Manifest, decode_manifest, encode_manifest, pack_key
from ferry.store.packs import Packer, damage_key, live_bytes, parse_damage_key, patch_pack, reusable_refs
from ferry.store.reader import plan_reads
from ferry.store.store import CheckpointStore

P1, P2 = "1" * 32, "2" * 32


def _h(n: int) -> str:
    return f"{n:064x}"


def _manifest(*refs: ChunkRef) -> Manifest:
    entry = FileEntry(path="pages-1.img", size=sum(r.size for r in refs), mode=0o600, chunks=list(refs))
    return Manifest(job="j", checkpoint="ck-1", parent=None, created=1.0, files=[entry])


def test_a_chunk_of_its_own_is_written_as_before_packs_and_a_packed_one_says_where() -> None:
    loose, packed = ChunkRef(hash=_h(1), size=10), ChunkRef(hash=_h(2), size=10, pack=P1, at=7, stored=11)
    assert loose.model_dump() == {"hash": _h(1), "size": 10}
    assert packed.model_dump() == {"hash": _h(2), "size": 10, "pack": P1, "at": 7, "stored": 11}
    m = _manifest(loose, packed)
    assert decode_manifest(encode_manifest(m), "ck-1") == m
    assert json.loads(encode_manifest(m))["files"][0]["chunks"][0] == {"hash": _h(1), "size": 10}
    with pytest.raises(ValidationError, match="needs its stored size"):
        ChunkRef(hash=_h(3), size=10, pack=P1, at=0)
    with pytest.raises(ValidationError, match="no offset"):
        ChunkRef(hash=_h(3), size=10, at=5)
    with pytest.raises(ValidationError):
        ChunkRef(hash=_h(3), size=10, pack="../../etc", stored=3)


def test_a_parents_chunks_are_reused_only_from_packs_it_mostly_uses_and_never_where_damaged() -> None:
    dense = [ChunkRef(hash=_h(i), size=100, pack=P1, at=100 * i, stored=100) for i in range(3)]
    sparse = ChunkRef(hash=_h(9), size=100, pack=P2, at=0, stored=100)
    loose = ChunkRef(hash=_h(10), size=5)
    parent = _manifest(*dense, dense[0], sparse, loose)  # a chunk used twice counts once
    assert live_bytes(parent) == {P1: 300, P2: 100}
    sizes: dict[str, int | None] = {P1: 400, P2: 1000}
    got = reusable_refs(parent, sizes)
    assert set(got) == {_h(0), _h(1), _h(2), _h(10)}  # P2: a tenth used, so its chunk is packed again
    assert got[_h(1)] == dense[1]
    assert set(reusable_refs(parent, {P1: None, P2: 1000})) == {_h(10)}  # P1 is gone


def test_a_repair_writes_the_chunk_in_its_place_only_when_it_fits_there(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    backend.put(pack_key(P1), b"aaaaBBBBcccc")
    backend.put(damage_key(P1, 4), b"")
    ref = ChunkRef(hash=_h(1), size=4, pack=P1, at=4, stored=4)
    assert not patch_pack(backend, ref, b"toolong")  # another length: packed anew instead
    assert backend.get(pack_key(P1)) == b"aaaaBBBBcccc"
    assert patch_pack(backend, ref, b"bbbb")
    assert backend.get(pack_key(P1)) == b"aaaabbbbcccc" and not backend.exists(damage_key(P1, 4))
    assert not patch_pack(backend, ChunkRef(hash=_h(1), size=4, pack=P2, at=0, stored=4), b"bbbb")  # gone


def test_damage_keys_round_trip_and_nothing_else_parses() -> None:
    assert parse_damage_key(damage_key(P1, 4096)) == (P1, 4096)
    assert parse_damage_key(f"damaged/{P1}") is None
    assert parse_damage_key(f"quarantine/{_h(1)}") is None


def test_a_packer_gives_each_chunk_its_place_and_stores_every_pack_whole(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    packer = Packer(backend, pack_bytes=1000)
    places: list[tuple[bytes, tuple[str, int]]] = []
    lock = threading.Lock()

    def add(worker: int) -> None:
        for i in range(50):
            data = bytes([worker]) * (30 + i)
            where = packer.add(data)
            with lock:
                places.append((data, where))

    threads = [threading.Thread(target=add, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    packer.flush()
    for data, (pack, at) in places:
        assert backend.get_range(pack_key(pack), at, len(data)) == data
    stored = {key.split("/")[1]: len(backend.get(key)) for key in backend.list("packs/")}
    assert stored == packer.sizes
    assert sum(stored.values()) == sum(len(d) for d, _ in places)
    assert all(size < 1000 + 80 for size in stored.values())  # cut once past the size, by one chunk at most
    packer.flush()  # nothing left: no empty pack
    assert len(list(backend.list("packs/"))) == len(stored)


def test_neighbours_in_a_pack_are_read_together_and_the_rest_alone() -> None:
    a = [ChunkRef(hash=_h(i), size=100, pack=P1, at=100 * i, stored=100) for i in range(4)]
    far = ChunkRef(hash=_h(5), size=100, pack=P1, at=100_000, stored=100)  # beyond the gap
    other = ChunkRef(hash=_h(6), size=100, pack=P2, at=100, stored=100)  # another pack: another read
    loose = ChunkRef(hash=_h(7), size=5)
    skipped = [a[0], a[2], a[3]]  # a[1] not wanted: the read carries its 100 bytes
    runs = plan_reads([other, a[3], loose, far, *skipped[:2]], gap=1000, most=10_000)
    assert runs == [[a[0], a[2], a[3]], [far], [other], [loose]]
    assert plan_reads(a, gap=1000, most=250) == [[a[0], a[1]], [a[2], a[3]]]  # no read over `most` bytes
    assert plan_reads(skipped, gap=0, most=10_000) == [[a[0]], [a[2], a[3]]]  # no gap allowed
    assert plan_reads(a, most=0) == [[r] for r in a]  # a local file: a read per chunk


def test_a_restore_reads_a_packs_chunks_in_few_reads_and_still_finds_a_damaged_one(tmp_path: Path) -> None:
    class Counting(LocalBackend):  # as S3: neighbours read together (CoalescedReads)
        reads = 0
        coalesce_bytes = 8 * 1024 * 1024

        def get_range(self, key: str, offset: int, length: int) -> bytes:
            Counting.reads += 1
            return super().get_range(key, offset, length)

    backend = Counting(tmp_path / "store")
    store = CheckpointStore(backend)
    src = tmp_path / "src"
    src.mkdir()
    data = random.Random(5).randbytes(12 * 1024 * 1024)
    (src / "pages-1.img").write_bytes(data)
    written = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=src)
    chunks = [c for f in written.manifest.files for c in f.chunks]
    assert len(chunks) >= 12 and all(c.pack is not None for c in chunks)
    Counting.reads = 0
    store.restore_files(written.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "pages-1.img").read_bytes() == data
    assert Counting.reads <= 3, Counting.reads  # one per run of neighbours, not one per chunk
    # a chunk damaged in the middle of a run: reported by name, set aside, as when read alone
    victim = chunks[len(chunks) // 2]
    path = tmp_path / "store" / pack_key(victim.pack or "")
    raw = bytearray(path.read_bytes())
    raw[victim.at + victim.stored // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ChunkCorrupt) as found:
        store.restore_files(written.manifest, tmp_path / "again")
    assert found.value.chunk == victim.hash
    assert backend.exists(damage_key(victim.pack or "", victim.at))
