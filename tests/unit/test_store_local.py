"""LocalBackend: atomic puts, listing, key checks."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.store.backend import Backend, SizedListing
from ferry.store.errors import BackendUnavailable, ObjectNotFound
from ferry.store.local import LocalBackend


def test_put_get_exists_delete(tmp_path: Path) -> None:
    backend: Backend = LocalBackend(tmp_path / "store")
    assert not backend.exists("chunks/x")
    backend.put("chunks/x", b"hello")
    assert backend.exists("chunks/x")
    assert backend.get("chunks/x") == b"hello"
    backend.put("chunks/x", b"again")
    assert backend.get("chunks/x") == b"again"
    backend.delete("chunks/x")
    backend.delete("chunks/x")  # missing is fine
    with pytest.raises(ObjectNotFound, match="chunks/x is not in local directory"):
        backend.get("chunks/x")
    with pytest.raises(ObjectNotFound):
        backend.get("chunks")  # a directory is no object
    assert str(tmp_path) in backend.describe()


def test_listing(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    keys = ["chunks/ab1", "chunks/ab2", "chunks/cd", "manifests/j/1.json", "manifests/j/2.json", "manifests/k/1.json"]
    for key in keys:
        backend.put(key, key.encode())
    (tmp_path / "chunks" / ".tmp.ab3.123").write_bytes(b"half")  # a write in progress
    assert sorted(backend.list("")) == sorted(keys)
    assert sorted(backend.list("chunks/")) == keys[:3]
    assert sorted(backend.list("chunks/ab")) == keys[:2]
    assert sorted(backend.list("manifests/j/")) == keys[3:5]
    assert sorted(backend.list("manifests/")) == keys[3:]
    assert sorted(backend.list("manifests/j")) == keys[3:5]
    assert list(backend.list("nothing/")) == []
    assert isinstance(backend, SizedListing)
    assert dict(backend.list_sizes("chunks/")) == {k: len(k) for k in keys[:3]}


@pytest.mark.parametrize("key", ["", "/abs", "../up", "a/../b", "a//b", "./a", "a/"])
def test_keys_cannot_escape_the_root(tmp_path: Path, key: str) -> None:
    backend = LocalBackend(tmp_path / "store")
    with pytest.raises(UsageError):
        backend.put(key, b"x")
    with pytest.raises(UsageError):
        backend.get(key)


def test_a_failed_put_leaves_the_old_object_and_no_debris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalBackend(tmp_path)
    backend.put("chunks/x", b"old")
    real_write = os.write

    def short_then_fail(fd: int, data: bytes) -> int:
        if len(data) > 10:
            return real_write(fd, memoryview(data)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(BackendUnavailable, match="No space left on device"):
        backend.put("chunks/x", b"n" * 100)
    monkeypatch.undo()
    assert backend.get("chunks/x") == b"old"
    assert os.listdir(tmp_path / "chunks") == ["x"]


def test_readers_never_see_a_partial_object(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    size = 2 * 1024 * 1024
    backend.put("chunks/big", b"a" * size)
    stop = threading.Event()
    seen: set[tuple[int, int]] = set()

    def read() -> None:
        while not stop.is_set():
            data = backend.get("chunks/big")
            seen.add((len(data), len(set(data))))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20):
            backend.put("chunks/big", bytes([98 + i % 2]) * size)
    finally:
        stop.set()
        reader.join()
    assert seen == {(size, 1)}


def test_fsync_mode_and_recreated_directories(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, fsync=True)
    backend.put("manifests/j/1.json", b"{}")
    (tmp_path / "manifests" / "j" / "1.json").unlink()
    (tmp_path / "manifests" / "j").rmdir()
    backend.put("manifests/j/2.json", b"{}")  # its directory went away meanwhile
    assert list(backend.list("manifests/")) == ["manifests/j/2.json"]


def test_a_write_on_a_read_only_disk_fails_as_the_store_s_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleanup of the temporary file fails there too; its error must not replace the real one."""
    import errno

    backend = LocalBackend(tmp_path / "store")

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(BackendUnavailable, match=r"cannot write chunks/ab: Read-only file system"):
        backend.put("chunks/ab", b"data")


@pytest.mark.parametrize("fsync", [False, True])
def test_an_object_written_piece_by_piece_appears_whole_on_commit_and_not_at_all_on_abort(tmp_path: Path,
                                                                                       fsync: bool) -> None:
    backend = LocalBackend(tmp_path, fsync=fsync)
    writer = backend.writer("packs/p1")
    writer.write(b"abc")
    writer.write(b"defg")
    assert not backend.exists("packs/p1") and list(backend.list("packs/")) == []  # nothing until the commit
    writer.commit()
    assert backend.get("packs/p1") == b"abcdefg" and backend.get_range("packs/p1", 2, 3) == b"cde"
    assert backend.get_range("packs/p1", 5, 10) == b"fg" and backend.get_range("packs/p1", 7, 1) == b""
    assert os.stat(tmp_path / "packs" / "p1").st_mode & 0o777 == 0o600
    dropped = backend.writer("packs/p2")
    dropped.write(b"x" * 100)
    dropped.abort()
    dropped.abort()
    assert sorted(p.name for p in (tmp_path / "packs").iterdir()) == ["p1"]  # no temporary file left
    empty = backend.writer("packs/p3")
    empty.commit()
    assert backend.get("packs/p3") == b""
    with pytest.raises(ObjectNotFound):
        backend.get_range("packs/none", 0, 1)
