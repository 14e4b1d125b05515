"""Stored chunk format: header byte + raw or zstd payload, compression only where it pays."""

from __future__ import annotations

import os

import pytest
import zstandard

from ferry.store.codec import ChunkCodec, UndecodableChunk


@pytest.mark.parametrize("size", [1, 100, 64 * 1024, 1024 * 1024])
def test_random_bytes_are_stored_raw(size: int) -> None:
    plain = os.urandom(size)
    stored = ChunkCodec().encode(memoryview(plain))
    assert stored == b"\x00" + plain
    assert ChunkCodec().decode(stored, size) == plain


def test_compressible_bytes_are_compressed() -> None:
    plain = b"ferry " * 50_000
    codec = ChunkCodec(level=3)
    stored = codec.encode(memoryview(plain))
    assert stored[0] == 1 and len(stored) < len(plain) // 10
    assert codec.decode(stored, len(plain)) == plain


def test_mixed_chunk_with_enough_redundancy_is_compressed() -> None:
    plain = os.urandom(128 * 1024) + bytes(128 * 1024)
    stored = ChunkCodec().encode(memoryview(plain))
    assert stored[0] == 1 and len(stored) < len(plain) * 0.6


@pytest.mark.parametrize(
    ("stored", "size", "match"),
    [
        (b"", 1, "empty"),
        (b"\x07abc", 3, "header byte 7"),
        (b"\x00abc", 4, "3 bytes instead of 4"),
        (b"\x01not zstd", 4, "zstd"),
        (b"\x01" + zstandard.ZstdCompressor().compress(b"x" * 100), 50, "another size"),
    ],
)
def test_undecodable(stored: bytes, size: int, match: str) -> None:
    with pytest.raises(UndecodableChunk, match=match):
        ChunkCodec().decode(stored, size)
