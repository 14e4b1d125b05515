"""The store's keys: a keyring file of master keys, and the per-tenant keys derived from them.

A keyring is a JSON file (mode 0600) ``{"current": ID, "keys": {ID: base64 of 32 bytes}}``. New
checkpoints use the current key; a manifest records the id of the key it was written under, so
after a rotation (``ferry keys rotate``: a new current key, the old ones kept) older checkpoints
still restore until they are gone, and the old key can then be dropped.

For each tenant and key, HKDF-SHA256 derives three independent keys:

- ``enc``: AES-256-GCM for the chunks (a fresh 96-bit nonce per chunk, the chunk's name as
  associated data, so a chunk cannot be moved under another name);
- ``name``: keyed BLAKE3 of the plain bytes names a chunk, so deduplication works within a tenant
  and never tells one tenant that another holds the same bytes. BLAKE3 rather than HMAC-SHA256:
  naming hashes every byte of every checkpoint, and HMAC-SHA256 (1.1-1.5 GiB/s per core here, with
  SHA-NI) was most of a checkpoint's upload CPU; keyed BLAKE3 is a PRF as well and runs at about
  7 GiB/s per core. Chunks named by the HMAC before (stores from before this change) still read:
  a sealed chunk is authenticated under its name, never named again on the way back; only the
  first checkpoint after the change stores every chunk anew;
- ``sign``: HMAC-SHA256 over a manifest's canonical JSON.

Anyone holding the keyring can read every tenant's checkpoints: it is handed only to the node
services and the operator's CLI, never to workloads or the API.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ferry.common.errors import ConfigError
from ferry.store.errors import StoreError

KEY_BYTES = 32
NONCE_BYTES = 12


class SealBroken(StoreError):
    """A sealed chunk that does not open under its tenant's key and name (altered, moved or foreign)."""


def _derive(master: bytes, purpose: str, tenant: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=b"ferry store v1",
                info=f"{purpose}\0{tenant}".encode()).derive(master)


@dataclass(frozen=True)
class TenantKeys:
    """What one tenant's checkpoints are sealed, named and signed with, under one master key."""

    tenant: str
    key_id: str
    enc: bytes = field(repr=False)
    name_key: bytes = field(repr=False)
    sign_key: bytes = field(repr=False)

    def chunk_name(self, plain: memoryview | bytes) -> str:
        return blake3.blake3(plain, key=self.name_key).hexdigest()

    def seal(self, name: str, data: memoryview | bytes, prefix: bytes = b"") -> bytes:
        """``prefix`` + nonce + AES-GCM of ``data``, ``name`` and ``prefix`` authenticated with it:
        one copy of the ciphertext."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        return b"".join((prefix, nonce, AESGCM(self.enc).encrypt(nonce, data, name.encode() + prefix)))

    def open(self, name: str, sealed: memoryview | bytes, prefix: bytes = b"") -> bytes:
        """The data of what ``seal`` made (``sealed`` without its ``prefix``)."""
        view = memoryview(sealed)
        if len(view) < NONCE_BYTES + 16:
            raise SealBroken("too short to be a sealed chunk")
        try:
            return AESGCM(self.enc).decrypt(bytes(view[:NONCE_BYTES]), view[NONCE_BYTES:], name.encode() + prefix)
        except InvalidTag as exc:
            raise SealBroken("does not open under this tenant's key (altered, moved or foreign)") from exc

    def sign(self, body: bytes) -> str:
        return hmac.new(self.sign_key, body, hashlib.sha256).hexdigest()

    def verifies(self, body: bytes, signature: str) -> bool:
        # compare_digest raises on a non-ASCII str: a forged signature can hold anything
        return signature.isascii() and hmac.compare_digest(self.sign(body), signature)


class KeyRing:
    """Master keys by id; ``tenant()`` derives (and caches) a tenant's keys under one of them."""

    def __init__(self, keys: dict[str, bytes], current: str) -> None:
        if current not in keys:
            raise ConfigError(f"store keyring: the current key {current!r} is not among its keys")
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ConfigError(f"store keyring: key {key_id!r} is not {KEY_BYTES} bytes")
        self._keys = dict(keys)
        self.current = current
        self._cache: dict[tuple[str, str], TenantKeys] = {}

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    def has(self, key_id: str) -> bool:
        return key_id in self._keys

    def tenant(self, tenant: str, key_id: str | None = None) -> TenantKeys:
        kid = key_id or self.current
        cached = self._cache.get((tenant, kid))
        if cached is not None:
            return cached
        master = self._keys.get(kid)
        if master is None:
            raise StoreError(f"the store keyring has no key {kid!r} (was it dropped after a rotation?)")
        keys = TenantKeys(tenant=tenant, key_id=kid, enc=_derive(master, "enc", tenant),
                          name_key=_derive(master, "name-blake3", tenant), sign_key=_derive(master, "sign", tenant))
        self._cache[(tenant, kid)] = keys
        return keys

    def to_json(self) -> str:
        return json.dumps({"current": self.current,
                           "keys": {k: base64.b64encode(v).decode() for k, v in sorted(self._keys.items())}},
                          indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "store keyring") -> KeyRing:
        try:
            body = json.loads(text)
            keys = {str(k): base64.b64decode(v, validate=True) for k, v in body["keys"].items()}
            current = str(body["current"])
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
            raise ConfigError(f"{where}: not a keyring ({{\"current\": ID, \"keys\": {{ID: base64}}}}): {exc}") from exc
        return cls(keys, current)

    @classmethod
    def generate(cls) -> KeyRing:
        return cls({"k1": secrets.token_bytes(KEY_BYTES)}, "k1")

    def rotated(self) -> KeyRing:
        """A new current key; the old ones stay for the checkpoints written under them."""
        n = 1 + max((int(k[1:]) for k in self._keys if k[1:].isdigit() and k.startswith("k")), default=0)
        return KeyRing({**self._keys, f"k{n}": secrets.token_bytes(KEY_BYTES)}, f"k{n}")

    def without(self, key_id: str) -> KeyRing:
        if key_id == self.current:
            raise ConfigError(f"key {key_id} is the current one: rotate first")
        return KeyRing({k: v for k, v in self._keys.items() if k != key_id}, self.current)


def load_keyring(path: Path) -> KeyRing:
    """The keyring in ``path``; ConfigError when it is missing, unreadable or readable by others."""
    try:
        st = path.stat()
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the store keyring {path}: {exc.strerror or exc}; "
                          "`ferry up` creates one, `ferry keys init` makes one for a cluster") from exc
    if st.st_mode & 0o007:  # others; a group (a pod's fsGroup) may read
        raise ConfigError(f"the store keyring {path} is readable by others (mode {st.st_mode & 0o777:o}): "
                          f"chmod 600 {path}")
    return KeyRing.from_json(text, str(path))


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` as 0600 (its folder 0700), replacing it atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
