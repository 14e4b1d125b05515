"""Manifests: what one checkpoint is made of, and their canonical, self-verifying encoding.

A manifest lists the files of a checkpoint and, for each, its chunk sequence. It is stored as
canonical JSON (sorted keys, no spaces, ASCII) with a ``digest`` field holding the sha256 of the
canonical JSON of everything else; ``decode_manifest`` refuses anything that does not verify or
validate. Paths are relative POSIX paths without ``.``/``..`` parts, so that restoring a manifest
can never write outside its destination directory.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ferry.common.errors import UsageError
from ferry.store.errors import ManifestCorrupt

MANIFEST_VERSION = 1
MAX_CHUNK_SIZE = 64 * 1024 * 1024
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
_HASH = r"^[0-9a-f]{64}$"


def check_id(value: str, what: str = "id") -> str:
    """Job and checkpoint ids become key parts: letters, digits and ``._:@+=-``, at most 200."""
    if not _ID.fullmatch(value):
        raise UsageError(f"invalid {what} {value!r}: use letters, digits and ._:@+=- (at most 200)")
    return value


def check_relative_path(path: str) -> str:
    """A relative POSIX path inside the checkpoint: no leading ``/``, no empty, ``.`` or ``..`` part."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path {path!r} must be relative, without empty, '.' or '..' parts")
    return path


def manifest_key(job: str, checkpoint: str) -> str:
    return f"manifests/{check_id(job, 'job id')}/{check_id(checkpoint, 'checkpoint id')}.json"


def chunk_key(h: str) -> str:
    return f"chunks/{h}"


class ChunkRef(BaseModel):
    """One chunk: sha256 (hex) of its plain bytes and their number."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hash: str = Field(pattern=_HASH)
    size: int = Field(gt=0, le=MAX_CHUNK_SIZE)


class FileEntry(BaseModel):
    """One file of a checkpoint: its chunks, in order, make up exactly ``size`` bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int = Field(ge=0)
    mode: int = Field(ge=0, le=0o777)
    chunks: list[ChunkRef]

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        return check_relative_path(value)

    @model_validator(mode="after")
    def _sizes_add_up(self) -> FileEntry:
        total = sum(c.size for c in self.chunks)
        if total != self.size:
            raise ValueError(f"{self.path}: chunks hold {total} bytes, file size is {self.size}")
        return self


class Manifest(BaseModel):
    """The files of one checkpoint of one job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = MANIFEST_VERSION
    job: str
    checkpoint: str
    parent: str | None
    created: float = Field(allow_inf_nan=False)
    files: list[FileEntry]
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != MANIFEST_VERSION:
            raise ValueError(f"manifest version {value} is not supported (this Ferry reads {MANIFEST_VERSION})")
        return value

    @field_validator("job", "checkpoint", "parent")
    @classmethod
    def _ids(cls, value: str | None) -> str | None:
        if value is not None and not _ID.fullmatch(value):
            raise ValueError(f"invalid id {value!r}")
        return value

    @model_validator(mode="after")
    def _paths_do_not_clash(self) -> Manifest:
        paths = {f.path for f in self.files}
        if len(paths) != len(self.files):
            raise ValueError("a path is listed twice")
        for path in paths:
            parts = path.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in paths:
                    raise ValueError(f"{path} lies under the file {'/'.join(parts[:i])}")
        return self

    @property
    def bytes_logical(self) -> int:
        """Plain bytes of all files together."""
        return sum(f.size for f in self.files)

    def chunk_hashes(self) -> set[str]:
        """Every chunk hash the checkpoint needs."""
        return {c.hash for f in self.files for c in f.chunks}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def encode_manifest(m: Manifest) -> bytes:
    """Canonical JSON of ``m`` plus ``digest`` = sha256 hex of the canonical JSON without it."""
    body = m.model_dump(mode="json")
    body["digest"] = hashlib.sha256(_canonical(body)).hexdigest()
    return _canonical(body)


def decode_manifest(data: bytes, checkpoint: str) -> Manifest:
    """Parse, verify the digest of, and validate the stored manifest of ``checkpoint``."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise ManifestCorrupt(checkpoint, "not JSON") from exc
    if not isinstance(body, dict):
        raise ManifestCorrupt(checkpoint, "not a JSON object")
    digest = body.pop("digest", None)
    if not isinstance(digest, str):
        raise ManifestCorrupt(checkpoint, "no digest")
    try:
        actual = hashlib.sha256(_canonical(body)).hexdigest()
    except ValueError as exc:
        raise ManifestCorrupt(checkpoint, "not canonical JSON") from exc
    if actual != digest:
        raise ManifestCorrupt(checkpoint, "digest mismatch")
    try:
        manifest = Manifest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise ManifestCorrupt(checkpoint, f"{where}: {first['msg']}") from exc
    if manifest.checkpoint != checkpoint:
        raise ManifestCorrupt(checkpoint, f"it describes checkpoint {manifest.checkpoint}")
    return manifest
