"""A store with keys: chunks sealed per tenant, manifests signed, restores capped, files private.

Each attack of the security issue on the store is a test here: reading memory from the chunks,
learning from deduplication that another tenant holds the same bytes, a forged or foreign manifest,
a size bomb, moving a chunk under another name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import shutil
import stat
from pathlib import Path

import blake3
import pytest
import zstandard

from ferry.store import manifest as manifest_module
from ferry.store.errors import ChunkCorrupt, ManifestCorrupt, ManifestRefused, RestoreRefused
from ferry.store.keys import KeyRing, TenantKeys, load_keyring, write_private
from ferry.store.local import LocalBackend
from ferry.store.manifest import (
    MAX_CHUNKS,
    Manifest,
    chunk_key,
    decode_manifest,
    encode_manifest,
    manifest_key,
    pack_key,
)
from ferry.store.packs import PACK_BYTES
from ferry.store.store import CheckpointStore

SECRET = b"sk-live-7f3a9c-THE-SECRET-THE-JOB-HOLDS"


def _job_images(root: Path, secret: bytes = SECRET, stdout: bytes = b"step 1 loss 0.5\n") -> Path:
    root.mkdir(parents=True)
    # what a dump of a process that holds a secret looks like: the secret in its pages, text around it
    (root / "pages-1.img").write_bytes((b"\0" * 4000 + secret + b"x" * 56) * 300)
    (root / "stdout").write_bytes(stdout * 100)
    return root


def _store(tmp_path: Path, ring: KeyRing | None = None, pack_bytes: int = PACK_BYTES) -> CheckpointStore:
    return CheckpointStore(LocalBackend(tmp_path / "store"), keyring=ring or KeyRing.generate(), pack_bytes=pack_bytes)


def _stored_chunks(store: CheckpointStore, manifest: Manifest) -> list[bytes]:
    """Each chunk's stored form, read from its pack (or its own object)."""
    return [store.backend.get(chunk_key(ref.hash)) if ref.pack is None
            else store.backend.get_range(pack_key(ref.pack), ref.at, ref.stored)
            for f in manifest.files for ref in f.chunks]


def _stored_objects(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in root.rglob("*") if p.is_file()]


def test_no_chunk_holds_the_memory_in_the_clear(tmp_path: Path) -> None:
    store = _store(tmp_path)
    written = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None,
                                     src_dir=_job_images(tmp_path / "a"))
    blobs = _stored_chunks(store, written.manifest)
    assert blobs and not (tmp_path / "store" / "chunks").exists()  # all in packs
    assert all(SECRET not in pack for pack in _stored_objects(tmp_path / "store" / "packs"))
    for blob in blobs:
        assert SECRET not in blob and b"loss 0.5" not in blob
        with pytest.raises(zstandard.ZstdError):  # nor compressed in the clear
            zstandard.ZstdDecompressor().decompress(blob[1:], max_output_size=1 << 22)
    plain = CheckpointStore(LocalBackend(tmp_path / "plain"))  # the same images without keys: readable
    clear = plain.write_checkpoint(job="j1", checkpoint="ck-1", parent=None, src_dir=tmp_path / "a")
    assert any(SECRET in b or SECRET in _unzstd(b) for b in _stored_chunks(plain, clear.manifest))


def _unzstd(blob: bytes) -> bytes:
    try:
        return zstandard.ZstdDecompressor().decompress(blob[1:], max_output_size=1 << 22)
    except zstandard.ZstdError:
        return b""


def test_roundtrip_and_files_are_private(tmp_path: Path) -> None:
    store = _store(tmp_path)
    src = _job_images(tmp_path / "a")
    store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None, src_dir=src)
    manifest = store.read_manifest("j1", "ck-1", "acme")
    assert manifest.tenant == "acme" and manifest.key_id == "k1"
    store.restore_files(manifest, tmp_path / "out")
    assert (tmp_path / "out" / "pages-1.img").read_bytes() == (src / "pages-1.img").read_bytes()
    for p in [tmp_path / "store", *(tmp_path / "store").rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


def test_deduplication_never_spans_tenants(tmp_path: Path) -> None:
    store = _store(tmp_path)
    src = _job_images(tmp_path / "a")
    first = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None, src_dir=src)
    again = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-2", parent="ck-1", src_dir=src)
    other = store.write_checkpoint(job="j2", tenant="globex", checkpoint="ck-1", parent=None, src_dir=src)
    assert first.chunks_new > 0 and again.chunks_new == 0  # within a tenant: deduplicated
    assert other.chunks_new == first.chunks_new  # another tenant's same bytes: new names, new chunks
    assert not first.manifest.chunk_hashes() & other.manifest.chunk_hashes()


