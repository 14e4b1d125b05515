"""The chaos suite's short seeded version: random faults over two job lifecycles of the shared
workloads on a real cluster; every job must finish with the output of an uninterrupted run, never
run twice, and leave nothing behind (bench/chaos.py has the full run and its figures)."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PY, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.criu, pytest.mark.timeout(900)]


def test_a_short_seeded_chaos_run_loses_duplicates_and_strands_nothing(tmp_path: Path, criu_bin: str) -> None:
    report_path = tmp_path / "chaos.json"
    run = subprocess.run([PY, str(ROOT / "bench" / "chaos.py"), "--faults", "5", "--jobs", "2", "--seed", "11",
                          "--json", str(report_path)], capture_output=True, text=True, timeout=840)
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert sum(report["by_kind"].values()) == 5
    assert report["counts"] == {"lost": 0, "duplicated": 0, "stuck": 0, "corrupt": 0}, run.stdout[-4000:]
    assert [j["verdict"] for j in report["results"]] == ["ok", "ok"]
    assert run.returncode == 0
