"""The setup on a machine that has nothing yet: its CRIU step builds into an empty source folder, and
its failures print one line that says what to do and exit non-zero.

The CRIU build downloads Debian unstable's source and compiles it (about a minute on two cores):
this is what every fresh machine does, and CI's machine would otherwise never do it again.
"""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.criu


def _setup_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("setup:")]


def test_criu_step_downloads_and_builds_into_an_empty_folder(tmp_path: Path) -> None:
    src, prefix = tmp_path / "src", tmp_path / "prefix"
    src.mkdir()
    env = {**os.environ, "FERRY_CRIU_SRC": str(src), "FERRY_CRIU_PREFIX": str(prefix), "FERRY_CRIU_BUILD": "1"}
    run = subprocess.run([str(ROOT / "scripts" / "install-criu.sh")], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(src.glob("criu_*.orig.tar.*")), "the source tarball was not downloaded into the empty folder"
    criu = prefix / "sbin" / "criu"
    version = subprocess.run([str(criu), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"Version: (\d+)\.(\d+)", version)
    assert found and (int(found[1]), int(found[2])) >= (4, 2), version
    check = subprocess.run([str(criu), "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    # the binary it produced checkpoints a real process
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        images = tmp_path / "images"
        images.mkdir()
        dump = subprocess.run([str(criu), "dump", "-t", str(proc.pid), "-D", str(images), "--leave-running"],
                              capture_output=True, text=True)
        assert dump.returncode == 0, dump.stderr
        assert list(images.glob("pages-*.img")), sorted(p.name for p in images.iterdir())
        assert proc.poll() is None, "--leave-running must leave the process running"
    finally:
        proc.kill()
        proc.wait()


def test_criu_step_fails_with_one_line_when_the_source_folder_cannot_be_made(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {**os.environ, "FERRY_CRIU_SRC": str(blocker / "src"), "FERRY_CRIU_PREFIX": str(tmp_path / "p"),
           "FERRY_CRIU_BUILD": "1"}
    run = subprocess.run([str(ROOT / "scripts" / "install-criu.sh")], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode != 0
    lines = _setup_lines(run.stderr)
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"setup: cannot create {blocker / 'src'}") and "FERRY_CRIU_SRC" in lines[0], lines
    assert not (tmp_path / "p").exists()


def _copy_of_the_repository(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_setup_in_a_new_clone_says_which_step_failed_and_what_to_do(tmp_path: Path) -> None:
    clone = _copy_of_the_repository(tmp_path / "clone")
    assert not (clone / ".venv").exists()
    env = {**os.environ, "FERRY_PYTHON": "/bin/false"}
    started = time.monotonic()
    run = subprocess.run([str(clone / "setup.sh"), "--no-demo"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = _setup_lines(run.stderr)
    assert lines == ["setup: could not create .venv with /bin/false: install python3-venv"], run.stderr
    assert "CRIU 4." in run.stdout  # the steps before it ran
    assert time.monotonic() - started < 300


def test_setup_refuses_an_unknown_option_with_exit_2() -> None:
    run = subprocess.run([str(ROOT / "setup.sh"), "--no-dmeo"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2
    assert run.stderr.strip() == "setup: unknown option --no-dmeo (try --help)"
    assert run.stdout == ""


def test_setup_help_lists_its_options() -> None:
    run = subprocess.run([str(ROOT / "setup.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0
    for option in ("--no-demo", "--uninstall", "FERRY_CRIU_SRC"):
        assert option in run.stdout
