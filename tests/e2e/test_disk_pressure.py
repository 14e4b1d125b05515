"""A checkpoint that cannot fit is refused before anything freezes the job, in one line; the job
runs on and the cluster keeps answering."""

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster, start_cluster, stop_cluster
from tests.e2e.test_frozen import proc_state, workload_pid
from tests.e2e.test_resilience import COUNTER

pytestmark = [pytest.mark.e2e, pytest.mark.criu]


@pytest.fixture
def full_cluster(criu_bin: str) -> Iterator[Cluster]:
    """Nodes that must keep more free than any disk has: every checkpoint is too big."""
    c = start_cluster(Path(tempfile.mkdtemp(prefix="ferry-full-")), env={"FERRY_DISK_RESERVE": "1PiB"})
    yield c
    stop_cluster(c)


def test_a_checkpoint_that_cannot_fit_is_refused_before_the_freeze(full_cluster: Cluster) -> None:
    c = full_cluster
    job = c.json("run", "--name", "full", "--node", "node-1", "--", *COUNTER)
    c.wait_lines("full", 3)
    pid = workload_pid(c, "node-1", job["id"])
    for stop in ([], ["--stop"]):
        result = c.ferry("checkpoint", "full", *stop, check=False)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "not enough space for the checkpoint" in lines[0], result.stderr
        assert proc_state(pid) not in ("T", "t", "gone")
        status = c.json("status", "full")
        assert status["state"] == "running" and status["last_checkpoint"] is None
    assert not any((c.data_dir / "store").rglob("packs/*")), "a refused checkpoint wrote chunks"
    assert not any((c.data_dir / "store").rglob("chunks/*")), "a refused checkpoint wrote chunks"
    n = c.logs("full").count("\n")
    c.wait_lines("full", n + 5)
    c.ferry("kill", "full")
