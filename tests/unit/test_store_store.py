"""CheckpointStore over a local directory: roundtrip, incremental upload, corruption, ordering."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from ferry.common.errors import ConflictError, UsageError
from ferry.store.chunking import PAGE_SIZE
from ferry.store.errors import ChunkCorrupt, ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.local import LocalBackend
from ferry.store.manifest import ChunkRef, chunk_key, manifest_key, pack_key
from ferry.store.store import CheckpointStore

MiB = 1024 * 1024


class Recording(LocalBackend):
    """A LocalBackend that records puts and can fail the n-th chunk or pack upload."""

    def __init__(self, root: Path, fail_chunk_put: int | None = None) -> None:
        super().__init__(root)
        self.puts: list[str] = []
        self.fail_chunk_put = fail_chunk_put

    def writer(self, key: str) -> Any:  # every object, a put's too, is stored at its writer's commit
        inner = super().writer(key)
        outer = self

        class Recorded:
            write, abort = inner.write, inner.abort

            def commit(self) -> None:
                outer._stored(key)
                inner.commit()

        return Recorded()

    def _stored(self, key: str) -> None:
        if key.startswith(("chunks/", "packs/")) and self.fail_chunk_put is not None:
            self.fail_chunk_put -= 1
            if self.fail_chunk_put < 0:
                raise StoreError("injected failure")
        self.puts.append(key)


def _pages(rng: random.Random, mappings: list[tuple[int, int]]) -> tuple[bytes, list[tuple[int, int]]]:
    return rng.randbytes(sum(n for _, n in mappings) * PAGE_SIZE), mappings


def _make_source(root: Path, rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "core-1.img").write_bytes(b"core" * 100)
    (root / "empty.img").write_bytes(b"")
    (root / "sub").mkdir()
    (root / "sub" / "stdout.log").write_bytes(b"hello\n" * 1000)
    (root / "big.bin").write_bytes(rng.randbytes(3 * MiB + 123))
    pages, entries = _pages(rng, [(0x400000, 100), (0x7F0000000000, 200), (0x7F0000100000, 3)])
    (root / "pages-1.img").write_bytes(pages)
    os.chmod(root / "core-1.img", 0o640)
    os.chmod(root / "big.bin", 0o755)
    os.symlink("core-1.img", root / "link")  # not a regular file: skipped
    return {"pages-1.img": entries}


def _same_tree(a: Path, b: Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and not p.is_symlink())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
        assert (a / rel).stat().st_mode & 0o777 == (b / rel).stat().st_mode & 0o777, rel


def test_roundtrip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    page_maps = _make_source(src, random.Random(1))
    store = CheckpointStore(LocalBackend(tmp_path / "store"))
    calls: list[tuple[int, int]] = []
    result = store.write_checkpoint(
        job="job-1",
        checkpoint="ck-1",
        parent=None,
        src_dir=src,
        page_maps=page_maps,
        meta={"criu": "4.1.1"},
        progress=lambda done, total: calls.append((done, total)),
    )
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    assert result.bytes_logical == total == result.manifest.bytes_logical
    assert [f.path for f in result.manifest.files] == [
        "big.bin",
        "core-1.img",
        "empty.img",
        "pages-1.img",
        "sub/stdout.log",
    ]
    assert result.chunks_new == len(result.manifest.chunk_hashes()) <= result.chunks_total
    assert result.bytes_new_plain == total
    assert result.bytes_uploaded < total  # the logs and core compress
    assert result.seconds > 0
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    pages = next(f for f in result.manifest.files if f.path == "pages-1.img")
    assert [c.size // PAGE_SIZE for c in pages.chunks] == [100, 128, 72, 3]  # cut by address (512 KiB windows)

    assert store.list_checkpoints("job-1") == ["ck-1"]
    manifest = store.read_manifest("job-1", "ck-1")
    assert manifest == result.manifest and manifest.meta == {"criu": "4.1.1"}
    restored: list[tuple[int, int]] = []
    assert store.restore_files(manifest, tmp_path / "out", progress=lambda d, t: restored.append((d, t))) == total
    assert restored[-1] == (total, total)
    _same_tree(src, tmp_path / "out")


def test_explicit_file_list_and_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_source(src, random.Random(2))
    store = CheckpointStore(LocalBackend(tmp_path / "store"), workers=1)
    result = store.write_checkpoint(
        job="j", checkpoint="c", parent=None, src_dir=src, files=["sub/stdout.log", "core-1.img"]
    )
    assert [f.path for f in result.manifest.files] == ["sub/stdout.log", "core-1.img"]
    bad: list[dict[str, Any]] = [
        {"files": ["../etc/passwd"]},
        {"files": ["missing"]},
        {"files": ["link"]},
        {"files": ["core-1.img", "core-1.img"]},
        {"meta": {"x": object()}},
        {"src_dir": tmp_path / "nowhere"},
    ]
    for n, kwargs in enumerate(bad):
        args = {"job": "j", "checkpoint": f"bad-{n}", "parent": None, "src_dir": src, **kwargs}
        with pytest.raises(UsageError):
            store.write_checkpoint(**args)
    with pytest.raises(UsageError):
        store.write_checkpoint(job="j/../x", checkpoint="c2", parent=None, src_dir=src)
    with pytest.raises(ConflictError, match="already exists"):
        store.write_checkpoint(job="j", checkpoint="c", parent=None, src_dir=src)
    with pytest.raises(UsageError):
        CheckpointStore(LocalBackend(tmp_path), workers=0)


def test_page_maps_that_do_not_fit_fall_back_to_fixed_spans(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = random.Random(6).randbytes(3 * MiB)
    (src / "pages-1.img").write_bytes(data)
    store = CheckpointStore(LocalBackend(tmp_path / "store"))
    maps = {"pages-1.img": [(0, 1)], "pages-9.img": [(0, 1)]}  # too short; names no written file
    result = store.write_checkpoint(job="j", checkpoint="c", parent=None, src_dir=src, page_maps=maps)
    assert [c.size for c in result.manifest.files[0].chunks] == [MiB, MiB, MiB]
    store.restore_files(result.manifest, tmp_path / "out")
    assert (tmp_path / "out" / "pages-1.img").read_bytes() == data


def test_second_checkpoint_uploads_only_what_changed(tmp_path: Path) -> None:
    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    entries = [(0x7F0000000000 + i * 0x2000000, 512) for i in range(4)]  # 4 x 2 MiB = 8 MiB
    pages = bytearray(rng.randbytes(8 * MiB))
    (src / "pages-1.img").write_bytes(pages)
    (src / "heap.bin").write_bytes(rng.randbytes(4 * MiB))
    store = CheckpointStore(LocalBackend(tmp_path / "store"))
    store.write_checkpoint(
        job="j", checkpoint="c1", parent=None, src_dir=src, page_maps={"pages-1.img": entries}
    )

    # about 5%: 400 KiB of pages rewritten in place, 200 KiB of the heap file
    pages[3 * MiB : 3 * MiB + 400 * 1024] = rng.randbytes(400 * 1024)
    (src / "pages-1.img").write_bytes(pages)
    with open(src / "heap.bin", "r+b") as f:
        f.seek(MiB + 4096)
        f.write(rng.randbytes(200 * 1024))
    second = store.write_checkpoint(
        job="j",
        checkpoint="c2",
        parent="c1",
        src_dir=src,
        page_maps={"pages-1.img": entries},
    )
    assert second.bytes_logical == 12 * MiB
    assert second.bytes_new_plain <= 0.15 * second.bytes_logical
    assert second.bytes_uploaded <= 0.15 * second.bytes_logical
    assert second.chunks_new <= 5
    store.restore_files(second.manifest, tmp_path / "out")
    _same_tree(src, tmp_path / "out")

    # unchanged files cost nothing (the store is asked)
    third = store.write_checkpoint(
        job="j", checkpoint="c3", parent="c2", src_dir=src, page_maps={"pages-1.img": entries}
    )
    assert (third.chunks_new, third.bytes_uploaded) == (0, 0)


def _spoil(backend: LocalBackend, ref: ChunkRef, at: int, data: bytes) -> None:
    """Overwrites the chunk's stored bytes from offset ``at`` with ``data``, in its pack or object."""
    path = backend.root / (chunk_key(ref.hash) if ref.pack is None else pack_key(ref.pack))
    stored = bytearray(path.read_bytes())
    start = at + ref.at
    stored[start : start + len(data)] = data
    path.write_bytes(bytes(stored))


