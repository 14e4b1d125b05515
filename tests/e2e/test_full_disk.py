"""A full disk: the cluster keeps answering, refuses what cannot fit in one line, loses nothing, and
works as before once space is freed (issue 10, item 5).

The whole cluster (NATS' stores, the checkpoint store, the nodes' work directories and the jobs'
output) lives on a 320 MiB tmpfs of its own, which the test then fills to the last byte.
"""

import contextlib
import errno
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, start_cluster, stop_cluster, wait_until
from tests.e2e.test_frozen import proc_state, workload_pid
from tests.e2e.test_resilience import COUNTER

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

DISK_MIB = 320


@pytest.fixture
def small_disk() -> Iterator[Path]:
    mount = Path(tempfile.mkdtemp(prefix="ferry-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError):
            mount.rmdir()


def fill(path: Path) -> int:
    """Writes `path` until the disk is full; the bytes written."""
    written = 0
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        # the last bytes: a disk is full when nothing more fits, not when a whole MiB does not
        for size in (1 << 16, 1 << 12, 1):
            while True:
                try:
                    written += f.write(block[:size])
                except OSError:
                    break
    return written


def answers_within(c: Cluster, seconds: float, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = c.ferry(*args, check=False, timeout=seconds + 30)
    took = time.monotonic() - started
    assert took < seconds, f"ferry {' '.join(args)} took {took:.1f}s on a full disk: {result.stderr}"
    return result


def runs_again(pid: int, what: str) -> None:
    """The job is alive and, within 30 s, not stopped: a hold is released once the node's beats
    land, a tree something left frozen never is."""
    wait_until(lambda: proc_state(pid) not in ("T", "t"), 30, what)
    assert proc_state(pid) != "gone", "the job died"


def checkpoint_once_beats_land(c: Cluster, name: str, within_s: float = 30) -> Any:
    """``ferry checkpoint``, again while it is refused only because the node holds the job: after
    the NATS server's restart the node's first beats can still fail, and a node that cannot beat
    holds its jobs (a dump then would record them stopped). Any other refusal fails at once."""
    deadline = time.monotonic() + within_s
    while True:
        done = c.ferry("checkpoint", "-o", "json", name, check=False)
        if done.returncode == 0:
            return json.loads(done.stdout)
        assert "the job is held" in done.stderr and time.monotonic() < deadline, done.stderr
        time.sleep(1)


def test_a_full_disk_leaves_the_cluster_answering_and_loses_nothing(small_disk: Path, criu_bin: str) -> None:
    c = start_cluster(small_disk / "cluster", nodes=1, env={"FERRY_DISK_RESERVE": "96MiB"})
    try:
        reserve = c.data_dir / "nats-reserve"
        assert reserve.stat().st_blocks * 512 >= 64 << 20, "ferry up keeps no reserve for NATS"
        job = c.json("run", "--name", "a", "--node", "node-1", "--", *COUNTER)
        c.wait_lines("a", 3)
        first = c.json("checkpoint", "a")
        pid = workload_pid(c, "node-1", job["id"])
        # NATS as it was before any fill: under load the first fill can already break (and restart) it
        nats_pid = c.service_pid("nats")
        nats_log = c.data_dir / "logs" / "nats.log"
        seen = nats_log.stat().st_size

        assert fill(small_disk / "ballast") > 0
        wait_until(lambda: not reserve.exists(), 10, "ferry up to release the reserve on a full disk")

        status = answers_within(c, 15, "-o", "json", "status", "a")
        assert status.returncode == 0, status.stderr
        refused = answers_within(c, 30, "checkpoint", "a")
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "not enough space for the checkpoint" in lines[0], refused.stderr
        # not frozen by the refused checkpoint; the node may hold it a moment while its beats fail
        # on the full disk (self-fencing), until they land again
        runs_again(pid, "a refused checkpoint left the job frozen")
        listed = answers_within(c, 15, "-o", "json", "checkpoints", "a")
        assert listed.returncode == 0, listed.stderr
        assert first["id"] in listed.stdout
        assert answers_within(c, 15, "nodes").returncode == 0

        # the reserve's space taken too: now JetStream itself cannot write (heartbeats fail with
        # ENOSPC), which leaves its streams broken until the server restarts. A server the first
        # fill broke already may stay broken, and write (and log) nothing more: its line counts.
        fill(small_disk / "ballast-2")
        wait_until(lambda: b"no space left on device" in nats_log.read_bytes()[seen:], 15,
                   "JetStream to hit the full disk")
        reads = answers_within(c, 15, "-o", "json", "status", "a")
        assert reads.returncode == 0, reads.stderr
        (small_disk / "ballast-2").unlink()
        wait_until(lambda: c.service_pid("nats") != nats_pid, 15, "ferry up to restart the NATS server it broke")
        runs_again(pid, "the job to run again once the node's beats land (held while they could not)")

        # space comes back: everything works as before, the old checkpoint included
        (small_disk / "ballast").unlink()
        wait_until(reserve.exists, 15, "ferry up to take its reserve back")
        second = checkpoint_once_beats_land(c, "a")
        assert second["id"] != first["id"]
        n = c.logs("a").count("\n")
        c.wait_lines("a", n + 5)
        c.ferry("kill", "a")
        assert c.json("status", "a")["state"] == "killed"
        b = c.json("run", "--name", "b", "--node", "node-1", "--", *COUNTER)
        c.wait_lines("b", 3)
        c.ferry("checkpoint", "b", "--stop")
        # In full-suite runs (not alone) node-1's heartbeat was seen to lag more than 10 s here,
        # after the NATS restart above; the node must beat again, and then take the restore.
        wait_until(lambda: time.time() - c.json("nodes")[0]["heartbeat"] < 3, 60, "node-1 to beat again")
        c.json("restore", "b")
        out = c.wait_lines("b", 10)
        numbers = [int(x) for x in out.split()]
        assert numbers == list(range(1, len(numbers) + 1)), "b's output was not continuous over the restore"
        assert b["id"]
        c.ferry("kill", "b")
    except BaseException:
        print(c.log_tails("checkpointer@node-1", "health", "scheduler", "nats"))
        raise
    finally:
        for name in ("ballast", "ballast-2"):
            (small_disk / name).unlink(missing_ok=True)
        stop_cluster(c)
