"""End to end: `ferry migrate --live` with real CRIU post-copy between the nodes of a real cluster.

Each move is checked by what the workload prints (identical to an uninterrupted run) and by the
processes on the machine (one running copy of the job, never two)."""

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ferry.node.base import scratch_dir
from tests.conftest import BIN, PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster, wait_until
from tests.e2e.test_resilience import kill_service

pytestmark = [pytest.mark.e2e, pytest.mark.criu]


def train(steps: int) -> list[str]:
    return [PY, str(WORKLOADS / "train.py"), "--steps", str(steps), "--sleep", "0.02", "--width", "1024"]


MEMHOG = [PY, str(WORKLOADS / "memhog.py"), "--mib", "64", "--dirty-pct", "5", "--interval", "0.05",
          "--rounds", "80"]


def copies(argv: list[str]) -> dict[int, str]:
    """Processes on this machine running exactly `argv`, with their state (R, S, T...)."""
    want = "\0".join(argv)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").rstrip("\0")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if cmdline == want and state not in ("Z", "X"):
            found[int(entry.name)] = state
    return found


def check_result(r: dict[str, Any], name: str, src: str, dst: str) -> None:
    assert r["job"] == name and r["from"] == src and r["to"] == dst and r["mode"] == "postcopy"
    assert r["rounds"] == 1 and r["bytes_precopy"] > 10 * 2**20
    assert "--checkpoint-every" in (r["round_why"] or ""), r  # these jobs have no interval: the round says so
    assert 0 < r["bytes_final"] < r["bytes_precopy"]
    for key in ("freeze_ms", "downtime_ms", "restore_ms", "degraded_ms", "total_ms"):
        assert isinstance(r[key], float) and r[key] > 0, (key, r)
    assert r["downtime_ms"] < r["total_ms"]
    # what the move cost the job (ferry.policy.lost): within the move; by CPU for a busy job, by its
    # pauses for one that mostly sleeps (memhog between rounds)
    assert r["lost_basis"] in ("cpu", "pause") and 0 <= r["lost_s"] <= r["total_ms"] / 1000, r


def test_train_moved_live_there_and_back_prints_what_an_uninterrupted_run_prints(cluster: Cluster) -> None:
    argv = train(220)
    want = reference_output(argv)
    cluster.json("run", "--name", "live-train", "--node", "node-1", "--", *argv)
    cluster.wait_lines("live-train", 20)
    there = cluster.json("migrate", "live-train", "--to", "node-2", "--live")
    check_result(there, "live-train", "node-1", "node-2")
    status = cluster.json("status", "live-train")
    assert status["state"] == "running" and status["node"] == "node-2" and status["restarts"] == 1
    assert status["last_move_lost_s"] == there["lost_s"] and there["lost_basis"] == "cpu"  # train.py computes
    assert list(copies(argv).values()) in (["R"], ["S"])  # the source is gone, not frozen
    cluster.wait_lines("live-train", 80)
    back = cluster.json("migrate", "live-train", "--to", "node-1", "--live", "--tcp-established")
    check_result(back, "live-train", "node-2", "node-1")
    assert cluster.ferry("wait", "live-train", "--timeout", "300").returncode == 0
    assert cluster.logs("live-train") == want
    assert cluster.json("status", "live-train")["node"] == "node-1"


def test_memhog_crc_sequence_is_unbroken_by_a_live_move(cluster: Cluster) -> None:
    want = reference_output(MEMHOG)
    cluster.json("run", "--name", "live-hog", "--node", "node-2", "--", *MEMHOG)
    cluster.wait_lines("live-hog", 10)
    moved = cluster.json("migrate", "live-hog", "--to", "node-1", "--live")
    check_result(moved, "live-hog", "node-2", "node-1")
    assert cluster.ferry("wait", "live-hog", "--timeout", "300").returncode == 0
    assert cluster.logs("live-hog") == want


@pytest.mark.parametrize("phase", ["round", "freeze", "restore", "postcopy"])
def test_a_failure_in_each_phase_leaves_one_running_copy_and_loses_nothing(cluster: Cluster, phase: str) -> None:
    name = f"live-fail-{phase}"
    argv = train(200 + ["round", "freeze", "restore", "postcopy"].index(phase))  # one argv per test
    want = reference_output(argv)
    cluster.json("run", "--name", name, "--node", "node-1", "--", *argv)
    cluster.wait_lines(name, 15)
    cluster.ferry("chaos", "fail-live", phase)
    failed = cluster.ferry("migrate", name, "--to", "node-2", "--live", check=False)
    assert failed.returncode != 0
    assert "live move failed" in failed.stderr or "injected failure" in failed.stderr, failed.stderr
    assert failed.stderr.count("\n") == 1  # one line
    status = cluster.json("status", name)
    assert status["state"] == "running" and status["node"] == "node-1", status
    running = wait_until(lambda: (c := copies(argv)) and len(c) == 1 and c, 10, "one running copy")
    assert next(iter(running.values())) != "T"
    lines = cluster.logs(name).count("\n")
    cluster.wait_lines(name, lines + 5)  # it goes on
    assert len(copies(argv)) == 1
    assert cluster.ferry("wait", name, "--timeout", "300").returncode == 0
    assert cluster.logs(name) == want