def test_a_forged_manifest_is_refused(tmp_path: Path) -> None:
    """The attack: point the job's stdout at the attacker's chunk, fix up the digest."""
    store = _store(tmp_path)
    store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None, src_dir=_job_images(tmp_path / "a"))
    store.write_checkpoint(job="evil", tenant="acme", checkpoint="ck-1", parent=None,
                           src_dir=_job_images(tmp_path / "b", b"ATTACKER", b"ATTACKER TEXT\n"))
    key = manifest_key("j1", "ck-1")
    body = json.loads(store.backend.get(key))
    evil = json.loads(store.backend.get(manifest_key("evil", "ck-1")))
    body["files"][1]["chunks"] = evil["files"][1]["chunks"]
    body["files"][1]["size"] = evil["files"][1]["size"]
    del body["digest"]
    signature = body.pop("signature")
    from ferry.store.manifest import Manifest

    forged = Manifest.model_validate(body)
    assert forged != store.read_manifest("j1", "ck-1", "acme")
    store.backend.put(key, encode_manifest(forged))  # a valid digest, no signature
    with pytest.raises(ManifestRefused, match="ck-1: manifest refused: it is not signed"):
        store.read_manifest("j1", "ck-1", "acme")
    resigned = json.loads(encode_manifest(forged))
    resigned["signature"] = signature  # the old signature over the new body
    store.backend.put(key, json.dumps(resigned, sort_keys=True, separators=(",", ":")).encode())
    with pytest.raises(ManifestRefused, match="does not verify for tenant acme"):
        store.read_manifest("j1", "ck-1", "acme")


def test_another_tenants_manifest_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write_checkpoint(job="j1", tenant="globex", checkpoint="ck-1", parent=None,
                           src_dir=_job_images(tmp_path / "a"))
    with pytest.raises(ManifestRefused, match="belongs to tenant globex, not acme"):
        store.read_manifest("j1", "ck-1", "acme")
    body = json.loads(store.backend.get(manifest_key("j1", "ck-1")))
    body["tenant"] = "acme"  # claiming it, under globex's signature
    store.backend.put(manifest_key("j1", "ck-1"), json.dumps(body).encode())
    with pytest.raises(Exception, match="ck-1"):
        store.read_manifest("j1", "ck-1", "acme")


def test_a_chunk_moved_under_another_name_fails_its_seal(tmp_path: Path) -> None:
    """Each chunk on its own, where one can be copied over another (a seal is bound to its name
    whatever the layout; a pack's chunks are sealed the same way)."""
    store = _store(tmp_path, pack_bytes=0)
    result = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None,
                                    src_dir=_job_images(tmp_path / "a"))
    pages, stdout = (f.chunks[0].hash for f in result.manifest.files)
    store.backend.put(chunk_key(stdout), store.backend.get(chunk_key(pages)))
    with pytest.raises(ChunkCorrupt, match="does not open"):
        store.restore_files(store.read_manifest("j1", "ck-1", "acme"), tmp_path / "out")


