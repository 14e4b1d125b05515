"""OCI containers as jobs (issue 12): `ferry run --bundle` and `--image` run with Debian's runc.
Checkpoints go through `runc checkpoint` (CRIU with the nftables lock), the container's writable
layer travels with them, and a move or a restore on another node continues the container where
it was: its count never restarts and the file it appends to in its own root filesystem holds
every line at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Cluster, wait_until
from tests.e2e.test_errors import one_line_error
from tests.oci import archive, make_bundle, make_image

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

COUNT = 300
# counts, appending each number to a file of its root filesystem; at the end, how many that file holds
SCRIPT = (f"i=0; while [ $i -lt {COUNT} ]; do echo $i; echo $i >> /data/log; i=$((i+1)); sleep 0.02; done; "
          "echo lines $(wc -l < /data/log)")
WANT = "".join(f"{n}\n" for n in range(COUNT)) + f"lines {COUNT}\n"


def lines(c: Cluster, job: str) -> int:
    return c.ferry("logs", job, check=False).stdout.count("\n")


def test_a_bundle_checkpoints_and_moves_with_its_writable_layer(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    bundle = make_bundle(tmp_path / "bundle")
    c.json("run", "--name", "box", "--bundle", str(bundle), "--node", "node-1", "--", "sh", "-c", SCRIPT)
    wait_until(lambda: lines(c, "box") >= 30, 60, "output of the container")
    c.json("checkpoint", "box")
    refused = one_line_error(c.ferry("migrate", "box", "--to", "node-2", "--live", check=False), 1)
    assert "live moves of containers are not built" in refused, refused
    c.json("migrate", "box", "--to", "node-2")
    assert c.json("status", "box")["node"] == "node-2"
    assert c.ferry("wait", "box", "--timeout", "120").returncode == 0
    assert c.logs("box") == WANT, "the count restarted or repeated, or the writable layer stayed behind"
    assert not (bundle / "rootfs" / "data" / "log").exists(), "the container wrote into the user's bundle"


def test_an_image_archive_runs_and_a_stopped_container_restores_elsewhere(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    image = archive(make_image(tmp_path / "layout"), tmp_path / "app.tar")
    c.json("run", "--name", "img", "--image", f"oci-archive:{image}", "--node", "node-2", "--", "sh", "-c", SCRIPT)
    wait_until(lambda: lines(c, "img") >= 30, 60, "output of the container")
    assert c.json("checkpoint", "img", "--stop")["final"]
    assert c.json("status", "img")["state"] == "preempted"
    c.json("restore", "img", "--node", "node-1")
    assert c.ferry("wait", "img", "--timeout", "120").returncode == 0
    assert c.logs("img") == WANT


def test_bad_containers_are_refused_before_anything_starts(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    layout = make_image(tmp_path / "layout")
    cases = [(["--bundle", str(tmp_path / "empty")], "not an OCI bundle (no config.json)"),
             (["--bundle", str(tmp_path / "nope")], "no such folder"),
             (["--image", f"oci:{tmp_path / 'nope'}"], "does not exist"),
             (["--image", f"oci:{tmp_path / 'empty'}"], "not an OCI image layout"),
             (["--image", f"oci:{layout}:v9"], "no tag 'v9'"),
             (["--image", "docker.io/library/busybox"], "oci:/LAYOUT_DIR"),
             (["--image", f"oci:{layout}", "--bundle", str(tmp_path / "empty")], "not both")]
    for args, says in cases:
        line = one_line_error(cluster.ferry("run", "--name", "box-bad", *args, "--", "sh", check=False), 2)
        assert says in line, (args, line)
    assert "box-bad" not in {j["name"] for j in cluster.json("ps", "-a")}
