"""Real CRIU: a job with a network namespace of its own (``--network isolated``) keeps a TCP
connection between two of its processes, a UDP socket and a unix socket pair through a dump and a
restore, without any flag from the user, and its port is its own: the node may use the same port
meanwhile (issue 12)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.runner import CriuRunner, job_criu_args
from ferry.criu.sockets import read_sockets
from ferry.criu.treekill import kill_tree
from tests.integration.criu_helpers import ENV, wait_exit, wait_for
from tests.integration.test_criu_migrate import lines_in, rebuild
from tests.programs import tcp_pair, udp_and_unix

pytestmark = [pytest.mark.criu, pytest.mark.timeout(60)]

PORT = 47611
PAIR = tcp_pair(PORT)

def counts(job: JobDir) -> list[int]:
    return [int(x) for x in lines_in(job.stdout)]


async def test_a_connection_inside_an_isolated_job_survives_a_dump_and_restore(tmp_path: Path, criu_ok: CriuRunner,
                                                                             pids: list[int]) -> None:
    src = JobDir(tmp_path / "a")
    info = await launch(src, [sys.executable, "-c", PAIR], cwd=tmp_path, env=ENV, incarnation=1, network="isolated")
    pids.append(info.pid)
    await wait_for("the pair's first answers", lambda: len(counts(src)) >= 5)
    with socket.socket() as mine:  # the job's port is the job's: the node binds the same one meanwhile
        mine.bind(("127.0.0.1", PORT))

    dumped = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False,
                                record_sizes=[src.stdout, src.stderr], extra_args=job_criu_args("isolated"))
    await wait_exit(src)
    carried = sorted(str(k) for k in read_sockets(tmp_path / "images"))
    assert f"tcp 127.0.0.1:{PORT} listen" in carried, carried
    established = [k for k in carried if k.endswith(" established")]
    assert len(established) == 2 and all(f"127.0.0.1:{PORT}" in k for k in established), carried
    before = counts(src)
    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped), incarnation=2,
                             criu_args=job_criu_args("isolated"))
    pids.append(restored.pid)
    await wait_for("answers after the restore", lambda: len(counts(dst)) >= len(before) + 5)
    got = counts(dst)
    assert got == list(range(1, len(got) + 1)), "the connection lost or repeated a message"
    await kill_tree(restored.pid, grace_s=0)


async def test_udp_and_unix_sockets_of_an_isolated_job_survive_a_dump_and_restore(tmp_path: Path, criu_ok: CriuRunner,
                                                                               pids: list[int]) -> None:
    src = JobDir(tmp_path / "a")
    info = await launch(src, [sys.executable, "-c", udp_and_unix(PORT)], cwd=tmp_path, env=ENV, incarnation=1,
                        network="isolated")
    pids.append(info.pid)
    await wait_for("the first answers", lambda: len(lines_in(src.stdout)) >= 5)
    dumped = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False,
                                record_sizes=[src.stdout, src.stderr], extra_args=job_criu_args("isolated"))
    await wait_exit(src)
    assert f"udp 127.0.0.1:{PORT} close" in [str(k) for k in read_sockets(tmp_path / "images")]
    before = len(lines_in(src.stdout))
    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped), incarnation=2,
                             criu_args=job_criu_args("isolated"))
    pids.append(restored.pid)
    await wait_for("answers after the restore", lambda: len(lines_in(dst.stdout)) >= before + 5)
    got = [int(line.split()[0]) for line in lines_in(dst.stdout)]
    assert got == list(range(len(got))), "a datagram or a unix message was lost or repeated"
    await kill_tree(restored.pid, grace_s=0)
