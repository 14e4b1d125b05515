"""The checkpoint store against a real S3 server (moto's standalone server on 127.0.0.1)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.store.chunking import PAGE_CHUNK
from ferry.store.errors import BackendUnavailable, ChunkCorrupt, ObjectNotFound
from ferry.store.manifest import pack_key
from ferry.store.retry import RetryPolicy
from ferry.store.s3 import S3Backend
from ferry.store.store import CheckpointStore
from ferry.store.url import open_backend
from tests.s3server import MotoServer

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _backend(moto: MotoServer, prefix: str = "", **kwargs: object) -> S3Backend:
    return S3Backend(
        moto.endpoint,
        "ferry-test",
        prefix,
        access_key="testing",
        secret_key="testing",
        secure=False,
        region="us-east-1",
        **kwargs,  # type: ignore[arg-type]
    )


def _source(root: Path, rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    root.mkdir()
    (root / "pages-1.img").write_bytes(rng.randbytes(4 * MiB))
    (root / "core-1.img").write_bytes(b"core" * 1000)
    (root / "stdout.log").write_bytes(b"")
    return {"pages-1.img": [(0x7F0000000000, 512), (0x7F0010000000, 512)]}


def test_backend_basics_and_prefixes(moto: MotoServer) -> None:
    a, b = _backend(moto, "team-a"), _backend(moto, "team-b/")
    a.put("chunks/x", b"one")
    b.put("chunks/x", b"two")
    a.put("manifests/j/1.json", b"{}")
    assert (a.get("chunks/x"), b.get("chunks/x")) == (b"one", b"two")
    assert a.exists("chunks/x") and not a.exists("chunks/y")
    assert sorted(a.list("")) == ["chunks/x", "manifests/j/1.json"]
    assert list(a.list("chunks/")) == ["chunks/x"]
    assert dict(a.list_sizes("chunks/")) == {"chunks/x": 3}
    a.delete("chunks/x")
    a.delete("chunks/x")
    with pytest.raises(ObjectNotFound, match="chunks/x is not in s3://ferry-test/team-a/"):
        a.get("chunks/x")
    assert b.get("chunks/x") == b"two"
    b.put("packs/p", b"0123456789")
    assert (b.get_range("packs/p", 2, 3), b.get_range("packs/p", 8, 5), b.get_range("packs/p", 10, 4)) == (
        b"234", b"89", b"")
    with pytest.raises(ObjectNotFound):
        a.get_range("packs/p", 0, 1)


def test_listing_pages_through_many_keys(moto: MotoServer) -> None:
    backend = _backend(moto, "many")
    backend.list_page = 7
    keys = [f"chunks/{i:03d}" for i in range(25)]
    for key in keys:
        backend.put(key, b"")
    assert sorted(backend.list("chunks/")) == keys
    assert CheckpointStore(backend).gc().chunks_deleted == 0  # not chunk hashes: gc leaves them alone


def test_roundtrip_dedup_and_corruption(moto: MotoServer, tmp_path: Path) -> None:
    rng = random.Random(1)
    backend = _backend(moto, "store")
    store = CheckpointStore(backend, workers=4)
    src = tmp_path / "src"
    page_maps = _source(src, rng)
    first = store.write_checkpoint(job="j", checkpoint="c1", parent=None, src_dir=src, page_maps=page_maps)
    assert first.chunks_new == len(first.manifest.chunk_hashes())
    assert store.list_checkpoints("j") == ["c1"]
    store.restore_files(store.read_manifest("j", "c1"), tmp_path / "out1")
    for name in ("pages-1.img", "core-1.img", "stdout.log"):
        assert (tmp_path / "out1" / name).read_bytes() == (src / name).read_bytes()

    with open(src / "pages-1.img", "r+b") as f:  # ~5% of the pages, in place
        f.seek(MiB)
        f.write(rng.randbytes(200 * 1024))
    second = store.write_checkpoint(
        job="j",
        checkpoint="c2",
        parent="c1",
        src_dir=src,
        page_maps=page_maps,
    )
    assert second.chunks_new == 1  # the one address window the write fell in, of a 4 MiB image
    assert second.bytes_new_plain <= PAGE_CHUNK < 0.15 * second.bytes_logical
    store.restore_files(second.manifest, tmp_path / "out2")
    assert (tmp_path / "out2" / "pages-1.img").read_bytes() == (src / "pages-1.img").read_bytes()

    (victim,) = second.manifest.chunk_hashes() - first.manifest.chunk_hashes()
    (ref,) = [r for f in second.manifest.files for r in f.chunks if r.hash == victim]
    assert ref.pack is not None and second.manifest.packs() == {ref.pack} | first.manifest.packs()
    stored = bytearray(backend.get(pack_key(ref.pack)))  # its pack, read whole then in ranges
    stored[ref.at + ref.stored - 1] ^= 1
    backend.put(pack_key(ref.pack), bytes(stored))
    with pytest.raises(ChunkCorrupt) as info:
        store.restore_files(second.manifest, tmp_path / "out3")
    assert (info.value.checkpoint, info.value.chunk, info.value.path) == ("c2", victim, "pages-1.img")
    store.restore_files(first.manifest, tmp_path / "out4")

    store.delete_checkpoint("j", "c2")
    collected = store.gc()  # a copy of the damaged chunk went to quarantine/ when the restore found it
    assert (collected.packs_deleted, collected.quarantined_deleted) == (1, 1)
    assert not backend.exists(pack_key(ref.pack)) and list(backend.list("damaged/")) == []


def test_big_objects_go_multipart(moto: MotoServer) -> None:
    backend = _backend(moto, "multi", part_size=5 * MiB)
    data = os.urandom(11 * MiB)
    backend.put("chunks/big", data)
    assert backend.get("chunks/big") == data
    etag = backend._client.stat_object("ferry-test", "multi/chunks/big").etag
    assert etag is not None and etag.strip('"').endswith("-3")  # three parts


def test_open_backend_with_an_s3_url(moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_S3_ACCESS_KEY", "testing")
    monkeypatch.setenv("FERRY_S3_SECRET_KEY", "testing")
    backend = open_backend(f"s3://ferry-url/some/prefix?endpoint={moto.endpoint}&secure=0&region=us-east-1")
    assert backend.describe() == f"s3://ferry-url/some/prefix/ at {moto.endpoint}"
    store = CheckpointStore(backend)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"via url")
    store.write_checkpoint(job="j", checkpoint="c", parent=None, src_dir=src)
    assert store.list_checkpoints("j") == ["c"]
    store.restore_files(store.read_manifest("j", "c"), tmp_path / "out")
    assert (tmp_path / "out" / "f").read_bytes() == b"via url"


def test_unreachable_server_is_reported(moto: MotoServer) -> None:
    backend = S3Backend(
        "127.0.0.1:1",
        "ferry-test",
        access_key="a",
        secret_key="s",
        secure=False,
        region="us-east-1",
        retry=RetryPolicy(attempts=2, base=0.05),
        timeout=2,
    )
    with pytest.raises(BackendUnavailable, match="is unreachable"):
        backend.put("chunks/x", b"x")


def test_put_survives_a_brief_outage(moto: MotoServer) -> None:
    """Runs last in this module: the restarted server comes back empty."""
    backend = _backend(moto, "outage", retry=RetryPolicy(attempts=20, base=0.2, cap=1.0))
    backend.put("chunks/before", b"x")
    moto.stop()
    restarter = threading.Timer(0.5, moto.start)
    restarter.start()
    started = time.monotonic()
    try:
        backend.put("chunks/after", b"y" * 1000)  # the bucket went with the server: made again
    finally:
        restarter.join()
    assert time.monotonic() - started >= 0.4
    assert backend.get("chunks/after") == b"y" * 1000
