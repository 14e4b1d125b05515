"""A two-node `torchrun` job as a gang (issue 15): rank 0 and rank 1 on two Ferry nodes, gloo over
TCP between their addresses, checkpointed as one group mid-run and restored on two other nodes. The
loss sequence is the one an uninterrupted run prints, digit for digit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PY, Cluster, wait_until
from tests.programs import ddp_train

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

TORCHRUN = str(Path(PY).with_name("torchrun"))
STEPS = 150


def reference(script: Path) -> str:
    """The same two ranks, never stopped: both on this machine's loopback, outside Ferry."""
    run = subprocess.run([TORCHRUN, "--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=600, check=True)
    return run.stdout


def rank(c: Cluster, name: str, node: str, node_rank: int, master: str, script: Path) -> None:
    """One node's torchrun; gloo on the job's own interface (the default, the host name's address,
    is the machine's, which the other rank cannot reach in its namespace). torchrun's agent hosts
    the rendezvous store on libuv, which falls back from io_uring (refused to every job) to epoll."""
    c.json("run", "--name", name, "--gang", "ddp", "--node", node, "--", "env", "GLOO_SOCKET_IFNAME=eth0",
           TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank), "--master-addr",
           master, "--master-port", "29500", str(script))


def test_a_two_node_torchrun_gang_restored_on_two_other_nodes_prints_the_same_losses(
        three_nodes: Cluster, tmp_path: Path) -> None:
    c = three_nodes
    script = tmp_path / "ddp.py"
    script.write_text(ddp_train(STEPS, 0.1))
    want = reference(script)
    assert want.count("\n") == STEPS

    rank(c, "ddp-r0", "n1", 0, "127.0.0.1", script)  # rank 0 serves the rendezvous on all its addresses
    rank(c, "ddp-r1", "n2", 1, c.json("status", "ddp-r0")["address"], script)
    wait_until(lambda: c.logs("ddp-r0").count("\n") >= 30, 300, "the ranks to train 30 steps")

    group = c.json("checkpoint", "--gang", "ddp", "--stop")
    assert group["stopped"] and len(group["members"]) == 2
    stopped = c.logs("ddp-r0").count("\n")
    assert stopped < STEPS, "it ended before the checkpoint: train more steps"
    c.json("restore", "--gang", "ddp", "--nodes", "n2,n3")  # rank 0 to n2, rank 1 to n3
    assert c.ferry("wait", "ddp-r0", "--timeout", "600").returncode == 0
    assert c.ferry("wait", "ddp-r1", "--timeout", "120").returncode == 0
    assert c.logs("ddp-r0") == want, "the losses differ from an uninterrupted run"
