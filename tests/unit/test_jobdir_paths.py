"""A job folder's path is canonical (CRIU records the names the kernel gives open files): resolved,
unless the caller says it made it canonical already (then it is taken as given, without lookups)."""

from pathlib import Path

from ferry.criu.jobdir import JobDir


def test_a_job_folder_behind_a_link_is_named_by_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert JobDir(tmp_path / "link" / "job-1").path == (tmp_path / "real" / "job-1").resolve()


def test_a_path_the_caller_made_canonical_is_taken_as_given(tmp_path: Path) -> None:
    given = tmp_path / "link" / "job-1"
    assert JobDir(given, canonical=True).path == given
    assert JobDir(str(given), canonical=True).path == given