def test_corrupt_chunk_fails_its_checkpoint_only(tmp_path: Path) -> None:
    rng = random.Random(4)
    backend = LocalBackend(tmp_path / "store")
    store = CheckpointStore(backend)
    shared = rng.randbytes(2 * MiB)
    parent = None
    for name, extra in [("ck-a", rng.randbytes(MiB)), ("ck-b", rng.randbytes(MiB))]:
        src = tmp_path / name
        src.mkdir()
        (src / "shared.bin").write_bytes(shared)
        (src / "pages-1.img").write_bytes(extra)
        store.write_checkpoint(job="j", checkpoint=name, parent=parent, src_dir=src)
        parent = name
    a, b = store.read_manifest("j", "ck-a"), store.read_manifest("j", "ck-b")
    (victim,) = a.chunk_hashes() - b.chunk_hashes()
    (ref,) = [r for f in a.files for r in f.chunks if r.hash == victim]
    assert ref.pack in b.packs()  # b reuses the shared chunks where a's write put them
    _spoil(backend, ref, 1000, bytes([0xFF ^ backend.get_range(pack_key(ref.pack), ref.at + 1000, 1)[0]]))

    with pytest.raises(ChunkCorrupt) as info:
        store.restore_files(a, tmp_path / "out-a")
    assert (info.value.checkpoint, info.value.chunk, info.value.path) == ("ck-a", victim, "pages-1.img")
    assert str(info.value) == (
        f"checkpoint ck-a: chunk {victim[:12]}… of pages-1.img is corrupt (hash mismatch); restore another checkpoint"
    )
    store.restore_files(b, tmp_path / "out-b")
    _same_tree(tmp_path / "ck-b", tmp_path / "out-b")

    _spoil(backend, ref, 0, b"\x09garbage")
    with pytest.raises(ChunkCorrupt, match="undecodable"):
        store.restore_files(a, tmp_path / "out-a2")
    backend.delete(pack_key(ref.pack))
    with pytest.raises(ChunkCorrupt, match="missing from the store"):
        store.restore_files(a, tmp_path / "out-a3")


