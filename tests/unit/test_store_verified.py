"""The store never trusts what it has not verified: a damaged or missing chunk is uploaded again by
the next checkpoint that holds the same bytes, and a restore that finds one sets it aside. Both
layouts: chunks in packs (the default) and each on its own (``pack_bytes=0``, stores before packs)."""

import random
from pathlib import Path

import pytest

from ferry.store.errors import ChunkCorrupt
from ferry.store.local import LocalBackend
from ferry.store.manifest import ChunkRef, chunk_key, pack_key
from ferry.store.packs import damage_key
from ferry.store.store import CheckpointStore

MiB = 1024 * 1024
LAYOUTS = pytest.mark.parametrize("pack_bytes", [16 * MiB, 0], ids=["packed", "loose"])


def _files(src: Path, seed: int) -> None:
    rng = random.Random(seed)
    src.mkdir(parents=True, exist_ok=True)
    (src / "pages-1.img").write_bytes(rng.randbytes(2 * MiB))
    (src / "tiny.img").write_bytes(b"nineteen bytes here")


def _damage(backend: LocalBackend, ref: ChunkRef) -> None:
    """Flips the last stored byte of ``ref``, in its own object or in its pack."""
    path = backend.root / (chunk_key(ref.hash) if ref.pack is None else pack_key(ref.pack))
    data = bytearray(path.read_bytes())
    data[-1 if ref.pack is None else ref.at + ref.stored - 1] ^= 0xFF
    path.write_bytes(bytes(data))


def _tiny(store: CheckpointStore, job: str, checkpoint: str) -> ChunkRef:
    manifest = store.read_manifest(job, checkpoint)
    (entry,) = [f for f in manifest.files if f.path == "tiny.img"]
    return entry.chunks[0]


def test_a_damaged_chunk_is_replaced_by_the_next_job_that_holds_it(tmp_path: Path) -> None:
    """Without packs, chunks are shared between jobs, so one job's upload mends another's."""
    backend = LocalBackend(tmp_path / "store")
    _files(tmp_path / "a", 1)
    CheckpointStore(backend, pack_bytes=0).write_checkpoint(job="a", checkpoint="ck-1", parent=None,
                                                            src_dir=tmp_path / "a")
    _damage(backend, _tiny(CheckpointStore(backend), "a", "ck-1"))
    # a fresh job (a fresh checkpointer: nothing verified yet) with the same 19 bytes
    _files(tmp_path / "b", 2)
    fresh = CheckpointStore(backend, pack_bytes=0)
    result = fresh.write_checkpoint(job="b", checkpoint="ck-2", parent=None, src_dir=tmp_path / "b")
    assert result.chunks_repaired == 1
    fresh.restore_files(result.manifest, tmp_path / "out-b")
    assert (tmp_path / "out-b" / "tiny.img").read_bytes() == b"nineteen bytes here"
    # the repair mended the first job's checkpoint too
    fresh.restore_files(fresh.read_manifest("a", "ck-1"), tmp_path / "out-a")


def test_a_damaged_packed_chunk_is_written_again_in_place_by_the_next_checkpoint_that_reads_it(
        tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    _files(tmp_path / "src", 1)
    CheckpointStore(backend).write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    victim = _tiny(CheckpointStore(backend), "j", "ck-1")
    _damage(backend, victim)
    fresh = CheckpointStore(backend)  # a fresh checkpointer: nothing verified yet, so it reads back
    result = fresh.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert result.chunks_repaired == 1 and result.chunks_new == 1 and result.bytes_new_plain == 19
    assert _tiny(fresh, "j", "ck-2") == victim  # where it was: the pack was mended
    fresh.restore_files(result.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "tiny.img").read_bytes() == b"nineteen bytes here"
    fresh.restore_files(fresh.read_manifest("j", "ck-1"), tmp_path / "out-1")  # the first one is whole again


@LAYOUTS
def test_a_chunk_deleted_from_the_store_is_uploaded_again(tmp_path: Path, pack_bytes: int) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, pack_bytes=pack_bytes)
    _files(tmp_path / "src", 3)
    first = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    victim = _tiny(store, "j", "ck-1")
    backend.delete(chunk_key(victim.hash) if victim.pack is None else pack_key(victim.pack))
    # the same store object: it verified that chunk moments ago, and still looks
    second = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    if pack_bytes:  # the whole pack is gone: every chunk in it is packed again
        assert second.chunks_new == len(first.manifest.chunk_hashes())
    else:
        assert second.chunks_new == 1 and second.bytes_new_plain == 19
        store.restore_files(first.manifest, tmp_path / "out-1")  # mended: the chunk is back
    store.restore_files(second.manifest, tmp_path / "out")


