"""Ferry's checkpoint store: content-addressed, compressed chunks and manifests written last.

The public names are re-exported here; modules hold one concept each (``chunking``, ``manifest``,
``codec``, ``backend``/``local``/``s3``/``url``, ``writer``, ``reader``, ``gc``, ``leases``).
"""

from ferry.store.backend import Backend, SizedListing
from ferry.store.chunking import FILE_CHUNK, PAGE_CHUNK, fixed_spans, page_spans
from ferry.store.errors import BackendUnavailable, ChunkCorrupt, ManifestCorrupt, ObjectNotFound, StoreError
from ferry.store.gc import GcResult
from ferry.store.local import LocalBackend
from ferry.store.manifest import (
    ChunkRef,
    FileEntry,
    Manifest,
    chunk_key,
    decode_manifest,
    encode_manifest,
    manifest_key,
)
from ferry.store.s3 import S3Backend
from ferry.store.store import CheckpointStore
from ferry.store.url import open_backend
from ferry.store.writer import WriteResult

__all__ = [
    "FILE_CHUNK",
    "PAGE_CHUNK",
    "Backend",
    "BackendUnavailable",
    "CheckpointStore",
    "ChunkCorrupt",
    "ChunkRef",
    "FileEntry",
    "GcResult",
    "LocalBackend",
    "Manifest",
    "ManifestCorrupt",
    "ObjectNotFound",
    "S3Backend",
    "SizedListing",
    "StoreError",
    "WriteResult",
    "chunk_key",
    "decode_manifest",
    "encode_manifest",
    "fixed_spans",
    "manifest_key",
    "open_backend",
    "page_spans",
]
