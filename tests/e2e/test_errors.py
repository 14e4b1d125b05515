"""Bad input gets a clear one-line error and a non-zero exit, and nothing is lost."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, PY, Cluster, damage_stored, stored_places, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.criu]


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ferry: ")
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["status", "no-such-job"],
        ["checkpoint", "no-such-job"],
        ["restore", "no-such-job"],
        ["kill", "no-such-job"],
        ["logs", "no-such-job"],
        ["checkpoints", "no-such-job"],
        ["wait", "no-such-job"],
        ["migrate", "no-such-job", "--to", "node-2"],
    ],
)
def test_unknown_job_exits_2(cluster: Cluster, args: list[str]) -> None:
    line = one_line_error(cluster.ferry(*args, check=False), 2)
    assert "no-such-job" in line


def test_unknown_node_and_checkpoint_exit_2_and_change_nothing(cluster: Cluster) -> None:
    line = one_line_error(cluster.ferry("run", "--name", "nn", "--node", "node-9", "--", "true", check=False), 2)
    assert "node-9" in line
    assert "nn" not in {j["name"] for j in cluster.json("ps", "-a")}
    cluster.json("run", "--name", "victim", "--node", "node-1", "--", "sleep", "600")
    one_line_error(cluster.ferry("migrate", "victim", "--to", "node-9", check=False), 2)
    one_line_error(cluster.ferry("restore", "victim", "--checkpoint", "ck-nope", check=False), 2)
    cluster.json("checkpoint", "victim", "--stop")
    one_line_error(cluster.ferry("restore", "victim", "--node", "node-9", check=False), 2)
    one_line_error(cluster.ferry("restore", "victim", "--checkpoint", "ck-nope", check=False), 2)
    status = cluster.json("status", "victim")
    assert status["state"] == "preempted" and status["node"] == "node-1"
    cluster.json("restore", "victim", "--node", "node-2")
    assert cluster.json("status", "victim")["state"] == "running"
    cluster.ferry("kill", "victim")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--name", "empty", "--"],
        ["run", "--name", "empty"],
        ["run", "--checkpoint-every", "5x", "--", "true"],
        ["run", "--checkpoint-every", "", "--", "true"],
        ["run", "--env", "NOEQUALS", "--", "true"],
        ["run", "--cwd", "/no/such/dir", "--", "true"],
    ],
)
def test_invalid_arguments_are_refused_before_anything_starts(args: list[str], tmp_path: Path) -> None:
    # No cluster at that address: the refusal must come before any connection is tried.
    env = {**os.environ, "FERRY_ADDR": "127.0.0.1:1"}
    result = subprocess.run([str(BIN / "ferry"), *args], env=env, capture_output=True, text=True, timeout=30)
    one_line_error(result, 2)


def test_unreachable_api_says_what_to_do() -> None:
    env = {**os.environ, "FERRY_ADDR": "127.0.0.1:1"}
    result = subprocess.run([str(BIN / "ferry"), "ps"], env=env, capture_output=True, text=True, timeout=30)
    line = one_line_error(result, 1)
    assert "ferry up" in line and "FERRY_ADDR" in line


def test_command_not_found_fails_the_job_with_a_clear_error(cluster: Cluster) -> None:
    result = cluster.ferry("run", "--name", "nocmd", "--", "/no/such/program", check=False)
    line = one_line_error(result, 1)
    assert "/no/such/program" in line
    assert cluster.json("status", "nocmd")["state"] == "failed"


def test_corrupt_chunk_is_named_and_other_checkpoints_still_restore(cluster: Cluster) -> None:
    argv = [PY, "-c", "import time\nfor i in range(100000):\n print(i, flush=True); time.sleep(0.05)"]
    cluster.json("run", "--name", "corrupt", "--node", "node-1", "--", *argv)
    cluster.wait_lines("corrupt", 5)
    first = cluster.json("checkpoint", "corrupt")
    cluster.wait_lines("corrupt", 15)
    second = cluster.json("checkpoint", "corrupt", "--stop")
    store = cluster.data_dir / "store"
    job_id = second["job"]

    def chunks(ck: str) -> set[str]:
        manifest = json.loads((store / "manifests" / job_id / f"{ck}.json").read_text())
        return {c["hash"] for f in manifest["files"] for c in f["chunks"]}

    only_second = sorted(chunks(second["id"]) - chunks(first["id"]))
    assert only_second
    victim = only_second[0]
    damage_stored(stored_places(store, job_id)[victim], where=0.5)

    # named explicitly: restored or refused, never replaced (without --checkpoint the older one is used)
    line = one_line_error(cluster.ferry("restore", "corrupt", "--node", "node-2", "--checkpoint", second["id"],
                                        check=False), 1)
    assert second["id"] in line and victim[:12] in line
    status = cluster.json("status", "corrupt")
    assert status["state"] == "preempted"
    restored = cluster.json("restore", "corrupt", "--node", "node-2", "--checkpoint", first["id"])
    assert restored["state"] == "running" and restored["node"] == "node-2"
    cluster.ferry("kill", "corrupt")


def test_criu_failure_keeps_the_job_running_and_marks_the_checkpoint_failed(cluster: Cluster) -> None:
    # An established TCP connection cannot be dumped without --tcp-established: CRIU refuses.
    prog = (
        "import socket, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "c = socket.create_connection(s.getsockname()); a, _ = s.accept()\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1; print(i, flush=True); time.sleep(0.1)\n"
    )
    cluster.json("run", "--name", "tcp", "--node", "node-1", "--network", "host", "--", PY, "-c", prog)
    cluster.wait_lines("tcp", 3)
    result = cluster.ferry("checkpoint", "tcp", check=False)
    line = one_line_error(result, 1)
    assert "criu dump" in line and "Error (criu/" in line  # CRIU's own log lines say why
    status = cluster.json("status", "tcp")
    assert status["state"] == "running"
    before = cluster.logs("tcp").count("\n")
    cluster.wait_lines("tcp", before + 5)  # still making progress
    records = cluster.json("checkpoints", "tcp")
    assert [r["state"] for r in records] == ["failed"]
    assert records[0]["log_excerpt"], "the failed record carries CRIU's log lines"
    assert status["last_checkpoint"] is None
    cluster.ferry("kill", "tcp")


def test_node_without_usable_criu_is_reported_and_not_chosen(cluster: Cluster, tmp_path: Path) -> None:
    # a node joins: its NATS users first (`ferry up` loads them into its NATS server at once)
    cluster.ferry("keys", "add-node", "node-nocriu", "--data-dir", str(cluster.data_dir))
    creds = cluster.data_dir / "secrets" / "nats" / "checkpointer@node-nocriu.json"
    env = {
        "FERRY_NATS_CREDS": str(creds),
        **cluster.env,
        "FERRY_CRIU_BIN": "/nonexistent/criu",
        "FERRY_NATS_URL": cluster.up_state()["nats_url"],
        "FERRY_DATA_DIR": str(cluster.data_dir),
        "FERRY_NODE_ID": "node-nocriu",
        "FERRY_WORK_DIR": str(tmp_path / "work"),
        "FERRY_SCRATCH_DIR": str(tmp_path / "scratch"),  # not /dev/shm: nothing of it outlives the test
    }
    svc = subprocess.Popen(
        [PY, "-m", "ferry.checkpointer"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        node = wait_until(
            lambda: next((n for n in cluster.json("nodes") if n["id"] == "node-nocriu"), None),
            30,
            "node-nocriu to join",
        )
        assert node["criu_ok"] is False and "criu" in node["criu_error"].lower()
        text = cluster.ferry("nodes").stdout
        assert "node-nocriu" in text and "unusable" in text
        for i in range(4):
            job = cluster.json("run", "--name", f"spread-{i}", "--", "sleep", "600")
            assert job["node"] in ("node-1", "node-2")
        pinned = cluster.json("run", "--name", "pinned", "--node", "node-nocriu", "--", "sleep", "600")
        assert pinned["state"] == "pending" and "CRIU" in pinned["reason"]
        for i in range(4):
            cluster.ferry("kill", f"spread-{i}")
        cluster.ferry("kill", "pinned")
    finally:
        svc.terminate()
        svc.wait(timeout=30)