def test_a_size_bomb_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small manifest that references one chunk many times declares its full size: the restore
    compares that with the free space (and the recorded size) before it creates a file."""
    store = _store(tmp_path)
    result = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None,
                                    src_dir=_job_images(tmp_path / "a"))
    manifest = result.manifest
    with pytest.raises(RestoreRefused, match="more than the 100 recorded"):
        store.restore_files(manifest, tmp_path / "out", max_bytes=100)

    class Tiny:
        free = 1 << 20

    monkeypatch.setattr(shutil, "disk_usage", lambda path: Tiny())
    with pytest.raises(RestoreRefused, match=r"needs 1 MiB.*free some space"):
        store.restore_files(manifest, tmp_path / "out", reserve=512 << 10)
    assert not (tmp_path / "out").exists()
    assert MAX_CHUNKS == 4_000_000  # 1 TiB in 256 KiB chunks; lowered here to keep the test fast
    monkeypatch.setattr(manifest_module, "MAX_CHUNKS", 1000)
    bomb = manifest.model_dump()
    bomb["files"][0]["chunks"] = bomb["files"][0]["chunks"][:1] * 1001
    bomb["files"][0]["size"] = bomb["files"][0]["chunks"][0]["size"] * 1001
    bomb.pop("key_id")
    bomb["digest"] = hashlib.sha256(json.dumps(bomb, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    with pytest.raises(ManifestCorrupt, match="more than 1000 chunks"):
        decode_manifest(json.dumps(bomb).encode(), "ck-1")


def test_rotation_keeps_old_checkpoints_restorable(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    store = _store(tmp_path, ring)
    src = _job_images(tmp_path / "a")
    store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None, src_dir=src)
    rotated = ring.rotated()
    after = _store(tmp_path, rotated)
    second = after.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-2", parent="ck-1", src_dir=src)
    assert second.manifest.key_id == "k2" and second.chunks_new > 0
    after.restore_files(after.read_manifest("j1", "ck-1", "acme"), tmp_path / "old")
    assert (tmp_path / "old" / "stdout").read_bytes() == (src / "stdout").read_bytes()
    dropped = _store(tmp_path, rotated.without("k1"))
    with pytest.raises(ManifestRefused, match="key 'k1', which the keyring does not hold"):
        dropped.read_manifest("j1", "ck-1", "acme")


def test_chunks_are_named_by_keyed_blake3(tmp_path: Path) -> None:
    ring = KeyRing.generate()
    store = _store(tmp_path, ring)
    src = _job_images(tmp_path / "a")
    written = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None, src_dir=src)
    keys = ring.tenant("acme")
    data = (src / "stdout").read_bytes()
    [ref] = written.manifest.files[[f.path for f in written.manifest.files].index("stdout")].chunks
    assert ref.hash == blake3.blake3(data, key=keys.name_key).hexdigest()
    assert ref.hash != blake3.blake3(data).hexdigest() != hashlib.sha256(data).hexdigest()  # keyed, not plain


def test_chunks_named_by_the_hmac_before_still_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store written before the names became BLAKE3 (HMAC-SHA256 under another derived key):
    its checkpoints restore, and the next one (whose names differ) stores its chunks anew."""
    ring = KeyRing.generate()
    src = _job_images(tmp_path / "a")
    with monkeypatch.context() as m:
        m.setattr(TenantKeys, "chunk_name",
                  lambda self, plain: hmac.new(self.sign_key, plain, hashlib.sha256).hexdigest())
        old = _store(tmp_path, ring).write_checkpoint(job="j1", tenant="acme", checkpoint="ck-1", parent=None,
                                                      src_dir=src)
    store = _store(tmp_path, ring)
    store.restore_files(store.read_manifest("j1", "ck-1", "acme"), tmp_path / "old")
    assert (tmp_path / "old" / "pages-1.img").read_bytes() == (src / "pages-1.img").read_bytes()
    new = store.write_checkpoint(job="j1", tenant="acme", checkpoint="ck-2", parent="ck-1", src_dir=src)
    assert new.chunks_new == old.chunks_new and not new.manifest.chunk_hashes() & old.manifest.chunk_hashes()
    store.restore_files(store.read_manifest("j1", "ck-2", "acme"), tmp_path / "new")
    assert (tmp_path / "new" / "pages-1.img").read_bytes() == (src / "pages-1.img").read_bytes()


def test_a_keyring_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "store.keys"
    write_private(path, KeyRing.generate().to_json())
    assert load_keyring(path).current == "k1"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    with pytest.raises(Exception, match=r"readable by others.*chmod 600"):
        load_keyring(path)
