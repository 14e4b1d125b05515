"""`ferry run --network isolated`: a job with a network namespace of its own keeps the TCP
connection between two of its processes through a checkpoint, a move and a live move, with no
flag from the user, and two such jobs on one node use the same port at once (issue 12)."""

from __future__ import annotations

import pytest

from tests.conftest import PY, Cluster, reference_output, wait_until
from tests.e2e.test_control import train
from tests.programs import tcp_pair

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

PORT = 47612
MESSAGES = 1500
PAIR = tcp_pair(PORT, MESSAGES)
WANT = "".join(f"{n}\n" for n in range(1, MESSAGES + 1))


def lines(c: Cluster, job: str) -> int:
    return c.logs(job).count("\n")


def on(c: Cluster, job: str, node: str) -> None:
    wait_until(lambda: (s := c.json("status", job))["node"] == node and s["state"] == "running", 120,
               f"{job} to run on {node}")


def test_an_isolated_job_keeps_its_connection_through_a_checkpoint_a_move_and_a_live_move(cluster: Cluster) -> None:
    c = cluster
    c.json("run", "--name", "net-pair", "--network", "isolated", "--node", "node-1", "--", PY, "-c", PAIR)
    c.json("run", "--name", "net-twin", "--network", "isolated", "--node", "node-1", "--", PY, "-c", PAIR)
    c.wait_lines("net-pair", 20)
    c.wait_lines("net-twin", 20)  # the same port in both: each job's port is its own
    status = c.json("status", "net-pair")
    assert status["network"] == "isolated", status
    assert "network          isolated (loopback only" in c.ferry("status", "net-pair").stdout

    carried = c.json("checkpoint", "net-pair")["sockets"]  # the record says which connections it carried
    assert f"tcp 127.0.0.1:{PORT} listen" in carried, carried
    assert sum(k.endswith(" established") and f"127.0.0.1:{PORT}" in k for k in carried) == 2, carried
    c.json("migrate", "net-pair", "--to", "node-2")
    on(c, "net-pair", "node-2")
    moved = lines(c, "net-pair")
    wait_until(lambda: lines(c, "net-pair") >= moved + 20, 60, "answers after the move")
    c.json("migrate", "net-pair", "--to", "node-1", "--live")
    on(c, "net-pair", "node-1")
    for job in ("net-pair", "net-twin"):
        assert c.ferry("wait", job, "--timeout", "300").returncode == 0
        assert c.logs(job) == WANT, f"{job}: the connection lost or repeated a message"
    assert c.json("status", "net-pair")["restarts"] >= 2


def test_a_host_job_is_told_its_sockets_are_the_nodes(cluster: Cluster) -> None:
    cluster.json("run", "--name", "net-host", "--network", "host", "--", "sleep", "600")
    text = cluster.ferry("status", "net-host").stdout
    assert "network          host (its sockets bind the node's addresses" in text, text
    cluster.ferry("kill", "net-host")


def test_an_isolated_job_cannot_reach_the_nodes_services(cluster: Cluster) -> None:
    """NATS and the API listen on the node's loopback; an isolated job's loopback is its own."""
    nats = cluster.up_state()["nats_url"].rpartition("/")[2]
    probe = ("import socket, sys\n"
             "for target in sys.argv[1:]:\n"
             "    host, _, port = target.rpartition(':')\n"
             "    try:\n"
             "        socket.create_connection((host, int(port)), timeout=2).close()\n"
             "        print(target, 'reached', flush=True)\n"
             "    except OSError as exc:\n"
             "        print(target, type(exc).__name__, flush=True)\n")
    cluster.json("run", "--name", "net-probe", "--network", "isolated", "--", PY, "-c", probe, nats, cluster.addr)
    assert cluster.ferry("wait", "net-probe", "--timeout", "60").returncode == 0
    out = cluster.logs("net-probe").splitlines()
    assert out == [f"{nats} ConnectionRefusedError", f"{cluster.addr} ConnectionRefusedError"], out


def test_the_shared_training_workload_checkpoints_and_moves_live_in_an_isolated_network(cluster: Cluster) -> None:
    """train.py (PyTorch) in its own network namespace: a checkpoint and a live move, and its
    output is that of the same run without Ferry."""
    argv = train(400)
    want = reference_output(argv)
    cluster.json("run", "--name", "net-train", "--network", "isolated", "--node", "node-1", "--", *argv)
    cluster.wait_lines("net-train", 20)
    cluster.json("checkpoint", "net-train")
    cluster.json("migrate", "net-train", "--to", "node-2", "--live")
    assert cluster.json("status", "net-train")["node"] == "node-2"
    assert cluster.ferry("wait", "net-train", "--timeout", "300").returncode == 0
    assert cluster.logs("net-train") == want
