"""A job's environment, sealed from the moment the API takes it until the node starts the workload.

``--env`` values (and ``--secret NAME=@file`` contents) are often credentials. The API seals them
to the nodes' public key (X25519, HKDF-SHA256, AES-256-GCM; a fresh key pair per seal), so the
KV buckets, events, ``ferry status`` and anyone else reading the bus see only the names. Only a
node's checkpointer holds the private key and opens them, just before it starts the workload.
The tenant is bound into the seal: a sealed environment copied into another tenant's job does not
open.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ferry.common.errors import ConfigError, FerryError

# cryptography loads in the functions that use it: every record imports SealedEnv, the CLI among
# them, and its start-up is a round trip users wait for.


class SealError(FerryError):
    """A sealed environment that does not open here (another cluster's key, another tenant, altered)."""


class SealedEnv(BaseModel):
    """What the bus and the records hold of a job's environment: its names, and the sealed values."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    names: list[str] = Field(default_factory=list)
    sealed: str = ""  # base64 of ephemeral public key (32) + nonce (12) + AES-GCM of the JSON; "" when empty

    @property
    def empty(self) -> bool:
        return not self.names


def _key(shared: bytes, tenant: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"ferry env v1", info=tenant.encode()).derive(shared)


def seal_env(env: dict[str, str], public_key: bytes, tenant: str) -> SealedEnv:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not env:
        return SealedEnv()
    raw = serialization.Encoding.Raw
    ephemeral = X25519PrivateKey.generate()
    key = _key(ephemeral.exchange(X25519PublicKey.from_public_bytes(public_key)), tenant)
    nonce = ephemeral.public_key().public_bytes(raw, serialization.PublicFormat.Raw)[:12]
    body = AESGCM(key).encrypt(nonce, json.dumps(env, sort_keys=True).encode(), tenant.encode())
    blob = ephemeral.public_key().public_bytes(raw, serialization.PublicFormat.Raw) + body
    return SealedEnv(names=sorted(env), sealed=base64.b64encode(blob).decode())


def open_env(env: SealedEnv, private_key: bytes, tenant: str) -> dict[str, str]:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not env.sealed:
        return {}
    try:
        blob = base64.b64decode(env.sealed, validate=True)
        peer = X25519PublicKey.from_public_bytes(blob[:32])
        key = _key(X25519PrivateKey.from_private_bytes(private_key).exchange(peer), tenant)
        values = json.loads(AESGCM(key).decrypt(blob[:12], blob[32:], tenant.encode()))
    except (ValueError, binascii.Error, InvalidTag) as exc:
        raise SealError(f"the job's environment does not open with this node's key (tenant {tenant}): "
                        "sealed for another cluster or tenant, or altered") from exc
    if not isinstance(values, dict) or sorted(values) != env.names:
        raise SealError("the job's sealed environment does not match its variable names")
    return {str(k): str(v) for k, v in values.items()}


def new_key_pair() -> tuple[bytes, bytes]:
    """(private, public) raw X25519 keys."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    raw = serialization.Encoding.Raw
    private = X25519PrivateKey.generate()
    return (private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
            private.public_key().public_bytes(raw, serialization.PublicFormat.Raw))


def encode_key(raw: bytes) -> str:
    return base64.b64encode(raw).decode() + "\n"


def read_key(path: Path, *, private: bool) -> bytes:
    """A base64 key file (32 bytes); a private one must not be readable by others."""
    try:
        st = path.stat()
        raw = base64.b64decode(path.read_text().strip(), validate=True)
    except OSError as exc:
        raise ConfigError(f"cannot read the environment sealing key {path}: {exc.strerror or exc}; "
                          "`ferry up` makes one, `ferry keys init` makes one for a cluster") from exc
    except (ValueError, binascii.Error) as exc:
        raise ConfigError(f"{path} holds no base64 key") from exc
    if len(raw) != 32:
        raise ConfigError(f"{path}: a key is 32 bytes, this one {len(raw)}")
    if private and st.st_mode & 0o007:  # others; a group (a pod's fsGroup) may read
        raise ConfigError(f"{path} is readable by others: chmod 600 {path}")
    return raw
