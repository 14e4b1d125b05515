"""Finding the work a dead node service left running: a shim's restore of one incarnation."""

import json
import subprocess
import sys
import time
from pathlib import Path

from ferry.node.procs import restores_of, wait_for_restores_of


def test_a_restore_still_running_is_waited_for_and_an_older_shim_json_does_not_count(tmp_path: Path) -> None:
    job = tmp_path / "job-1"
    job.mkdir()
    old = {"shim_pid": 1, "pid": 1, "incarnation": 1, "started": 0.0, "mode": "launch"}
    (job / "shim.json").write_text(json.dumps(old))  # from an earlier run of the job on this node
    # a stand-in with a shim restore's command line
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "ferry.criu.shim", "restore",
                             "--job-dir", str(job), "--incarnation", "2"])
    try:
        deadline = time.monotonic() + 10
        while not restores_of(job, 2):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert restores_of(job, 3) == []
        assert not wait_for_restores_of(job, 2, timeout_s=0.5)
        (job / "shim.json").write_text(json.dumps({**old, "incarnation": 2}))  # it restored
        assert wait_for_restores_of(job, 2, timeout_s=0.5)
    finally:
        proc.kill()
        proc.wait()
    assert wait_for_restores_of(job, 3, timeout_s=0.5)  # nothing restores incarnation 3
