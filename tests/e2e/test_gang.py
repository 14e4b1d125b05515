"""Gangs (issue 15): jobs that talk to each other over TCP, checkpointed as one consistent group
(every member's network locked before any member dumps, the group committed only when every member
did), restored together on other nodes with their connections, and undone whole when a member's
dump fails. The workload is a server and a counting client on different nodes: the client's count
is unbroken only if the connection between them lost or repeated nothing."""

from __future__ import annotations

import pytest

from tests.conftest import PY, Cluster, wait_until
from tests.e2e.test_errors import one_line_error
from tests.programs import tcp_answer_server, tcp_counter_client

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

PORT = 80
MESSAGES = 1000
WANT = "".join(f"{n}\n" for n in range(1, MESSAGES + 1))
LONG = 2000  # the failover test's client: long enough for a failover and then a spot notice
WANT_LONG = "".join(f"{n}\n" for n in range(1, LONG + 1))


def restored_off(c: Cluster, job: str, node: str) -> None:
    def done() -> bool:
        s = c.json("status", job)
        return bool(s["state"] == "running" and s["restarts"] >= 1 and s["node"] != node)
    wait_until(done, 120, f"{job} to be restored off {node}")


def lines(c: Cluster, job: str) -> int:
    return c.logs(job).count("\n")


def start_gang(c: Cluster, gang: str, server: str, client: str) -> None:
    c.json("run", "--name", server, "--gang", gang, "--network", "bridge", "--node", "node-1", "--", PY, "-c",
           tcp_answer_server(PORT))
    address = c.json("status", server)["address"]
    c.json("run", "--name", client, "--gang", gang, "--network", "bridge", "--node", "node-2", "--", PY, "-c",
           tcp_counter_client(address, PORT, MESSAGES))
    c.wait_lines(client, 20)


def test_a_gang_is_checkpointed_as_one_and_restored_on_other_nodes_with_its_connection(cluster: Cluster) -> None:
    c = cluster
    start_gang(c, "g1", "g1-srv", "g1-cli")
    status = c.ferry("status", "g1-cli").stdout
    assert "gang             g1 (group checkpoint none yet)" in status, status

    group = c.json("checkpoint", "--gang", "g1")  # the gang runs on
    assert set(group["members"]) == {c.json("status", j)["id"] for j in ("g1-srv", "g1-cli")}, group
    assert 0 < group["freeze_ms"] <= group["freeze_ms_sum"], group  # in parallel: the slowest, not the sum
    assert group["lock_ms"] >= group["freeze_ms"], group
    assert not group["stopped"]
    before = lines(c, "g1-cli")
    wait_until(lambda: lines(c, "g1-cli") >= before + 20, 60, "the client to go on after the group checkpoint")
    assert c.json("status", "g1-srv")["gang_checkpoint"] == group["group"]

    final = c.json("checkpoint", "--gang", "g1", "--stop")
    assert final["stopped"] and final["group"] != group["group"], final
    for job in ("g1-srv", "g1-cli"):
        assert c.json("status", job)["state"] == "preempted"
    stopped_at = lines(c, "g1-cli")

    # members by name: g1-cli, g1-srv; each goes to the node the other one was on
    restored = c.json("restore", "--gang", "g1", "--nodes", "node-1,node-2")
    assert restored["group"] == final["group"], restored
    assert {c.json("status", j)["node"] for j in ("g1-cli", "g1-srv")} == {"node-1", "node-2"}
    assert c.json("status", "g1-cli")["node"] == "node-1"
    assert c.ferry("wait", "g1-cli", "--timeout", "300").returncode == 0
    assert lines(c, "g1-cli") > stopped_at
    assert c.logs("g1-cli") == WANT, "the connection lost or repeated a message across the gang's restore"
    c.ferry("kill", "g1-srv")


def test_a_member_that_fails_to_dump_undoes_the_group_and_everyone_runs_on(cluster: Cluster) -> None:
    c = cluster
    start_gang(c, "g2", "g2-srv", "g2-cli")
    c.ferry("chaos", "fail-live", "round")  # the next dump of the gang's last member fails
    failed = c.ferry("checkpoint", "--gang", "g2", check=False)
    assert failed.returncode == 1, failed.stderr
    assert "group checkpoint undone, every member runs on" in failed.stderr, failed.stderr
    assert "injected failure" in failed.stderr, failed.stderr
    for job in ("g2-srv", "g2-cli"):
        s = c.json("status", job)
        assert s["state"] == "running" and not s.get("gang_checkpoint"), s
    before = lines(c, "g2-cli")  # unlocked: the client's connection carries on
    wait_until(lambda: lines(c, "g2-cli") >= before + 20, 60, "the client to go on after the undone checkpoint")
    assert c.ferry("wait", "g2-cli", "--timeout", "300").returncode == 0
    assert c.logs("g2-cli") == WANT
    c.ferry("kill", "g2-srv")


