"""Manifest models, canonical encoding with digest, and refusal of anything that does not verify."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from ferry.common.errors import UsageError
from ferry.store.errors import ManifestCorrupt
from ferry.store.manifest import (
    ChunkRef,
    FileEntry,
    Manifest,
    chunk_key,
    decode_manifest,
    encode_manifest,
    manifest_key,
)

H1, H2 = "a" * 64, "b" * 64


def _manifest() -> Manifest:
    return Manifest(
        job="job-1",
        checkpoint="ck-2",
        parent="ck-1",
        created=1700000000.25,
        files=[
            FileEntry(
                path="pages-1.img",
                size=300,
                mode=0o600,
                chunks=[ChunkRef(hash=H1, size=100), ChunkRef(hash=H2, size=200)],
            ),
            FileEntry(path="sub/empty", size=0, mode=0o644, chunks=[]),
            FileEntry(path="again.img", size=100, mode=0o600, chunks=[ChunkRef(hash=H1, size=100)]),
        ],
        meta={"criu": "4.1.1", "note": "é"},
    )


def _with_digest(body: dict[str, Any]) -> bytes:
    body = {k: v for k, v in body.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["digest"] = hashlib.sha256(canonical).hexdigest()
    return json.dumps(body).encode()


def test_roundtrip_and_properties() -> None:
    m = _manifest()
    data = encode_manifest(m)
    assert decode_manifest(data, "ck-2") == m
    assert encode_manifest(decode_manifest(data, "ck-2")) == data  # canonical
    assert m.bytes_logical == 400
    assert m.chunk_hashes() == {H1, H2}
    assert json.loads(data)["version"] == 1
    data.decode("ascii")


def test_digest_covers_everything_but_itself() -> None:
    body = json.loads(encode_manifest(_manifest()))
    digest = body.pop("digest")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest() == digest
    # formatting does not matter, content does
    assert decode_manifest(json.dumps({**body, "digest": digest}, indent=2).encode(), "ck-2") == _manifest()


def test_tampering_is_detected() -> None:
    body = json.loads(encode_manifest(_manifest()))
    body["files"][0]["size"] = 301
    with pytest.raises(ManifestCorrupt, match="digest mismatch") as info:
        decode_manifest(json.dumps(body).encode(), "ck-2")
    assert info.value.checkpoint == "ck-2"
    assert "restore another checkpoint" in str(info.value)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"job": "x"}', "no digest"),
    ],
)
def test_garbage_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ManifestCorrupt, match=reason):
        decode_manifest(data, "ck-2")


def test_wrong_checkpoint_is_refused() -> None:
    with pytest.raises(ManifestCorrupt, match="describes checkpoint ck-2"):
        decode_manifest(encode_manifest(_manifest()), "ck-3")


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", "a/.", "", "a/\0b", "sub/.."])
def test_paths_outside_the_restore_dir_are_refused(path: str) -> None:
    body = json.loads(encode_manifest(_manifest()))
    body["files"][1]["path"] = path
    with pytest.raises(ManifestCorrupt, match=r"files\.1\.path"):
        decode_manifest(_with_digest(body), "ck-2")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda b: b["files"][0].update(size=299), "chunks hold 300 bytes"),
        (lambda b: b["files"][2].update(path="pages-1.img"), "listed twice"),
        (lambda b: b["files"][1].update(path="again.img/x"), "lies under the file again.img"),
        (lambda b: b["files"][0].update(mode=0o4755), "mode"),
        (lambda b: b["files"][0]["chunks"][0].update(hash="XYZ"), "hash"),
        (lambda b: b["files"][0]["chunks"][0].update(size=0), "size"),
        (lambda b: b.update(version=2), "version 2 is not supported"),
        (lambda b: b.update(job="../x"), "job"),
        (lambda b: b.update(surprise=1), "surprise"),
    ],
)
def test_invalid_content_is_refused(change: Any, match: str) -> None:
    body = json.loads(encode_manifest(_manifest()))
    change(body)
    with pytest.raises(ManifestCorrupt, match=match):
        decode_manifest(_with_digest(body), "ck-2")


def test_keys() -> None:
    assert manifest_key("job-1", "ck-2") == "manifests/job-1/ck-2.json"
    assert chunk_key(H1) == f"chunks/{H1}"
    for job, checkpoint in [("a/b", "c"), ("..", "c"), ("j", ""), ("j", "x y")]:
        with pytest.raises(UsageError):
            manifest_key(job, checkpoint)
