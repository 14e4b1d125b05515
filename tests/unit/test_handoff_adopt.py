"""The pure parts of `--here` and `ferry adopt`: which offer a caller takes, and what counts as
Ferry's own process."""

from __future__ import annotations

import os
from pathlib import Path

from ferry.criu.handoff import Handoff, find_offer
from ferry.criu.jobdir import JobDir, write_json_atomic
from ferry.node.adopt import adopt_problem, is_ferry_process, stdio_pipes


def offer(jobs: Path, job_id: str, name: str, incarnation: int) -> None:
    jd = JobDir(jobs / job_id).create()
    write_json_atomic(jd.path / "handoff.json", Handoff(job=name, incarnation=incarnation, mode="launch",
                                                         argv=["python", "-m", "ferry.criu.shim"]))


def test_a_caller_takes_only_the_offer_for_its_job_above_the_incarnation_it_saw(tmp_path: Path) -> None:
    offer(tmp_path, "job-a", "train", 3)
    offer(tmp_path, "job-b", "other", 9)
    assert find_offer(tmp_path, "train", newer_than=3) is None  # an offer it already ran
    found = find_offer(tmp_path, "train", newer_than=2)
    assert found is not None and found[0].path.name == "job-a" and found[1].incarnation == 3
    assert find_offer(tmp_path, "nobody", newer_than=-1) is None
    (tmp_path / "job-c").mkdir()
    (tmp_path / "job-c" / "handoff.json").write_text("{not json")  # foreign or torn: ignored
    assert find_offer(tmp_path, "train", newer_than=2) is not None


def test_ferry_processes_are_known_by_their_command_line() -> None:
    assert is_ferry_process(["/opt/ferry/.venv/bin/python", "-m", "ferry.criu.shim", "launch"])
    assert is_ferry_process(["/usr/bin/python3", "-m", "ferry.checkpointer"])
    # a job's monitor forked by the node's zygote (ferry.criu.zygote) is Ferry's too
    assert is_ferry_process(["/usr/bin/python3", "-m", "ferry.criu.zygote_server", "--socket", "/x/zygote.sock"])
    assert is_ferry_process(["/opt/ferry/.venv/bin/ferry", "up"])
    assert not is_ferry_process(["python", "train.py", "--ferry"])
    assert not is_ferry_process(["/usr/bin/sleep", "100"])


def test_adopting_init_this_process_or_nothing_is_refused() -> None:
    assert "1 is this machine's init" in (adopt_problem(1) or "")
    assert "this command or one of its parents" in (adopt_problem(os.getpid(), callers={os.getpid()}) or "")
    assert "no process" in (adopt_problem(1 << 22) or "")


def test_the_pipes_a_process_writes_to_are_named_as_criu_names_them() -> None:
    r, w = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        pipes = stdio_pipes(os.getpid())
    finally:
        os.dup2(saved, 1)
        for fd in (r, w, saved):
            os.close(fd)
    assert pipes.get("stdout", "").startswith("pipe:[")


def test_a_here_command_must_run_as_the_user_the_node_services_run_as(tmp_path: Path) -> None:
    """`--here` runs the node's shim, which reads the node's job folders and runs CRIU: a caller of
    another uid is refused in one line before anything starts (a SLURM task then runs the program
    without Ferry)."""
    import argparse
    import types

    import pytest

    from ferry.cli.here import _prepare
    from ferry.common.errors import UsageError

    node = tmp_path / "nodes" / "node-1"
    (node / "jobs").mkdir(parents=True)

    class Client:
        stub = types.SimpleNamespace(ListNodes=None)

        def call(self, method: object, request: object) -> object:
            return types.SimpleNamespace(nodes=[types.SimpleNamespace(id="node-1", address=str(node))])

    args = argparse.Namespace(node="node-1", cgroup=None)
    assert _prepare(Client(), args) == node / "jobs"  # type: ignore[arg-type]
    os.chown(node, 65534, 65534)
    with pytest.raises(UsageError, match="node node-1's services run as uid 65534, this command as uid 0"):
        _prepare(Client(), args)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no node 'node-2' has joined"):
        _prepare(Client(), argparse.Namespace(node="node-2", cgroup=None))  # type: ignore[arg-type]