def test_bad_gang_input_is_refused_before_anyone_is_frozen(cluster: Cluster) -> None:
    c = cluster
    line = one_line_error(c.ferry("run", "--name", "g3-bad", "--gang", "g3", "--network", "host", "--", "true",
                                  check=False), 2)
    assert "--gang needs --network bridge" in line, line
    line = one_line_error(c.ferry("checkpoint", "--gang", "nosuch", check=False), 2)
    assert "no gang 'nosuch'" in line, line
    line = one_line_error(c.ferry("checkpoint", "g3-x", "--gang", "g3", check=False), 2)
    assert "name a job, or a gang with --gang (not both)" in line, line

    c.json("run", "--name", "g3-a", "--gang", "g3", "--network", "bridge", "--node", "node-1", "--", "sleep", "600")
    c.json("run", "--name", "g3-b", "--gang", "g3", "--network", "bridge", "--node", "node-2", "--", "sleep", "600")
    c.wait_state("g3-a", "running")
    c.wait_state("g3-b", "running")
    line = one_line_error(c.ferry("restore", "--gang", "g3", check=False), 1)  # a conflict with the state
    assert "member g3-a is running on node-1: stop the gang first" in line, line
    c.json("checkpoint", "--gang", "g3", "--stop")
    line = one_line_error(c.ferry("restore", "--gang", "g3", "--nodes", "node-1", check=False), 2)
    assert "the gang has 2 members and --nodes names 1 node(s)" in line, line
    line = one_line_error(c.ferry("restore", "--gang", "g3", "--nodes", "node-1,node-1", check=False), 2)
    assert "--nodes names a node twice" in line, line
    for job in ("g3-a", "g3-b"):  # refused: nothing changed
        assert c.json("status", job)["state"] == "preempted"
    done = c.json("restore", "--gang", "g3", "--nodes", "node-1", "--allow-colocate")
    assert set(done["nodes"].values()) == {"node-1"}, done
    for job in ("g3-a", "g3-b"):
        c.ferry("kill", job)


def test_a_gang_whose_node_dies_comes_back_whole_then_a_member_leaves_a_noticed_node_alone(
        three_nodes: Cluster) -> None:
    c = three_nodes
    c.json("run", "--name", "g4-srv", "--gang", "g4", "--node", "n1", "--checkpoint-every", "3s", "--", PY, "-c",
           tcp_answer_server(PORT))
    address = c.json("status", "g4-srv")["address"]
    c.json("run", "--name", "g4-cli", "--gang", "g4", "--node", "n2", "--checkpoint-every", "3s", "--", PY, "-c",
           tcp_counter_client(address, PORT, LONG))
    c.wait_lines("g4-cli", 50)
    wait_until(lambda: c.json("status", "g4-cli")["gang_checkpoint"], 60, "a periodic group checkpoint")
    c.ferry("chaos", "kill-node", "n2")
    for job in ("g4-srv", "g4-cli"):  # the server ran on a live node: it comes back from the group too
        restored_off(c, job, "n2")
    # a spot notice on the server's node: that member alone moves, with its address and connection
    where = c.json("status", "g4-srv")["node"]
    c.json("chaos", "spot-notice", where, "--in", "60s")
    wait_until(lambda: c.json("status", "g4-srv")["node"] != where, 120, "the server to leave the noticed node")
    assert c.ferry("wait", "g4-cli", "--timeout", "300").returncode == 0
    assert c.logs("g4-cli") == WANT_LONG, "the gang's failover or the move lost or repeated a message"
    assert c.json("status", "g4-cli")["gang_checkpoint"], "restored from a group checkpoint"
    c.ferry("kill", "g4-srv")


def test_a_gang_is_parked_whole_to_make_room_and_comes_back_whole_when_room_is_back(three_nodes: Cluster) -> None:
    c = three_nodes
    c.json("run", "--name", "g5-srv", "--gang", "g5", "--cpus", "2", "--node", "n1", "--", PY, "-c",
           tcp_answer_server(PORT))
    address = c.json("status", "g5-srv")["address"]
    c.json("run", "--name", "g5-cli", "--gang", "g5", "--cpus", "2", "--node", "n2", "--", PY, "-c",
           tcp_counter_client(address, PORT, LONG))
    c.json("run", "--name", "g5-hi", "--cpus", "2", "--priority", "10", "--node", "n3", "--", "sleep", "600")
    c.wait_lines("g5-cli", 50)
    c.json("chaos", "spot-notice", "n3", "--in", "60s")  # g5-hi must go, and only a gang member's node can take it

    def parked() -> bool:
        return all((s := c.json("status", j))["state"] == "preempted" and "to make room for g5-hi" in s["reason"]
                   for j in ("g5-srv", "g5-cli"))
    wait_until(parked, 120, "the whole gang to be parked for g5-hi")
    wait_until(lambda: c.json("status", "g5-hi")["node"] in ("n1", "n2"), 120, "g5-hi to move where the gang was")
    assert {c.json("status", j)["gang_checkpoint"] for j in ("g5-srv", "g5-cli")} != {""}  # one group, both
    c.ferry("kill", "g5-hi")  # room for both members again (n3 is going away)
    for job in ("g5-srv", "g5-cli"):
        wait_until(lambda job=job: c.json("status", job)["state"] == "running", 120,  # type: ignore[misc]
                   f"{job} to come back with its gang")
    assert {c.json("status", j)["node"] for j in ("g5-srv", "g5-cli")} == {"n1", "n2"}  # a node each, no overcommit
    assert c.ferry("wait", "g5-cli", "--timeout", "300").returncode == 0
    assert c.logs("g5-cli") == WANT_LONG, "parking and bringing back the gang lost or repeated a message"
    c.ferry("kill", "g5-srv")