def test_manifest_is_written_last_and_failed_writes_stay_invisible(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_source(src, random.Random(5))
    backend = Recording(tmp_path / "store")
    store = CheckpointStore(backend)
    store.write_checkpoint(job="j", checkpoint="c1", parent=None, src_dir=src)
    data_puts = [k for k in backend.puts if not k.startswith("locks/")]
    assert data_puts[-1] == manifest_key("j", "c1")
    assert len(data_puts) == 2 and data_puts[0].startswith("packs/")  # 4.4 MiB: one pack
    assert list(backend.list("locks/")) == []

    failing = Recording(tmp_path / "store2", fail_chunk_put=2)
    store = CheckpointStore(failing, pack_bytes=MiB)
    with pytest.raises(StoreError, match="injected failure"):
        store.write_checkpoint(job="j", checkpoint="c1", parent=None, src_dir=src)
    assert store.list_checkpoints("j") == []
    assert list(failing.list("locks/")) == []
    assert store.gc().packs_deleted == 2  # what it stored before the failure: no manifest names it
    assert list(failing.list("packs/")) == []
    leftover = [p.name for p in (tmp_path / "store2").rglob("*") if p.is_file() and "packs" in p.parts]
    assert leftover == []  # nor the temporary file of the pack it was writing


def test_read_manifest_errors(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    store = CheckpointStore(backend)
    with pytest.raises(ObjectNotFound):
        store.read_manifest("j", "nope")
    backend.put(manifest_key("j", "bad"), b"{not json")
    with pytest.raises(ManifestCorrupt, match="checkpoint bad: manifest is corrupt"):
        store.read_manifest("j", "bad")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    store.write_checkpoint(job="other", checkpoint="c", parent=None, src_dir=src)
    backend.put(manifest_key("j", "c"), backend.get(manifest_key("other", "c")))
    with pytest.raises(ManifestCorrupt, match="belongs to job other"):
        store.read_manifest("j", "c")
    store.delete_checkpoint("other", "c")
    store.delete_checkpoint("other", "c")
    assert store.list_checkpoints("other") == []


def test_bytes_stored_is_what_the_checkpoint_takes_in_the_store_not_what_it_uploaded(tmp_path: Path) -> None:
    """A checkpoint of unchanged files uploads nothing but still takes its chunks' space."""
    rng = random.Random(4)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(rng.randbytes(3 * MiB))
    (src / "b.bin").write_bytes(b"same" * 100_000)
    store = CheckpointStore(LocalBackend(tmp_path / "store"))
    first = store.write_checkpoint(job="j", checkpoint="c1", parent=None, src_dir=src)
    chunks = sum(p.stat().st_size for p in (tmp_path / "store" / "packs").rglob("*") if p.is_file())
    assert first.bytes_stored == first.bytes_uploaded == chunks
    second = store.write_checkpoint(job="j", checkpoint="c2", parent="c1", src_dir=src)
    assert second.bytes_uploaded == 0 and second.bytes_stored == first.bytes_stored


def test_an_ended_jobs_output_is_kept_apart_from_its_checkpoints(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "store"), workers=1)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "stdout").write_bytes(b"one\ntwo\n")
    (job_dir / "stderr").write_bytes(b"")
    (job_dir / "state.json").write_text("{}")  # not output: not kept
    with pytest.raises(ObjectNotFound):
        store.read_output("j1", "stdout", 0, 100)
    store.write_output(job="j1", src_dir=job_dir)
    assert store.read_output("j1", "stdout", 0, 100) == b"one\ntwo\n"
    assert store.read_output("j1", "stdout", 4, 100) == b"two\n"
    assert store.read_output("j1", "stderr", 0, 100) == b""
    assert store.list_checkpoints("j1") == []  # never taken for a checkpoint
    (job_dir / "stdout").write_bytes(b"one\ntwo\nthree\n")  # it ran again and ended again: the newer wins
    store.write_output(job="j1", src_dir=job_dir)
    assert store.read_output("j1", "stdout", 0, 100) == b"one\ntwo\nthree\n"
    store.delete_job("j1")  # goes with the job's checkpoints
    with pytest.raises(ObjectNotFound):
        store.read_output("j1", "stdout", 0, 100)


def test_output_that_is_all_empty_is_not_written_and_leaves_no_older_one(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "store"), workers=1)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "stdout").write_bytes(b"first run\n")
    store.write_output(job="j1", src_dir=job_dir)
    assert store.read_output("j1", "stdout", 0, 100) == b"first run\n"
    (job_dir / "stdout").write_bytes(b"")  # it ran again, printed nothing and ended
    (job_dir / "stderr").write_bytes(b"")
    store.write_output(job="j1", src_dir=job_dir)
    with pytest.raises(ObjectNotFound):  # what a reader takes for no output (the node service: b"")
        store.read_output("j1", "stdout", 0, 100)
    assert not [k for k in store.backend.list("") if "/output" in k]
