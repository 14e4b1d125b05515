"""The checkpointer's settled job folders (ferry.checkpointer.settled): a folder whose job ended and
was reported is skipped by the scans until something in it changes, and never while it is fresh."""

import os
import time
from pathlib import Path

import pytest

from ferry.checkpointer.settled import FRESH_S, SettledDirs
from ferry.criu.inotify import IN_Q_OVERFLOW, Event, Inotify


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


def settled_folders(root: Path, count: int) -> tuple[SettledDirs, list[Path]]:
    dirs = SettledDirs(root)
    folders = []
    for i in range(count):
        folder = root / f"job-{i:03d}"
        folder.mkdir()
        (folder / "exit.json").write_text("{}")
        age(folder, FRESH_S + 1)
        folders.append(folder)
    assert len(list(dirs.unsettled())) == count
    for folder in folders:
        dirs.settle(folder)
    return dirs, folders


def test_a_look_at_settled_folders_reads_none_of_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a look costs does not grow with the folders that settled: it reads what the watches
    saw change, and neither lists the jobs folder nor looks at any settled folder."""
    dirs, folders = settled_folders(tmp_path, 50)
    assert len(dirs) == 50 and list(dirs.unsettled()) == []
    looked: list[str] = []
    real_scandir, real_stat = os.scandir, Path.stat

    def scandir(path: Path) -> object:
        looked.append(str(path))
        return real_scandir(path)

    def stat(self: Path, **kw: bool) -> os.stat_result:
        looked.append(str(self))
        return real_stat(self, **kw)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "stat", stat)
    (tmp_path / "job-new").mkdir()  # a job that starts here
    tmp = folders[7] / "exit.json.tmp"
    tmp.write_text("{}")
    tmp.rename(folders[7] / "exit.json")  # a record written by rename: a restore ended there
    assert [p.name for p in dirs.unsettled()] == ["job-007", "job-new"]
    assert looked == []
    (folders[3] / "exit.json").unlink()
    folders[3].rmdir()
    assert [p.name for p in dirs.unsettled()] == ["job-007", "job-new"] and len(dirs) == 48


def test_changes_that_went_unseen_unsettle_every_folder(tmp_path: Path) -> None:
    dirs, _ = settled_folders(tmp_path, 5)
    assert list(dirs.unsettled()) == []
    dirs._apply(Event(-1, IN_Q_OVERFLOW))  # the kernel's queue overflowed
    assert len(list(dirs.unsettled())) == 5 and len(dirs) == 0


def test_the_jobs_folder_made_later_or_made_again_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    dirs = SettledDirs(root)
    assert list(dirs.unsettled()) == []
    root.mkdir()
    (root / "job-a").mkdir()
    assert [p.name for p in dirs.unsettled()] == ["job-a"]
    (root / "job-a").rmdir()
    root.rmdir()
    assert list(dirs.unsettled()) == []
    root.mkdir()
    (root / "job-b").mkdir()
    assert [p.name for p in dirs.unsettled()] == ["job-b"]
    dirs.close()


def test_without_inotify_nothing_settles_and_every_folder_is_read(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> Inotify:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(Inotify, "open", staticmethod(refused))
    dirs, _ = settled_folders(tmp_path, 3)
    assert len(dirs) == 0 and len(list(dirs.unsettled())) == 3