def test_a_source_that_dies_midway_means_a_restore_from_the_pre_copy_checkpoint(cluster: Cluster) -> None:
    argv = train(210)
    want = reference_output(argv)
    cluster.json("run", "--name", "live-src-dies", "--node", "node-1", "--", *argv)
    cluster.wait_lines("live-src-dies", 15)
    cluster.ferry("chaos", "fail-live", "source")
    failed = cluster.ferry("migrate", "live-src-dies", "--to", "node-2", "--live", check=False)
    assert failed.returncode != 0 and "restored from ck-" in failed.stderr, failed.stderr
    status = cluster.json("status", "live-src-dies")
    assert status["state"] == "running" and status["last_checkpoint"].endswith("-r1"), status
    assert len(wait_until(lambda: (c := copies(argv)) and len(c) == 1 and c, 10, "one running copy")) == 1
    assert cluster.ferry("wait", "live-src-dies", "--timeout", "300").returncode == 0
    assert cluster.logs("live-src-dies") == want  # what ran after the checkpoint ran again, identically


def test_a_job_with_a_fresh_periodic_checkpoint_moves_without_a_pre_copy_round(cluster: Cluster) -> None:
    argv = train(480)  # long enough to outlast a 6 s checkpoint interval
    want = reference_output(argv)
    cluster.json("run", "--name", "live-periodic", "--node", "node-2", "--checkpoint-every", "6s", "--", *argv)
    wait_until(lambda: cluster.json("status", "live-periodic")["last_checkpoint"], 60, "a periodic checkpoint")
    before = len(cluster.logs("live-periodic"))
    r = cluster.json("migrate", "live-periodic", "--to", "node-1", "--live")
    assert r["mode"] == "postcopy" and r["rounds"] == 0 and r["bytes_precopy"] == 0, r
    assert r["round_why"] is None, r
    # null when the target wrote nothing within 5 s of its last page (CI, stop 44, once): say how far
    # the job was, and what the target's migrator said
    assert r["downtime_ms"] is not None and r["downtime_ms"] > 0, (
        f"{r}\n{before} of {len(want)} lines before the move\n"
        + cluster.log_tails("migrator-node-1", "checkpointer-node-1", lines=30))
    assert cluster.ferry("wait", "live-periodic", "--timeout", "300").returncode == 0
    assert cluster.logs("live-periodic") == want


def test_live_move_needs_a_running_job_and_says_so(cluster: Cluster) -> None:
    r = cluster.ferry("migrate", "no-such-job", "--to", "node-2", "--live", check=False)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "no-such-job" in r.stderr
    cluster.json("run", "--name", "live-cold-tcp", "--node", "node-1", "--", "sleep", "60")
    r = cluster.ferry("migrate", "live-cold-tcp", "--to", "node-2", "--tcp-established", check=False)
    assert r.returncode == 2 and "--tcp-established goes with --live" in r.stderr, r.stderr
    assert cluster.json("status", "live-cold-tcp")["node"] == "node-1"
    cluster.ferry("kill", "live-cold-tcp")


def test_a_drain_moves_a_job_whose_sla_allows_little_downtime_live(cluster: Cluster) -> None:
    argv = train(230)
    want = reference_output(argv)
    cluster.json("run", "--name", "live-sla", "--node", "node-1", "--max-downtime", "1s", "--", *argv)
    cluster.wait_lines("live-sla", 15)
    job_id = cluster.json("status", "live-sla")["id"]
    events = subprocess.Popen([str(BIN / "ferry"), "events", "-o", "json"], env=cluster.env,
                              stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    stream = events.stdout
    assert stream is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True)
    reader.start()
    try:
        # an event of our own first: once it shows, the stream is live and sees the whole drain
        wait_until(lambda: cluster.ferry("undrain", "node-2") and lines, 30, "the event stream", interval=0.5)
        drained = cluster.json("drain", "node-1", "--timeout", "120s")
    finally:
        cluster.ferry("undrain", "node-1")
        events.terminate()
        events.wait(timeout=10)
        reader.join(timeout=10)
    assert drained["jobs_left"] == []
    kinds = [e["kind"] for e in map(json.loads, lines) if e["job"] == job_id]
    assert "live_move" in kinds and "live_moved" in kinds, kinds
    status = cluster.json("status", "live-sla")
    assert status["node"] == "node-2" and status["state"] == "running"
    assert cluster.ferry("wait", "live-sla", "--timeout", "300").returncode == 0
    assert cluster.logs("live-sla") == want


def test_nodes_report_that_they_can_do_post_copy(cluster: Cluster) -> None:
    nodes = {n["id"]: n for n in cluster.json("nodes")}
    for name in ("node-1", "node-2"):
        assert nodes[name]["lazy_pages"] is True and nodes[name]["lazy_pages_error"] == "", nodes[name]


