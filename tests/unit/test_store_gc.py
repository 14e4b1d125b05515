"""Garbage collection, retention, and the leases that keep gc away from unfinished checkpoints."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.store.errors import StoreError
from ferry.store.leases import GC_KEY, WRITERS_PREFIX, Lease
from ferry.store.local import LocalBackend
from ferry.store.manifest import chunk_key, manifest_key, pack_key
from ferry.store.retention import expired
from ferry.store.store import CheckpointStore
from ferry.store.writer import WriteResult

MiB = 1024 * 1024


def _write(store: CheckpointStore, root: Path, checkpoint: str, files: dict[str, bytes], job: str = "j") -> WriteResult:
    src = root / f"src-{job}-{checkpoint}"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    return store.write_checkpoint(job=job, checkpoint=checkpoint, parent=None, src_dir=src)


def test_gc_deletes_orphans_and_keeps_referenced_chunks(tmp_path: Path) -> None:
    """Chunks each on its own (a store without packs): shared between checkpoints by their hash."""
    rng = random.Random(1)
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, pack_bytes=0)
    shared, only1, only2 = rng.randbytes(2 * MiB), rng.randbytes(MiB), rng.randbytes(MiB)
    c1 = _write(store, tmp_path, "c1", {"a": shared, "b": only1})
    c2 = _write(store, tmp_path, "c2", {"a": shared, "b": only2})
    assert store.gc().chunks_deleted == 0

    store.delete_checkpoint("j", "c1")
    result = store.gc()
    doomed = c1.manifest.chunk_hashes() - c2.manifest.chunk_hashes()
    assert result.chunks_deleted == len(doomed) == 1
    assert result.bytes_freed == MiB + 1  # stored raw: header byte + data
    assert result.chunks_kept == len(c2.manifest.chunk_hashes())
    assert not result.deferred
    assert not any(backend.exists(chunk_key(h)) for h in doomed)
    assert all(backend.exists(chunk_key(h)) for h in c2.manifest.chunk_hashes())
    store.restore_files(c2.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "b").read_bytes() == only2
    assert store.gc().chunks_deleted == 0
    assert list(backend.list("locks/")) == []


def _child(store: CheckpointStore, root: Path, checkpoint: str, parent: str, files: dict[str, bytes]) -> WriteResult:
    src = root / f"src-{checkpoint}"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    return store.write_checkpoint(job="j", checkpoint=checkpoint, parent=parent, src_dir=src)


def test_gc_deletes_a_pack_once_no_kept_checkpoint_uses_any_chunk_in_it(tmp_path: Path) -> None:
    rng = random.Random(2)
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    a1, a3, b = rng.randbytes(2 * MiB), rng.randbytes(2 * MiB), rng.randbytes(MiB // 2)
    c1 = _write(store, tmp_path, "c1", {"a": a1, "b": b})
    (first,) = c1.manifest.packs()
    c2 = _child(store, tmp_path, "c2", "c1", {"a": a1, "b": rng.randbytes(MiB // 2)})
    assert c2.chunks_new == 1 and first in c2.manifest.packs()  # a's chunks reused where they lie
    store.delete_checkpoint("j", "c1")
    assert store.gc().packs_deleted == 0  # c2 still uses most of c1's pack
    c3 = _child(store, tmp_path, "c3", "c2", {"a": a3, "b": b})
    assert first not in c3.manifest.packs()
    store.delete_checkpoint("j", "c2")
    backend.put(f"damaged/{first}-0", b"")  # a marker goes with its pack
    result = store.gc()
    assert (result.packs_deleted, result.packs_kept) == (2, 1)
    assert result.bytes_freed == 3 * MiB + 4  # c1's a (two chunks) and b, c2's b; stored raw: a header byte each
    assert not backend.exists(pack_key(first)) and list(backend.list("damaged/")) == []
    store.restore_files(c3.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "a").read_bytes() == a3 and (tmp_path / "out" / "b").read_bytes() == b


def test_a_chunk_in_a_mostly_unused_pack_is_packed_again_so_old_packs_can_go(tmp_path: Path) -> None:
    rng = random.Random(3)
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    a2, b = rng.randbytes(2 * MiB), rng.randbytes(MiB // 2)
    c1 = _write(store, tmp_path, "c1", {"a": rng.randbytes(2 * MiB), "b": b})
    c2 = _child(store, tmp_path, "c2", "c1", {"a": a2, "b": b})
    assert c2.chunks_new == 2  # b reused: c1 used all of its pack
    # c2 uses a fifth of c1's pack (b): the next checkpoint packs b again instead of keeping that pack
    c3 = _child(store, tmp_path, "c3", "c2", {"a": a2, "b": b})
    assert c3.chunks_new == 1 and c3.bytes_new_plain == len(b)
    assert c3.manifest.packs().isdisjoint(c1.manifest.packs())
    store.delete_checkpoint("j", "c1")
    store.delete_checkpoint("j", "c2")
    assert store.gc().packs_deleted == 1
    store.restore_files(c3.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "a").read_bytes() == a2 and (tmp_path / "out" / "b").read_bytes() == b


class ChunkDuringListing(LocalBackend):
    """Simulates a writer that uploads a chunk while gc reads the manifests."""

    late = "f" * 64

    def list(self, prefix: str) -> Iterator[str]:
        if prefix == "manifests/":
            super().put(chunk_key(self.late), b"\x00late")
        yield from super().list(prefix)


def test_chunk_written_after_gc_listed_chunks_survives(tmp_path: Path) -> None:
    backend = ChunkDuringListing(tmp_path / "store")
    store = CheckpointStore(backend)
    backend.put(chunk_key("e" * 64), b"\x00old orphan")
    result = store.gc()
    assert result.chunks_deleted == 1
    assert not backend.exists(chunk_key("e" * 64))
    assert backend.exists(chunk_key(ChunkDuringListing.late))


def test_gc_defers_while_a_writer_is_active(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    backend.put(chunk_key("e" * 64), b"\x00orphan")
    with store._leases.writing(timeout=1):
        result = store.gc(drain_timeout=0.3)
    assert result.deferred and result.chunks_deleted == 0 and result.chunks_kept == 1
    assert backend.exists(chunk_key("e" * 64))
    assert list(backend.list("locks/")) == []

    # a writer that finishes in time is waited for
    lease = store._leases.writing(timeout=1)
    lease.__enter__()
    threading.Timer(0.3, lambda: lease.__exit__(None, None, None)).start()
    result = store.gc(drain_timeout=10)
    assert not result.deferred and result.chunks_deleted == 1


def test_gc_removes_what_a_killed_writer_left_once_no_one_can_still_be_writing_it(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, lease_ttl=5)
    kept = _write(store, tmp_path, "c1", {"a": random.Random(3).randbytes(MiB)})
    # a checkpointer killed mid-pack: its temporary file, sealed chunks in it, never committed
    killed = backend.writer(pack_key("d" * 32))
    killed.write(b"\x00" * MiB)
    old = next((tmp_path / "store" / "packs").glob(".tmp.*"))
    os.utime(old, (time.time() - 60, time.time() - 60))
    live = backend.writer(pack_key("e" * 32))  # a writer still at work: written to just now
    live.write(b"\x00" * 1024)
    young = next(p for p in (tmp_path / "store" / "packs").glob(".tmp.*") if p != old)
    with store._leases.writing(timeout=1):  # deferred: nothing of a writer's is touched
        assert store.gc(drain_timeout=0.2).unfinished_deleted == 0
    assert old.exists()
    result = store.gc()
    assert result.unfinished_deleted == 1 and result.packs_deleted == 0
    assert not old.exists() and young.exists()
    live.commit()
    assert backend.exists(pack_key("e" * 32))
    store.restore_files(kept.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "a").read_bytes() == random.Random(3).randbytes(MiB)


def test_stale_leases_are_ignored(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend, lease_ttl=5)
    backend.put(chunk_key("e" * 64), b"\x00orphan")
    old = Lease(owner="crashed:1", renewed=time.time() - 60).model_dump_json().encode()
    backend.put(f"{WRITERS_PREFIX}dead.json", old)
    assert store.gc(drain_timeout=0).chunks_deleted == 1
    backend.put(GC_KEY, old)
    _write(store, tmp_path, "c1", {"a": b"data"})  # does not wait for a dead gc


def test_writer_waits_for_a_running_gc(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "store"), gc_wait=10)
    done = threading.Event()
    with store._leases.collecting(drain_timeout=1) as drained:
        assert drained

        def write() -> None:
            _write(store, tmp_path, "c1", {"a": b"x"})
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        assert not done.wait(0.4)
    writer.join(10)
    assert done.is_set()
    assert store.list_checkpoints("j") == ["c1"]


def test_writer_gives_up_when_gc_holds_the_store_too_long(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "store"), gc_wait=0.3)
    with store._leases.collecting(drain_timeout=1), pytest.raises(StoreError, match="garbage collection"):
        _write(store, tmp_path, "c1", {"a": b"x"})


def test_gc_stops_on_an_unreadable_manifest(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    backend.put(chunk_key("e" * 64), b"\x00orphan")
    backend.put(manifest_key("j", "broken"), b"{")
    with pytest.raises(StoreError, match=r"gc stopped before deleting anything: manifests/j/broken\.json"):
        store.gc()
    assert backend.exists(chunk_key("e" * 64))
    assert list(backend.list("locks/")) == []


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    for n in range(5):
        _write(store, tmp_path, f"c{n}", {"a": bytes([n]) * 100})
    _write(store, tmp_path, "c0", {"a": b"other job"}, job="k")
    backend.put(manifest_key("j", "broken"), b"{")
    assert store.apply_retention("j", 2) == ["c0", "c1", "c2"]
    assert store.list_checkpoints("j") == ["broken", "c3", "c4"]
    assert store.list_checkpoints("k") == ["c0"]
    assert store.apply_retention("j", 2) == []
    with pytest.raises(UsageError):
        store.apply_retention("j", -1)
    backend.delete(manifest_key("j", "broken"))
    assert store.gc().packs_deleted == 3  # each checkpoint's one pack
    assert store.apply_retention("j", 0) == ["c3", "c4"]


def test_expired_orders_by_creation_time() -> None:
    from ferry.store.manifest import Manifest

    ms = [Manifest(job="j", checkpoint=c, parent=None, created=t, files=[]) for c, t in [("b", 2), ("a", 3), ("c", 1)]]
    assert expired(ms, 1) == ["c", "b"]
    assert expired(ms, 5) == []


def test_ended_jobs_expire_on_their_last_node_after_the_keep_time() -> None:
    from ferry.common.models import Job, JobState
    from ferry.store.retention import awaiting_expiry, awaiting_expiry_on, expiring

    def job(name: str, state: JobState, node: str, updated: float, checkpoint: str | None = "ck-1") -> Job:
        return Job(id=name, name=name, argv=["x"], state=state, node=node, updated=updated, last_checkpoint=checkpoint)

    jobs = [job("old", JobState.SUCCEEDED, "n1", 100.0), job("older", JobState.KILLED, "n1", 50.0),
            job("young", JobState.FAILED, "n1", 950.0), job("elsewhere", JobState.SUCCEEDED, "n2", 0.0),
            job("running", JobState.RUNNING, "n1", 0.0), job("parked", JobState.PREEMPTED, "n1", 0.0),
            job("none", JobState.SUCCEEDED, "n1", 0.0, checkpoint=None)]
    due, next_at = expiring(jobs, "n1", keep_ended_s=100.0, now=1000.0)
    assert [j.name for j in due] == ["older", "old"] and next_at == 1050.0
    assert expiring(jobs, "n1", keep_ended_s=0.0, now=1000.0) == ([], None)  # 0 keeps them all
    assert expiring(jobs[:2], "n1", keep_ended_s=100.0, now=1000.0)[1] is None
    # the index a node reads instead of every job: exactly the ones expiry may pick there
    indexed = [j for j in jobs if awaiting_expiry_on("n1") in awaiting_expiry(j)]
    assert {j.name for j in indexed} == {"old", "older", "young"}
    assert expiring(indexed, "n1", keep_ended_s=100.0, now=1000.0) == (due, next_at)


def test_deleting_a_job_deletes_every_checkpoint_of_it_readable_or_not(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path))
    for job, checkpoint in (("j1", "a"), ("j1", "b"), ("j2", "c")):
        store.backend.put(manifest_key(job, checkpoint), b"{not a manifest")
    assert store.delete_job("j1") == ["a", "b"]
    assert store.list_checkpoints("j1") == [] and store.list_checkpoints("j2") == ["c"]
    assert store.delete_job("j1") == []
