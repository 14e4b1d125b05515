"""Errors of the checkpoint store.

    FerryError                          (ferry.common.errors)
    └── StoreError                      anything the checkpoint store reports
        ├── ObjectNotFound              a key the backend does not hold
        ├── ChunkCorrupt                a chunk is missing, undecodable or fails its hash: the
        │                               checkpoint that needs it cannot be restored
        ├── ManifestCorrupt             a manifest is unreadable, fails its digest or is invalid
        │   └── ManifestRefused         unsigned, signed by another tenant or altered: not trusted
        ├── RestoreRefused              a restore that would exceed its caps (size, free space)
        ├── UndecodableChunk            (ferry.store.codec) stored bytes that are no chunk: the reader
        │                               reports the chunk as corrupt
        └── BackendUnavailable          the backend cannot be reached or refuses to work (network,
                                        credentials, a full disk); retrying later may help

Errors of minio, urllib3 and the OS are translated at the backend boundary with ``raise ... from``.
"""

from __future__ import annotations

from ferry.common.errors import FerryError


class StoreError(FerryError):
    """Root of every error the checkpoint store raises on purpose."""


class ObjectNotFound(StoreError):
    """The backend holds no object under ``key``."""

    def __init__(self, key: str, where: str = "the store") -> None:
        super().__init__(f"{key} is not in {where}")
        self.key = key
        self.where = where

    def __reduce__(self) -> tuple[type[ObjectNotFound], tuple[str, str]]:
        return type(self), (self.key, self.where)


class ChunkCorrupt(StoreError):
    """A chunk of ``path`` in ``checkpoint`` is missing, undecodable or fails its sha256."""

    def __init__(self, checkpoint: str, chunk: str, path: str, reason: str = "hash mismatch") -> None:
        super().__init__(
            f"checkpoint {checkpoint}: chunk {chunk[:12]}… of {path} is corrupt ({reason}); restore another checkpoint"
        )
        self.checkpoint = checkpoint
        self.chunk = chunk
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[type[ChunkCorrupt], tuple[str, str, str, str]]:
        return type(self), (self.checkpoint, self.chunk, self.path, self.reason)


class ManifestCorrupt(StoreError):
    """The manifest of ``checkpoint`` cannot be trusted: bad JSON, digest or content."""

    def __init__(self, checkpoint: str, reason: str) -> None:
        super().__init__(f"checkpoint {checkpoint}: manifest is corrupt ({reason}); restore another checkpoint")
        self.checkpoint = checkpoint
        self.reason = reason

    def __reduce__(self) -> tuple[type[ManifestCorrupt], tuple[str, str]]:
        return type(self), (self.checkpoint, self.reason)


class BackendUnavailable(StoreError):
    """The backend cannot be reached or refuses to work; the message says what to check."""


class ManifestRefused(ManifestCorrupt):
    """A manifest whose signature is missing, foreign or wrong: it is not restored."""

    def __init__(self, checkpoint: str, reason: str) -> None:
        StoreError.__init__(self, f"checkpoint {checkpoint}: manifest refused: {reason}")
        self.checkpoint = checkpoint
        self.reason = reason


class RestoreRefused(StoreError):
    """Restoring a checkpoint would write more than it may (its declared size, the free space)."""
