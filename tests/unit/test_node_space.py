"""Whether a checkpoint fits, asked before the job is frozen (ferry.node.space)."""

import os
from pathlib import Path

from ferry.node.space import free_bytes, space_problem, tree_rss


def test_a_checkpoint_that_cannot_fit_is_named_with_what_to_do(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    assert free > 0
    assert space_problem(1 << 20, {"scratch folder": tmp_path}, reserve=0) is None
    problem = space_problem(1 << 20, {"scratch folder": tmp_path, "store": tmp_path / "not" / "yet"},
                            reserve=free)
    assert problem is not None and "\n" not in problem
    assert problem.startswith("not enough space for the checkpoint: it needs up to 1.0 MiB in the scratch folder")
    assert "FERRY_DISK_RESERVE" in problem


def test_the_tree_rss_counts_this_process() -> None:
    assert tree_rss(os.getpid()) > 10 << 20  # a Python with pytest loaded
    assert tree_rss(2**22 + 12345) == 0  # no such process
