"""Fuzzing the manifest parser (hypothesis): whatever bytes a store returns, decoding either gives
a valid manifest or raises ManifestCorrupt (ManifestRefused for a bad signature), never anything
else; and no change to a signed manifest survives its signature."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ferry.store.errors import ManifestCorrupt
from ferry.store.keys import KeyRing
from ferry.store.manifest import ChunkRef, FileEntry, Manifest, decode_manifest, encode_manifest

RING = KeyRing.generate()
KEYS = RING.tenant("acme")
BASE = Manifest(job="j1", checkpoint="ck-1", parent=None, created=1.0, tenant="acme", key_id=KEYS.key_id,
                files=[FileEntry(path="pages-1.img", size=8192, mode=0o600,
                                 chunks=[ChunkRef(hash="a" * 64, size=4096), ChunkRef(hash="b" * 64, size=4096)]),
                       FileEntry(path="logs/stdout", size=0, mode=0o644, chunks=[])],
                meta={"record": {"x": 1}})
SIGNED = encode_manifest(BASE, KEYS)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)


def _decode(data: bytes, keyring: KeyRing | None) -> Manifest | None:
    try:
        return decode_manifest(data, "ck-1", keyring, "acme" if keyring else None)
    except ManifestCorrupt:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_are_refused_cleanly(data: bytes) -> None:
    assert _decode(data, None) is None or data == SIGNED
    assert _decode(data, RING) is None or data == SIGNED


def _set(body: dict[str, Any], path: list[Any], value: Any) -> None:
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


PATHS = [["job"], ["checkpoint"], ["parent"], ["created"], ["tenant"], ["key_id"], ["version"], ["meta"],
         ["files", 0, "path"], ["files", 0, "size"], ["files", 0, "mode"], ["files", 0, "chunks", 0, "hash"],
         ["files", 0, "chunks", 0, "size"], ["files", 1, "chunks"], ["files"], ["digest"], ["signature"]]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), json_values, st.booleans())
@example(["signature"], "\x80", False)  # once raised TypeError from hmac.compare_digest
def test_a_changed_field_never_passes_the_signature(path: list[Any], value: Any, fix_digest: bool) -> None:
    body = json.loads(SIGNED)
    try:
        _set(body, path, value)
    except (TypeError, KeyError, IndexError):
        return
    if fix_digest and path[0] not in ("digest", "signature"):  # an attacker recomputes the plain digest
        import hashlib

        plain = {k: v for k, v in body.items() if k not in ("digest", "signature")}
        try:
            canonical = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                                   allow_nan=False).encode()
        except (TypeError, ValueError):
            return
        body["digest"] = hashlib.sha256(canonical).hexdigest()
    data = json.dumps(body).encode()
    decoded = _decode(data, RING)
    assert decoded is None or decoded == BASE  # only an unchanged value (the same one) passes
    _decode(data, None)  # without keys: refused or valid, never another error


def test_the_signed_manifest_itself_decodes() -> None:
    assert _decode(SIGNED, RING) == BASE