@LAYOUTS
def test_a_restore_that_finds_a_damaged_chunk_sets_it_aside(tmp_path: Path, pack_bytes: int) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, verify_ttl=3600, pack_bytes=pack_bytes)
    _files(tmp_path / "src", 4)
    first = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    victim = _tiny(store, "j", "ck-1")
    _damage(backend, victim)
    with pytest.raises(ChunkCorrupt, match="hash mismatch"):
        store.restore_files(first.manifest, tmp_path / "bad")
    assert backend.exists(f"quarantine/{victim.hash}")
    marker = damage_key(victim.pack or "", victim.at)
    if pack_bytes:
        assert backend.exists(marker)
    else:
        assert not backend.exists(chunk_key(victim.hash))
    # even a writer that trusts its recent verification sees the chunk set aside and uploads it
    second = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert second.chunks_new == 1 and second.chunks_repaired == (pack_bytes > 0)
    assert not backend.exists(marker)
    store.restore_files(second.manifest, tmp_path / "mended")
    store.restore_files(first.manifest, tmp_path / "mended-1")  # the old checkpoint is whole again
    assert store.gc().quarantined_deleted == 1
    assert not backend.exists(f"quarantine/{victim.hash}")


@LAYOUTS
def test_verification_reads_back_only_what_it_has_not_seen(tmp_path: Path, pack_bytes: int) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, pack_bytes=pack_bytes)
    _files(tmp_path / "src", 5)
    store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    reads: list[str] = []
    original_get, original_range = backend.get, backend.get_range

    def recording_get(key: str) -> bytes:
        reads.append(key)
        return original_get(key)

    def recording_range(key: str, offset: int, length: int) -> bytes:
        reads.append(key)
        return original_range(key, offset, length)

    backend.get = recording_get  # type: ignore[method-assign]
    backend.get_range = recording_range  # type: ignore[method-assign]

    def chunk_reads() -> list[str]:
        return [k for k in reads if k.startswith(("chunks/", "packs/"))]

    store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert chunk_reads() == []  # verified when it uploaded them
    CheckpointStore(backend, pack_bytes=pack_bytes).write_checkpoint(job="j", checkpoint="ck-3", parent="ck-2",
                                                                     src_dir=tmp_path / "src")
    assert len(chunk_reads()) == len(store.read_manifest("j", "ck-1").chunk_hashes())


def test_the_same_checkpointer_reads_back_what_another_job_wrote(tmp_path: Path) -> None:
    """The case found end to end: one node's store object wrote the chunk for job a; it was then
    damaged; a fresh job b on the same node with the same bytes must not reuse it unread (without
    packs: with them, a job reuses only its own parent's chunks)."""
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, pack_bytes=0)
    _files(tmp_path / "a", 6)
    store.write_checkpoint(job="a", checkpoint="ck-1", parent=None, src_dir=tmp_path / "a")
    _damage(backend, _tiny(store, "a", "ck-1"))
    _files(tmp_path / "b", 7)
    result = store.write_checkpoint(job="b", checkpoint="ck-2", parent=None, src_dir=tmp_path / "b")
    assert result.chunks_repaired == 1
    store.restore_files(result.manifest, tmp_path / "out")


@LAYOUTS
def test_a_final_checkpoint_reads_back_even_its_own_recent_chunks(tmp_path: Path, pack_bytes: int) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, pack_bytes=pack_bytes)
    _files(tmp_path / "src", 8)
    store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    _damage(backend, _tiny(store, "j", "ck-1"))
    trusting = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert trusting.chunks_repaired == 0  # within the TTL, a periodic checkpoint trusts its own
    final = store.write_checkpoint(job="j", checkpoint="ck-3", parent="ck-2", src_dir=tmp_path / "src",
                                   verify_all=True)
    assert final.chunks_repaired == 1
    store.restore_files(final.manifest, tmp_path / "out")