@pytest.fixture(scope="module")
def precopy_cluster(criu_bin: str) -> Iterator[Cluster]:
    """Nodes that may not use post-copy: live moves fall back to pre-copy rounds."""
    c = start_cluster(Path(tempfile.mkdtemp(prefix="ferry-precopy-")), env={"FERRY_POSTCOPY": "0"})
    yield c
    stop_cluster(c)


def test_without_post_copy_a_live_move_copies_in_rounds_and_ships_only_the_delta(precopy_cluster: Cluster) -> None:
    c = precopy_cluster
    nodes = c.json("nodes")
    assert all(n["lazy_pages"] is False and "FERRY_POSTCOPY" in n["lazy_pages_error"] for n in nodes), nodes
    want = reference_output(MEMHOG)
    c.json("run", "--name", "pre-hog", "--node", "node-1", "--", *MEMHOG)
    c.wait_lines("pre-hog", 10)
    r = c.json("migrate", "pre-hog", "--to", "node-2", "--live")
    assert r["mode"] == "precopy" and 2 <= r["rounds"] <= 8, r
    assert len(r["round_freeze_ms"]) == r["rounds"] and all(ms > 0 for ms in r["round_freeze_ms"])
    assert 0 < r["bytes_final"] < r["bytes_precopy"] / 2, r  # the final freeze ships the delta only
    assert c.json("status", "pre-hog")["node"] == "node-2"
    assert c.ferry("wait", "pre-hog", "--timeout", "300").returncode == 0
    assert c.logs("pre-hog") == want


BIG_HOG = [PY, str(WORKLOADS / "memhog.py"), "--mib", "384", "--dirty-pct", "2", "--interval", "0.2",
           "--rounds", "70"]


def lazy_daemons(c: Cluster) -> list[psutil.Process]:
    """The `criu lazy-pages` processes of `c`'s nodes (their images are in the nodes' scratch
    folders), not the shell that records their exit, nor another cluster's: end-to-end files run
    side by side."""
    places = tuple(f"{scratch_dir(c.env.get('FERRY_SCRATCH_DIR', ''), c.data_dir / 'nodes' / node, node)}/"
                   for node in ("node-1", "node-2"))
    found = []
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"] or []
        if (len(argv) > 1 and Path(argv[0]).name == "criu" and argv[1] == "lazy-pages"
                and any(a.startswith(places) for a in argv)):
            found.append(p)
    return found


@pytest.mark.parametrize("daemon", ["lives", "dies"])
def test_migrator_killed_while_the_memory_arrives_finishes_or_undoes_the_move(cluster: Cluster, daemon: str) -> None:
    """Before: the job stayed `migrating` with its source frozen and `kill` refused as busy. The
    migrator is killed while the target runs on pages still arriving (its lazy-pages daemon held
    still meanwhile, so the transfer cannot end first). When the daemon lives on, the restarted
    migrator sees it end and the move completes; when it died too, the target cannot be trusted:
    it is killed and the source resumes. Either way one copy runs and the output is unbroken."""
    name = f"live-mig-{daemon}"
    want = reference_output(BIG_HOG)
    cluster.json("run", "--name", name, "--node", "node-1", "--", *BIG_HOG)
    cluster.wait_lines(name, 3)
    move = subprocess.Popen([str(BIN / "ferry"), "migrate", name, "--to", "node-2", "--live", "-o", "json"],
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Held still as soon as the restored copy shows up beside the frozen source: polling
    # `ferry status` (0.7 s a call on a loaded machine) for "still arriving" first sometimes saw
    # the transfer end before the daemon could be found.
    lazy = wait_until(lambda: len(copies(BIG_HOG)) == 2 and len(d := lazy_daemons(cluster)) == 1 and d[0], 120,
                      "the restored copy beside its frozen source", interval=0.02)
    group = os.getpgid(lazy.pid)
    os.killpg(group, signal.SIGSTOP)
    try:
        wait_until(lambda: "still arriving" in (cluster.json("status", name).get("reason") or ""), 60,
                   "the target to run with its memory still arriving", interval=0.05)
        kill_service(cluster, "migrator@node-2")
        if daemon == "dies":
            os.killpg(group, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)
    out, err = move.communicate(timeout=180)
    status = cluster.json("status", name)
    if daemon == "lives":
        assert move.returncode == 0, err
        assert json.loads(out)["to"] == "node-2"
        assert status["state"] == "running" and status["node"] == "node-2", status
    else:
        assert move.returncode != 0 and "live move failed" in err and err.count("\n") == 1, err
        assert status["state"] == "running" and status["node"] == "node-1", status
    running = wait_until(lambda: (c := copies(BIG_HOG)) and len(c) == 1 and c, 20, "one running copy")
    assert next(iter(running.values())) not in ("T", "t"), "a copy is left frozen"
    assert not lazy_daemons(cluster)
    assert cluster.ferry("wait", name, "--timeout", "300").returncode == 0
    assert cluster.logs(name) == want
