"""The store never trusts what it has not verified: a damaged or missing chunk is uploaded again by
the next checkpoint that holds the same bytes, and a restore that finds one sets it aside."""

import random
from pathlib import Path

import pytest

from ferry.store.errors import ChunkCorrupt
from ferry.store.local import LocalBackend
from ferry.store.manifest import chunk_key
from ferry.store.store import CheckpointStore

MiB = 1024 * 1024


def _files(src: Path, seed: int) -> None:
    rng = random.Random(seed)
    src.mkdir(parents=True, exist_ok=True)
    (src / "pages-1.img").write_bytes(rng.randbytes(2 * MiB))
    (src / "tiny.img").write_bytes(b"nineteen bytes here")


def _damage(backend: LocalBackend, digest: str) -> None:
    path = backend.root / chunk_key(digest)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _tiny(store: CheckpointStore, job: str, checkpoint: str) -> str:
    manifest = store.read_manifest(job, checkpoint)
    (entry,) = [f for f in manifest.files if f.path == "tiny.img"]
    return entry.chunks[0].hash


def test_a_damaged_chunk_is_replaced_by_the_next_job_that_holds_it(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    _files(tmp_path / "a", 1)
    CheckpointStore(backend).write_checkpoint(job="a", checkpoint="ck-1", parent=None, src_dir=tmp_path / "a")
    digest = _tiny(CheckpointStore(backend), "a", "ck-1")
    _damage(backend, digest)
    # a fresh job (a fresh checkpointer: nothing verified yet) with the same 19 bytes
    _files(tmp_path / "b", 2)
    fresh = CheckpointStore(backend)
    result = fresh.write_checkpoint(job="b", checkpoint="ck-2", parent=None, src_dir=tmp_path / "b")
    assert result.chunks_repaired == 1
    fresh.restore_files(result.manifest, tmp_path / "out-b")
    assert (tmp_path / "out-b" / "tiny.img").read_bytes() == b"nineteen bytes here"
    # the repair mended the first job's checkpoint too
    fresh.restore_files(fresh.read_manifest("a", "ck-1"), tmp_path / "out-a")


def test_a_chunk_deleted_from_the_store_is_uploaded_again(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    _files(tmp_path / "src", 3)
    first = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    victim = _tiny(store, "j", "ck-1")
    backend.delete(chunk_key(victim))
    # the same store object: it verified that chunk moments ago, and still looks
    second = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert second.chunks_new == 1 and second.bytes_new_plain == 19
    store.restore_files(second.manifest, tmp_path / "out")
    store.restore_files(first.manifest, tmp_path / "out-1")


def test_a_restore_that_finds_a_damaged_chunk_sets_it_aside(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, verify_ttl=3600)
    _files(tmp_path / "src", 4)
    first = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    victim = _tiny(store, "j", "ck-1")
    _damage(backend, victim)
    with pytest.raises(ChunkCorrupt, match="hash mismatch"):
        store.restore_files(first.manifest, tmp_path / "bad")
    assert not backend.exists(chunk_key(victim)) and backend.exists(f"quarantine/{victim}")
    # even a writer that trusts its recent verification sees the chunk gone and uploads it
    second = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert second.chunks_new == 1
    store.restore_files(first.manifest, tmp_path / "mended")
    assert store.gc().quarantined_deleted == 1
    assert not backend.exists(f"quarantine/{victim}")


def test_verification_reads_back_only_what_it_has_not_seen(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    _files(tmp_path / "src", 5)
    store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    reads: list[str] = []
    original_get = backend.get

    def recording_get(key: str) -> bytes:
        reads.append(key)
        return original_get(key)

    backend.get = recording_get  # type: ignore[method-assign]
    store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert [k for k in reads if k.startswith("chunks/")] == []  # verified when it uploaded them
    CheckpointStore(backend).write_checkpoint(job="j", checkpoint="ck-3", parent="ck-2", src_dir=tmp_path / "src")
    assert len([k for k in reads if k.startswith("chunks/")]) == len(store.read_manifest("j", "ck-1").chunk_hashes())


def test_the_same_checkpointer_reads_back_what_another_job_wrote(tmp_path: Path) -> None:
    """The case found end to end: one node's store object wrote the chunk for job a; it was then
    damaged; a fresh job b on the same node with the same bytes must not reuse it unread."""
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    _files(tmp_path / "a", 6)
    store.write_checkpoint(job="a", checkpoint="ck-1", parent=None, src_dir=tmp_path / "a")
    _damage(backend, _tiny(store, "a", "ck-1"))
    _files(tmp_path / "b", 7)
    result = store.write_checkpoint(job="b", checkpoint="ck-2", parent=None, src_dir=tmp_path / "b")
    assert result.chunks_repaired == 1
    store.restore_files(result.manifest, tmp_path / "out")


def test_a_final_checkpoint_reads_back_even_its_own_recent_chunks(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    _files(tmp_path / "src", 8)
    store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=tmp_path / "src")
    _damage(backend, _tiny(store, "j", "ck-1"))
    trusting = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=tmp_path / "src")
    assert trusting.chunks_repaired == 0  # within the TTL, a periodic checkpoint trusts its own
    final = store.write_checkpoint(job="j", checkpoint="ck-3", parent="ck-2", src_dir=tmp_path / "src",
                                   verify_all=True)
    assert final.chunks_repaired == 1
    store.restore_files(final.manifest, tmp_path / "out")
