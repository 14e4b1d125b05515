"""`ferry run --network bridge`: a job with a namespace and an address of its own, on a veth to
its node's bridge. The address is the job's: a peer on either node keeps its TCP connection while
the job moves cold, live and through a stop and restore; published ports reach the job on the
node it runs on; the outside sees the node's address (NAT). Each simulated node's bridge is in a
network namespace of its own (issue 12)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.conftest import PY, Cluster, wait_until
from tests.e2e.test_errors import one_line_error
from tests.netdiag import network_diagnosis
from tests.programs import tcp_answer_server, tcp_counter_client

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

PORT = 80
MESSAGES = 1500
WANT = "".join(f"{n}\n" for n in range(1, MESSAGES + 1))


def on(c: Cluster, job: str, node: str) -> dict[str, Any]:
    return dict(wait_until(lambda: (s := c.json("status", job))["node"] == node and s["state"] == "running" and s,
                           120, f"{job} to run on {node}"))


def net(c: Cluster) -> dict[str, Any]:
    state = c.up_state()["net"]
    assert state["error"] is None, state  # the simulated nodes' namespaces were made
    return dict(state)


def node_ip(c: Cluster, node: str) -> str:
    return str(net(c)["nodes"][node]["FERRY_NET_IP"])


def ask(address: str, port: int, n: int) -> int:
    with socket.create_connection((address, port), timeout=10) as s:
        s.sendall(b"%d" % n)
        return int(s.recv(64))


def progress(c: Cluster, job: str) -> int:
    return c.logs(job).count("\n")


def answered(c: Cluster, job: str, lines: int, node: str) -> None:
    wait_until(lambda: progress(c, job) >= lines, 90, f"{job} to be answered on {node}",
               explain=lambda: network_diagnosis(c, ["br-srv", "br-c1", "br-c2"]))


def test_a_bridge_job_keeps_its_address_and_its_peers_through_every_kind_of_move(cluster: Cluster) -> None:
    c = cluster
    c.json("run", "--name", "br-srv", "--network", "bridge", "--publish", "18080:80", "--node", "node-1", "--",
           PY, "-c", tcp_answer_server(PORT))
    address = c.json("status", "br-srv")["address"]
    assert address.startswith("10.88."), address
    wait_until(lambda: ask(node_ip(c, "node-1"), 18080, 41) == 42, 30, "the published port on node-1")
    clients = {"br-c1": "node-1", "br-c2": "node-2"}  # a peer on the same node, one on the other
    for name, node in clients.items():
        c.json("run", "--name", name, "--network", "bridge", "--node", node, "--", PY, "-c",
               tcp_counter_client(address, PORT, MESSAGES))
    for name in clients:
        c.wait_lines(name, 20)
    text = c.ferry("status", "br-srv").stdout
    assert f"network          bridge (address {address}, kept on every node" in text, text
    assert "published        18080:80/tcp" in text, text

    carried = c.json("checkpoint", "br-srv")["sockets"]  # it says which connections it carried
    assert sum(k.endswith(" established") and f"{address}:{PORT}" in k for k in carried) == 2, carried
    moves = [("migrate", "node-2", False), ("migrate", "node-1", True), ("migrate", "node-2", True)]
    for _, node, live in moves:
        before = {name: progress(c, name) for name in clients}
        c.json("migrate", "br-srv", "--to", node, *(["--live"] if live else []))
        assert on(c, "br-srv", node)["address"] == address  # the same address on the other node
        for name in clients:
            answered(c, name, before[name] + 10, node)
    c.json("checkpoint", "br-srv", "--stop")
    c.json("restore", "br-srv", "--node", "node-1")
    on(c, "br-srv", "node-1")
    wait_until(lambda: ask(node_ip(c, "node-1"), 18080, 7) == 8, 30, "the published port to follow the job")
    for name in clients:
        done = c.ferry("wait", name, "--timeout", "300", check=False)
        out = c.logs(name)
        err = c.ferry("logs", name, "--stream", "stderr").stdout
        assert done.returncode == 0, (f"{name}: {done.stdout.strip()}; output ends {out[-200:]!r}; stderr {err!r}\n"
                                      + network_diagnosis(c, ["br-srv", *clients]))
        assert out == WANT, f"{name}: its connection lost or repeated a message"
    peers = c.logs("br-srv").split()
    for name in clients:  # the server saw each client's own address (no NAT between jobs)
        assert c.json("status", name)["address"] in peers, peers
    c.ferry("kill", "br-srv")


def test_the_outside_sees_the_node_and_a_bridge_job_cannot_reach_the_nodes_loopback(cluster: Cluster) -> None:
    c = cluster
    outside = socket.socket()
    outside.bind((net(c)["host_ip"], 0))
    outside.listen(1)
    outside.settimeout(60)
    nats = c.up_state()["nats_url"].rpartition(":")[2]
    probe = (f"import socket\n"
             f"socket.create_connection(({net(c)['host_ip']!r}, {outside.getsockname()[1]}), timeout=10).close()\n"
             f"try:\n"
             f"    socket.create_connection(('127.0.0.1', {nats}), timeout=2)\n"
             f"    print('reached NATS', flush=True)\n"
             f"except OSError:\n"
             f"    print('no NATS', flush=True)\n")
    c.json("run", "--name", "br-out", "--network", "bridge", "--node", "node-2", "--", PY, "-c", probe)
    conn, peer = outside.accept()
    conn.close()
    outside.close()
    assert peer[0] == node_ip(c, "node-2"), peer  # masqueraded: the node's address, not the job's
    c.ferry("wait", "br-out", "--timeout", "60")
    assert c.logs("br-out") == "no NATS\n"


@pytest.mark.parametrize(("args", "says"), [
    (["--network", "bridge", "--publish", "80"], "--publish '80': use HOST_PORT:JOB_PORT"),
    (["--network", "isolated", "--publish", "8080:80"], "--publish needs --network bridge"),
    (["--network", "lan"], "unknown network 'lan'"),
])
def test_bad_network_input_is_refused_in_one_line(cluster: Cluster, args: list[str], says: str) -> None:
    line = one_line_error(cluster.ferry("run", "--name", "br-bad", *args, "--", "true", check=False), 2)
    assert says in line, line
    assert "br-bad" not in {j["name"] for j in cluster.json("ps", "-a")}


def test_a_published_port_belongs_to_one_live_job(cluster: Cluster) -> None:
    c = cluster
    c.json("run", "--name", "br-holder", "--network", "bridge", "--publish", "18181:80", "--", "sleep", "600")
    line = one_line_error(c.ferry("run", "--name", "br-taker", "--network", "bridge", "--publish", "18181:81",
                                  "--", "sleep", "600", check=False), 2)
    assert "port 18181/tcp is published by job br-holder" in line, line
    assert "br-taker" not in {j["name"] for j in c.json("ps", "-a")}
    c.ferry("kill", "br-holder")
    c.wait_state("br-holder", "killed")
    c.json("run", "--name", "br-taker", "--network", "bridge", "--publish", "18181:81", "--", "sleep", "600")
    c.ferry("kill", "br-taker")
