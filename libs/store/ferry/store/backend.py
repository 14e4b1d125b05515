"""The small interface every object backend implements (local directory, S3, ...).

Methods are synchronous and thread-safe: the store calls them from a thread pool, and asyncio
callers run them with ``asyncio.to_thread``. Keys are relative POSIX paths such as
``chunks/<sha256>`` or ``manifests/<job>/<checkpoint>.json``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from ferry.common.errors import UsageError


class Backend(Protocol):
    """Where chunks and manifests live."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically: readers see the old object or the whole new one."""

    def get(self, key: str) -> bytes:
        """Return the object under ``key``; raise ObjectNotFound when there is none."""

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """At most ``length`` bytes of the object under ``key`` from ``offset`` (fewer past its
        end); raise ObjectNotFound when there is none."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    def stored_size(self, key: str) -> int | None:
        """The size of the object under ``key`` as stored, or None when there is none."""

    def delete(self, key: str) -> None:
        """Remove the object under ``key``; a missing object is not an error."""

    def list(self, prefix: str) -> Iterator[str]:
        """Yield every key that starts with ``prefix`` (a plain string prefix), in no set order."""

    def describe(self) -> str:
        """One line naming the backend for logs and errors (never a secret)."""


class ObjectWriter(Protocol):
    """An object written piece by piece: readers see nothing until ``commit``, then all of it."""

    def write(self, data: bytes) -> None:
        """Appends ``data``."""

    def commit(self) -> None:
        """Stores what was written under the key, atomically (as ``Backend.put``)."""

    def abort(self) -> None:
        """Drops what was written; nothing is stored. Safe after a failure, and more than once."""


class BufferedWriter:
    """An ObjectWriter for any backend: the pieces are kept (not copied) and put as one object."""

    def __init__(self, backend: Backend, key: str) -> None:
        self._backend, self._key = backend, key
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._parts.append(data)

    def commit(self) -> None:
        self._backend.put(self._key, b"".join(self._parts))
        self._parts = []

    def abort(self) -> None:
        self._parts = []


@runtime_checkable
class StreamingWrites(Protocol):
    """Optional: a backend that writes an object as it comes (a local file), without holding it."""

    def writer(self, key: str) -> ObjectWriter:
        """A writer for a new object under ``key``."""


def object_writer(backend: Backend, key: str) -> ObjectWriter:
    """The backend's own writer for ``key`` where it has one, else one that puts the pieces at once."""
    return backend.writer(key) if isinstance(backend, StreamingWrites) else BufferedWriter(backend, key)


@runtime_checkable
class CoalescedReads(Protocol):
    """Optional: a backend whose every request costs a round trip (S3): a restore reads a pack's
    neighbouring chunks together, up to ``coalesce_bytes`` a read. A local file is read a chunk at
    a time (bigger reads measured slower there: fresh buffers cost more than the calls)."""

    coalesce_bytes: int


@runtime_checkable
class UnfinishedWrites(Protocol):
    """Optional: a backend where a writer killed mid-object leaves its partial object behind (a
    local temporary file), which gc removes once nothing can still be writing it."""

    def remove_unfinished(self, prefix: str, older_than_s: float) -> int:
        """Remove the partial objects under ``prefix`` last written ``older_than_s`` or more ago;
        return how many."""


@runtime_checkable
class SizedListing(Protocol):
    """Optional: a backend that can list keys with their stored sizes in one pass (used by gc)."""

    def list_sizes(self, prefix: str) -> Iterator[tuple[str, int]]:
        """Yield ``(key, stored_size)`` for every key that starts with ``prefix``."""


def check_key(key: str) -> str:
    """Refuse keys that could escape a backend's root: absolute, empty parts, ``.`` or ``..``."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\0" in key or any(p in ("", ".", "..") for p in parts):
        raise UsageError(f"invalid store key {key!r}: expected a relative path like chunks/<hash>")
    return key


def check_prefix(prefix: str) -> str:
    """Like check_key, but the empty prefix and a trailing slash are allowed."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix
