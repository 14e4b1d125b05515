"""Manifests: what one checkpoint is made of, and their canonical, self-verifying encoding.

A manifest lists the files of a checkpoint and, for each, its chunk sequence. It is stored as
canonical JSON (sorted keys, no spaces, ASCII) with a ``digest`` field holding the sha256 of the
canonical JSON of everything else and, in a store with keys, a ``signature``: HMAC-SHA256 of that
same JSON under its tenant's signing key (``ferry.store.keys``), which names the tenant and key
id it was made with. ``decode_manifest`` refuses anything that does not verify or validate, and,
given keys, anything unsigned, signed by another tenant or altered. Paths are relative POSIX paths
without ``.``/``..`` parts, so that restoring a manifest can never write outside its destination
directory; file and chunk counts are capped (MAX_FILES, MAX_CHUNKS).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from ferry.common.errors import UsageError
from ferry.store.errors import ManifestCorrupt, ManifestRefused
from ferry.store.keys import KeyRing, TenantKeys

MANIFEST_VERSION = 1
MAX_CHUNK_SIZE = 64 * 1024 * 1024
MAX_FILES = 100_000
MAX_CHUNKS = 4_000_000  # 1 TiB in 256 KiB chunks, 2 TiB in the pages images' 512 KiB ones
MAX_MANIFEST_BYTES = 512 << 20
DEFAULT_TENANT = "default"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
_HASH = r"^[0-9a-f]{64}$"
_PACK = r"^[0-9a-f]{32}$"
MAX_STORED_CHUNK = MAX_CHUNK_SIZE + 65536  # a header and a seal: a few bytes (kept raw when zstd would not shrink it)


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


def pack_key(name: str) -> str:
    return f"packs/{name}"


_PACKED = ("pack", "at", "stored")


class ChunkRef(BaseModel):
    """One chunk: sha256 (hex) of its plain bytes and their number; where it is stored: its own
    object ``chunks/<hash>`` (``pack`` None), or ``stored`` bytes at offset ``at`` of the pack
    ``packs/<pack>`` (``ferry.store.packs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hash: str = Field(pattern=_HASH)
    size: int = Field(gt=0, le=MAX_CHUNK_SIZE)
    pack: str | None = Field(default=None, pattern=_PACK)
    at: int = Field(default=0, ge=0)
    stored: int = Field(default=0, ge=0, le=MAX_STORED_CHUNK)

    @model_validator(mode="after")
    def _placed(self) -> ChunkRef:
        if self.pack is None and (self.at or self.stored):
            raise ValueError("a chunk stored on its own has no offset or stored size")
        if self.pack is not None and not self.stored:
            raise ValueError("a packed chunk needs its stored size")
        return self

    @model_serializer(mode="wrap")
    def _without_place(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A chunk stored on its own is written as before packs: its hash and size only."""
        body: dict[str, Any] = handler(self)
        if self.pack is None:
            for name in _PACKED:
                body.pop(name, None)
        return body

    @property
    def where(self) -> tuple[str, str | None, int]:
        """What tells two stored copies apart: the hash, and the pack and offset of a packed one."""
        return self.hash, self.pack, self.at


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
    files: list[FileEntry] = Field(max_length=MAX_FILES)
    meta: dict[str, Any] = Field(default_factory=dict)
    tenant: str = DEFAULT_TENANT
    key_id: str = ""  # the keyring key it is sealed and signed under; "" in a store without keys

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != MANIFEST_VERSION:
            raise ValueError(f"manifest version {value} is not supported (this Ferry reads {MANIFEST_VERSION})")
        return value

    @field_validator("job", "checkpoint", "parent", "tenant")
    @classmethod
    def _ids(cls, value: str | None) -> str | None:
        if value is not None and not _ID.fullmatch(value):
            raise ValueError(f"invalid id {value!r}")
        return value

    @model_validator(mode="after")
    def _paths_do_not_clash(self) -> Manifest:
        if sum(len(f.chunks) for f in self.files) > MAX_CHUNKS:
            raise ValueError(f"more than {MAX_CHUNKS} chunks")
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

    def packs(self) -> set[str]:
        """Every pack a chunk of the checkpoint lies in."""
        return {c.pack for f in self.files for c in f.chunks if c.pack is not None}


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def encode_manifest(m: Manifest, keys: TenantKeys | None = None) -> bytes:
    """Canonical JSON of ``m`` plus ``digest`` = sha256 hex of the canonical JSON without it and,
    with ``keys`` (which must be the manifest's tenant and key id), ``signature``."""
    body = m.model_dump(mode="json")
    plain = _canonical(body)
    body["digest"] = hashlib.sha256(plain).hexdigest()
    if keys is not None:
        if (keys.tenant, keys.key_id) != (m.tenant, m.key_id):
            raise ValueError(f"keys of {keys.tenant}/{keys.key_id} cannot sign a manifest of {m.tenant}/{m.key_id}")
        body["signature"] = keys.sign(plain)
    return _canonical(body)


def decode_manifest(data: bytes, checkpoint: str, keyring: KeyRing | None = None,
                    tenant: str | None = None) -> Manifest:
    """Parse, verify the digest of, and validate the stored manifest of ``checkpoint``.

    With ``keyring``, the signature must verify under the key of the tenant and key id the
    manifest names (ManifestRefused otherwise); with ``tenant``, that must be its tenant."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestCorrupt(checkpoint, f"larger than {MAX_MANIFEST_BYTES >> 20} MiB")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ManifestCorrupt(checkpoint, "not JSON") from exc
    if not isinstance(body, dict):
        raise ManifestCorrupt(checkpoint, "not a JSON object")
    digest = body.pop("digest", None)
    signature = body.pop("signature", None)
    if not isinstance(digest, str):
        raise ManifestCorrupt(checkpoint, "no digest")
    try:
        plain = _canonical(body)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ManifestCorrupt(checkpoint, "not canonical JSON") from exc
    if hashlib.sha256(plain).hexdigest() != digest:
        raise ManifestCorrupt(checkpoint, "digest mismatch")
    if keyring is not None:
        _check_signature(checkpoint, body, plain, signature, keyring)
    try:
        manifest = Manifest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise ManifestCorrupt(checkpoint, f"{where}: {first['msg']}") from exc
    if manifest.checkpoint != checkpoint:
        raise ManifestCorrupt(checkpoint, f"it describes checkpoint {manifest.checkpoint}")
    if tenant is not None and manifest.tenant != tenant:
        raise ManifestRefused(checkpoint, f"it belongs to tenant {manifest.tenant}, not {tenant}")
    return manifest


def _check_signature(checkpoint: str, body: dict[str, Any], plain: bytes, signature: object,
                     keyring: KeyRing) -> None:
    if not isinstance(signature, str):
        raise ManifestRefused(checkpoint, "it is not signed")
    owner, key_id = body.get("tenant", DEFAULT_TENANT), body.get("key_id", "")
    if not isinstance(owner, str) or not _ID.fullmatch(owner) or not isinstance(key_id, str):
        raise ManifestRefused(checkpoint, "it names no valid tenant and key")
    if not keyring.has(key_id):
        raise ManifestRefused(checkpoint, f"it is signed with key {key_id!r}, which the keyring does not hold")
    if not keyring.tenant(owner, key_id).verifies(plain, signature):
        raise ManifestRefused(checkpoint, f"its signature does not verify for tenant {owner} (altered or forged)")
