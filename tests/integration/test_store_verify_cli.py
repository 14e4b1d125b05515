"""`ferry store verify [--repair]` through the real CLI, on a real local store."""

import json
import random
import subprocess
from pathlib import Path
from typing import Any

from ferry.store.keys import KeyRing, write_private
from ferry.store.local import LocalBackend
from ferry.store.manifest import pack_key
from ferry.store.packs import damage_key
from ferry.store.store import CheckpointStore
from tests.conftest import BIN

MiB = 1024 * 1024


def verify(store: Path, *extra: str) -> tuple[int, Any]:
    keys = store.parent / "store.keys"
    run = subprocess.run([str(BIN / "ferry"), "store", "verify", "--store", str(store), "--key-file", str(keys),
                          "-o", "json", *extra], capture_output=True, text=True, timeout=120)
    assert run.stdout, run.stderr
    return run.returncode, json.loads(run.stdout)


def test_verify_names_what_would_not_restore_and_repair_mends_it(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    ring = KeyRing.generate()
    write_private(tmp_path / "store.keys", ring.to_json())
    store = CheckpointStore(backend, keyring=ring)
    rng = random.Random(9)
    src = tmp_path / "src"
    src.mkdir()
    (src / "pages-1.img").write_bytes(rng.randbytes(2 * MiB))
    first = store.write_checkpoint(job="j", checkpoint="ck-1", parent=None, src_dir=src)
    (src / "extra.img").write_bytes(rng.randbytes(MiB))
    second = store.write_checkpoint(job="j", checkpoint="ck-2", parent="ck-1", src_dir=src)
    code, report = verify(tmp_path / "store")
    assert code == 0 and report["ok"] and report["chunks_bad"] == 0
    assert [c["restorable"] for c in report["checkpoints"]] == [True, True]

    (victim,) = second.manifest.chunk_hashes() - first.manifest.chunk_hashes()
    (ref,) = [r for f in second.manifest.files for r in f.chunks if r.hash == victim]
    assert ref.pack is not None
    path = backend.root / pack_key(ref.pack)
    stored = bytearray(path.read_bytes())
    stored[ref.at + ref.stored - 1] ^= 0xFF  # the last byte of its seal, in its pack
    path.write_bytes(bytes(stored))
    (tmp_path / "store" / "manifests" / "j" / "ck-3.json").write_text("{not json")
    code, report = verify(tmp_path / "store")
    assert code == 1 and not report["ok"]
    by_id = {c["checkpoint"]: c for c in report["checkpoints"]}
    assert by_id["ck-1"]["restorable"] and not by_id["ck-2"]["restorable"] and not by_id["ck-3"]["restorable"]
    assert "extra.img" in by_id["ck-2"]["problem"] and "does not open" in by_id["ck-2"]["problem"]
    assert list(backend.list("damaged/")) == []  # without --repair nothing changes

    code, report = verify(tmp_path / "store", "--repair")
    assert code == 1 and report["quarantined"] == 1 and report["gc_error"]  # ck-3 is unreadable: gc refuses
    assert backend.exists(damage_key(ref.pack, ref.at)) and backend.exists(f"quarantine/{victim}")
    # the next checkpoint holding those bytes mends ck-2
    store.write_checkpoint(job="j", checkpoint="ck-4", parent="ck-2", src_dir=src)
    (tmp_path / "store" / "manifests" / "j" / "ck-3.json").unlink()
    code, report = verify(tmp_path / "store", "--repair")
    assert code == 0 and report["ok"] and report["gc_error"] is None
    assert list(backend.list("damaged/")) == [] and list(backend.list("quarantine/")) == []


def test_verify_refuses_a_store_that_is_not_there(tmp_path: Path) -> None:
    run = subprocess.run([str(BIN / "ferry"), "store", "verify", "--store", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip().startswith("ferry: no store at")
