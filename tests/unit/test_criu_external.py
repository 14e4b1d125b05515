"""CRIU's external keys for a job's output files, read from a real process's fds."""

import os
from pathlib import Path

from ferry.criu.external import dump_args, external_keys, is_external_key


def test_the_key_is_the_mount_id_and_inode_in_hex_of_an_open_file(tmp_path: Path) -> None:
    out, other, closed = tmp_path / "stdout", tmp_path / "other", tmp_path / "closed"
    for f in (out, other, closed):
        f.write_text("")
    with open(out, "a") as a, open(other, "a") as b:
        keys = external_keys(os.getpid(), [out, closed, tmp_path / "missing"])
        info = Path(f"/proc/self/fdinfo/{a.fileno()}").read_text()
        mnt = int(next(line.split()[1] for line in info.splitlines() if line.startswith("mnt_id:")))
        assert keys == {str(out): f"file[{mnt:x}:{os.stat(out).st_ino:x}]"}  # open files only
        assert b.fileno() > 0
    assert dump_args(keys) == ["--external", keys[str(out)]]
    assert dump_args({"a": "file[1:2]", "b": "file[1:2]"}) == ["--external", "file[1:2]"]


def test_a_gone_process_has_no_keys(tmp_path: Path) -> None:
    assert external_keys(2**22 + 12345, [tmp_path]) == {}


def test_is_external_key() -> None:
    assert is_external_key("file[1b:3f2]")
    assert not is_external_key("/jobs/a/file[1]") and not is_external_key("jobs/a/stdout")
