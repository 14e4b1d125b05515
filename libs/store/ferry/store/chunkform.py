"""How one tenant's chunks are named and stored.

Plain form (a store without keys; tests and tools): named by sha256, stored as the codec's form
(header 0 raw or 1 zstd). Sealed form (every store Ferry's services open): named by the tenant's
keyed hash, stored as header 2, the codec's header (0 raw, 1 zstd), a nonce and the AES-256-GCM of
the codec's payload, with the name and both headers as associated data.
A sealed store refuses plain chunks and a plain one sealed chunks: one cannot stand in for the
other.
"""

from __future__ import annotations

import hashlib

from ferry.store.codec import ChunkCodec, UndecodableChunk
from ferry.store.keys import SealBroken, TenantKeys

SEALED = 2


class ChunkForm:
    """Names, encodes and decodes the chunks of one tenant; safe to share between threads."""

    def __init__(self, codec: ChunkCodec, keys: TenantKeys | None = None) -> None:
        self.codec = codec
        self.keys = keys

    @property
    def sealed(self) -> bool:
        return self.keys is not None

    def name(self, plain: memoryview | bytes) -> str:
        return self.keys.chunk_name(plain) if self.keys else hashlib.sha256(plain).hexdigest()

    def encode(self, name: str, plain: memoryview) -> bytes:
        if self.keys is None:
            return self.codec.encode(plain)
        header, payload = self.codec.pack(plain)
        return self.keys.seal(name, payload, prefix=bytes([SEALED, header]))

    def decode(self, name: str, stored: bytes | memoryview, size: int) -> memoryview:
        """The plain bytes of chunk ``name``; UndecodableChunk when they are not that chunk."""
        view = memoryview(stored)
        if not view:
            raise UndecodableChunk("empty object")
        if self.keys is None:
            if view[0] == SEALED:
                raise UndecodableChunk("sealed chunk, and this store was opened without keys")
            plain = self.codec.decode(stored, size)
            if hashlib.sha256(plain).hexdigest() != name:
                raise UndecodableChunk("hash mismatch")
            return plain
        if view[0] != SEALED or len(view) < 2:
            raise UndecodableChunk("not sealed, in a store whose chunks all are")
        try:
            payload = self.keys.open(name, view[2:], prefix=bytes(view[:2]))
        except SealBroken as exc:
            raise UndecodableChunk(str(exc)) from exc
        return self.codec.unpack(view[1], memoryview(payload), size)  # authenticated under this name
