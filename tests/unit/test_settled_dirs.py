"""The checkpointer's settled job folders (ferry.checkpointer.settled): a folder whose job ended and
was reported is skipped by the scans until something in it changes, and never while it is fresh."""

import os
import time
from pathlib import Path

from ferry.checkpointer.settled import FRESH_S, SettledDirs


def age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))


def test_a_settled_folder_is_skipped_until_it_changes(tmp_path: Path) -> None:
    dirs = SettledDirs(tmp_path)
    a, b = tmp_path / "job-a", tmp_path / "job-b"
    a.mkdir()
    b.mkdir()
    assert [p.name for p in dirs.unsettled()] == ["job-a", "job-b"]
    dirs.settle(a)  # changed a moment ago: a change in the same clock tick would go unseen, so not yet
    assert [p.name for p in dirs.unsettled()] == ["job-a", "job-b"] and len(dirs) == 0
    age(a, FRESH_S + 1)
    dirs.settle(a)
    assert [p.name for p in dirs.unsettled()] == ["job-b"]
    (a / "shim.json").write_text("{}")  # a restore of the job there
    assert [p.name for p in dirs.unsettled()] == ["job-a", "job-b"]
    age(a, FRESH_S + 1)
    dirs.settle(a)
    (a / "shim.json").unlink()
    a.rmdir()
    assert [p.name for p in dirs.unsettled()] == ["job-b"] and len(dirs) == 0  # a folder gone is forgotten


def test_no_folder_at_all_is_no_folder_to_scan(tmp_path: Path) -> None:
    assert list(SettledDirs(tmp_path / "missing").unsettled()) == []
