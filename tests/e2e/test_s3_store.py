"""The whole path with the S3 backend: a cluster whose store is a real S3 server (moto's)."""

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster
from tests.s3server import MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.criu]


@pytest.fixture(scope="module")
def s3_cluster(criu_bin: str) -> Iterator[Cluster]:
    server = MotoServer()
    server.start()
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-s3-"))
    try:
        c = start_cluster(data_dir, extra=["--store", f"s3://ferry-ckpt/e2e?endpoint={server.endpoint}&secure=0"],
                          env={"FERRY_S3_ACCESS_KEY": "testing", "FERRY_S3_SECRET_KEY": "testing"})
        yield c
        stop_cluster(c)
    finally:
        server.stop()


def test_checkpoint_to_s3_and_restore_on_the_other_node(s3_cluster: Cluster) -> None:
    argv = [PY, str(WORKLOADS / "memhog.py"), "--mib", "32", "--dirty-pct", "5", "--interval", "0.5",
            "--rounds", "30"]
    want = reference_output(argv)
    s3_cluster.json("run", "--name", "s3hog", "--node", "node-1", "--", *argv)
    s3_cluster.wait_lines("s3hog", 3)
    first = s3_cluster.json("checkpoint", "s3hog")
    second = s3_cluster.json("checkpoint", "s3hog", "--stop")
    assert first["bytes_uploaded"] > 32 * 2**20
    assert second["bytes_uploaded"] < first["bytes_uploaded"] / 2
    assert not (s3_cluster.data_dir / "store").exists(), "the local store must not be used"
    s3_cluster.json("restore", "s3hog", "--node", "node-2")
    assert s3_cluster.ferry("wait", "s3hog", "--timeout", "120").returncode == 0
    assert s3_cluster.logs("s3hog") == want
