"""Scratch space (CRIU images before upload and after fetch) is per cluster and per node."""

from pathlib import Path

from ferry.node.base import scratch_dir


def test_two_clusters_on_one_host_never_share_scratch(tmp_path: Path) -> None:
    a = scratch_dir("", tmp_path / "cluster-a" / "nodes" / "node-1", "node-1")
    b = scratch_dir("", tmp_path / "cluster-b" / "nodes" / "node-1", "node-1")
    assert a != b
    assert a.name.startswith("node-1-") and b.name.startswith("node-1-")


def test_the_services_of_one_node_agree_on_its_scratch(tmp_path: Path) -> None:
    work = tmp_path / "c" / "nodes" / "node-2"
    work.mkdir(parents=True)
    # the checkpointer and the migrator of a node compute it apart (the migrator rebuilds there)
    assert scratch_dir("", work, "node-2") == scratch_dir("", tmp_path / "c" / "nodes" / ".." / "nodes" / "node-2",
                                                          "node-2")


def test_a_configured_scratch_root_is_shared_out_per_cluster(tmp_path: Path) -> None:
    root = str(tmp_path / "scratch")
    one = scratch_dir(root, tmp_path / "x" / "node-1", "node-1")
    two = scratch_dir(root, tmp_path / "y" / "node-1", "node-1")
    assert one.parent == two.parent == Path(root) and one != two
