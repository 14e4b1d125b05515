"""A backend in a local directory: each key is a file under the root.

``put`` writes a temporary file (named ``.tmp.*``, never listed) in the target's directory and
renames it over the key, so readers see the old object or the whole new one; one a killed writer
left goes at the next gc (``remove_unfinished``). With ``fsync=True``
the data and the rename are flushed to disk before ``put`` returns; without it (the default, much
faster) a machine crash may leave a damaged chunk, which a restore then reports as ChunkCorrupt.
Checkpoints hold process memory: objects are 0600 and folders 0700, whatever the umask.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ferry.store.backend import check_key, check_prefix
from ferry.store.errors import BackendUnavailable, ObjectNotFound

_TMP = ".tmp."


class LocalBackend:
    """Objects as files under ``root`` (created on the first write)."""

    def __init__(self, root: Path, *, fsync: bool = False) -> None:
        self.root = Path(root).absolute()
        self._fsync = fsync
        self._dirs: set[Path] = set()

    def describe(self) -> str:
        return f"local directory {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _fail(self, action: str, key: str, exc: OSError) -> BackendUnavailable:
        return BackendUnavailable(f"{self.describe()}: cannot {action} {key}: {exc.strerror or exc}")

    def put(self, key: str, data: bytes) -> None:
        w = self.writer(key)
        w.write(data)
        w.commit()

    def writer(self, key: str) -> _FileWriter:
        """A temporary file in the key's folder, renamed over the key on commit (``put`` writes
        through one too)."""
        path = self._path(key)
        if path.name.startswith(_TMP):
            raise BackendUnavailable(f"{self.describe()}: key {key!r} uses the reserved prefix {_TMP}")
        if path.parent not in self._dirs:
            try:
                self._mkdirs(path.parent)
            except OSError as exc:
                raise self._fail("write", key, exc) from exc
            self._dirs.add(path.parent)
        return _FileWriter(self, key, path)

    def _mkdirs(self, folder: Path) -> None:
        """``folder`` and the missing ones above it up to the root's parent, each 0700."""
        missing = []
        while not folder.is_dir():
            missing.append(folder)
            if folder == self.root or folder.parent == folder:
                break
            folder = folder.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            os.chmod(d, 0o700)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(key, self.describe()) from exc
        except OSError as exc:
            raise self._fail("read", key, exc) from exc

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(key, self.describe()) from exc
        except OSError as exc:
            raise self._fail("read", key, exc) from exc
        try:
            parts = []
            while length > 0:
                part = os.pread(fd, length, offset)
                if not part:
                    break
                parts.append(part)
                offset, length = offset + len(part), length - len(part)
            return b"".join(parts)  # one part: itself, not a copy
        except OSError as exc:
            raise self._fail("read", key, exc) from exc
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def stored_size(self, key: str) -> int | None:
        try:
            st = os.stat(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._fail("stat", key, exc) from exc
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fail("delete", key, exc) from exc

    def list(self, prefix: str) -> Iterator[str]:
        for key, _ in self._walk(prefix, sizes=False):
            yield key

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        return self._walk(prefix, sizes=True)

    def remove_unfinished(self, prefix: str, older_than_s: float) -> int:
        """Removes the temporary files under ``prefix`` (a writer's, killed before its commit: up
        to a whole pack) not written to for ``older_than_s`` seconds; a live writer's file is
        written as its pieces come, so it is younger."""
        check_prefix(prefix)
        folder = self.root / prefix.rstrip("/") if prefix else self.root
        cutoff = time.time() - older_than_s
        removed = 0
        for directory, _, names in os.walk(folder):
            for name in names:
                if not name.startswith(_TMP):
                    continue
                path = Path(directory) / name
                try:
                    if path.lstat().st_mtime <= cutoff:
                        path.unlink()
                        removed += 1
                except FileNotFoundError:  # committed or aborted meanwhile
                    continue
                except OSError as exc:
                    raise self._fail("remove", str(path.relative_to(self.root)), exc) from exc
        return removed

    def _walk(self, prefix: str, *, sizes: bool) -> Iterator[tuple[str, int]]:
        check_prefix(prefix)
        folder, _, head = prefix.rpartition("/")
        base = self.root / folder if folder else self.root
        stack: builtins.list[tuple[Path, str, str]] = [(base, f"{folder}/" if folder else "", head)]
        while stack:
            directory, rel, starts = stack.pop()
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name, reverse=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                raise self._fail("list", prefix, exc) from exc
            files = []
            for entry in entries:
                if not entry.name.startswith(starts) or entry.name.startswith(_TMP):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), f"{rel}{entry.name}/", ""))
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry)
            for entry in reversed(files):
                try:
                    yield f"{rel}{entry.name}", entry.stat(follow_symlinks=False).st_size if sizes else 0
                except FileNotFoundError:  # deleted while listing
                    continue


class _FileWriter:
    """LocalBackend's ObjectWriter: each piece goes to the file as it comes."""

    def __init__(self, backend: LocalBackend, key: str, path: Path) -> None:
        self._backend, self._key, self._path = backend, key, path
        self._tmp = path.parent / f"{_TMP}{path.name}.{uuid.uuid4().hex}"
        self._fd: int | None = None

    def write(self, data: bytes) -> None:
        try:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                try:
                    self._fd = os.open(self._tmp, flags, 0o600)
                except FileNotFoundError:  # the directory was removed behind our back
                    self._backend._mkdirs(self._path.parent)
                    self._fd = os.open(self._tmp, flags, 0o600)
                os.fchmod(self._fd, 0o600)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.abort()
            raise self._backend._fail("write", self._key, exc) from exc

    def commit(self) -> None:
        try:
            if self._fd is None:  # nothing written: an empty object
                self.write(b"")
            assert self._fd is not None
            if self._backend._fsync:
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
            os.replace(self._tmp, self._path)
            if self._backend._fsync:
                dfd = os.open(self._path.parent, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            self.abort()
            raise self._backend._fail("write", self._key, exc) from exc

    def abort(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        with contextlib.suppress(OSError):
            self._tmp.unlink(missing_ok=True)
