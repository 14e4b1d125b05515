"""End to end, elastic scale with the local provider (`ferry up --provider local`): a node is
launched for a job that fits nowhere, an underused node retires with its job moved away by a
checkpoint (its output identical to a run without Ferry), a launch the provider refuses leaves
the cluster as it was, bad bounds are refused, and a right-sized job that outgrows its node gets
a bigger one. Real CLI, cluster, CRIU."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.node.base import scratch_dir
from tests.conftest import BIN, Cluster, reference_output, wait_until
from tests.e2e.test_control import FAST, make_cluster, train

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

FLEET = """
nodes:
  - {id: n1, cpus: 4, instance_type: small, zone: local-a, price_per_hour: 0.1}
instance_types:
  - {name: small, zone: local-a, cpus: 2, memory: 4GiB, price_per_hour: 0.1, available: 3}
  - {name: big, zone: local-a, cpus: 8, memory: 16GiB, price_per_hour: 0.5, available: 0}
"""


def provided(text: str) -> Iterator[Cluster]:
    """A cluster of `text`'s nodes whose local provider the autoscaler drives (planning every second)."""
    return make_cluster(text, extra=["--provider", "local"], env={**FAST, "FERRY_AUTOSCALE_EVERY_S": "1"},
                        prefix="ferry-fleet-")


@pytest.fixture
def fleet(criu_bin: str) -> Iterator[Cluster]:
    yield from provided(FLEET)


def fleet_nodes(c: Cluster) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in c.json("autoscale")["fleet"]}


def diagnosis(c: Cluster, job: str, *nodes: str) -> str:
    """Where a move the test waits for stands: the job's record, the nodes, the fleet, `ferry
    explain` and the deciding services' logs."""
    parts = [f"status: {c.ferry('status', job, '-o', 'json', check=False).stdout}",
             f"nodes: {c.ferry('nodes', check=False).stdout}",
             f"fleet: {c.ferry('autoscale', check=False).stdout}",
             f"explain: {c.ferry('explain', job, check=False).stdout}"]
    on_nodes = [f"{svc}@{n}" for n in nodes for svc in ("checkpointer", "migrator")]
    return "\n".join(parts) + "\n" + c.log_tails("scheduler", "autoscaler", "health", *on_nodes, lines=40)


def test_scale_up_then_down_with_the_job_moved_and_a_refused_launch_changing_nothing(fleet: Cluster,
                                                                                    tmp_path: Path) -> None:
    c = fleet
    # bad bounds: one line, exit 2, nothing set
    bad = c.ferry("autoscale", "--min", "5", "--max", "2", check=False)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "--min 5 is above --max 2" in bad.stderr
    assert c.json("autoscale")["set"] is False
    status = c.json("autoscale", "--min", "1", "--max", "3", "--target-utilization", "1.0",
                    "--scale-down-after", "3s", "--scale-up-after", "1s")
    assert status["set"] and status["policy"]["max_nodes"] == 3

    long_ = train(1500)
    want = reference_output(long_)
    c.json("run", "--name", "a", "--cpus", "2", "--", "sleep", "600")
    c.json("run", "--name", "b", "--cpus", "2", "--", *long_)
    c.wait_state("a", "running")
    c.wait_state("b", "running")
    # c fits nowhere: a small node is launched for it, and it runs there
    # c waits, silent, after its last step until the test has seen it moved: a job that ended on
    # the new node before the retirement would leave it there (a finished job is not moved)
    go = tmp_path / "c-go"
    held = ["sh", "-c", f'"$0" "$@" && while [ ! -e {go} ]; do sleep 0.2; done', *long_]
    c.json("run", "--name", "c", "--cpus", "2", "--checkpoint-every", "5s", "--", *held)
    launched = wait_until(lambda: [n for n in fleet_nodes(c).values() if n["state"] == "running"], 90,
                          "a node launched for c")
    node = launched[0]["id"]
    assert launched[0]["offer"] == "small/local-a/on-demand"
    assert "c" in launched[0]["reason"]
    running = c.wait_state("c", "running", timeout=90)
    assert running["node"] == node
    assert node in {n["id"] for n in c.json("nodes")}
    c.wait_lines("c", 20)
    c.json("run", "--name", "d", "--node", node, "--", "echo", "kept after its node is gone")
    c.wait_state("d", "succeeded")
    # a ends: c fits on n1 now; after 3 s underused the new node retires, c moves to n1 first
    c.ferry("kill", "a")
    retired = wait_until(lambda: fleet_nodes(c).get(node, {}).get("state") == "terminated" and fleet_nodes(c)[node],
                         180, f"{node} to retire")
    assert "saves 0.100 USD/h" in retired["reason"]
    moved = c.json("status", "c")
    assert (moved["node"], moved["state"]) == ("n1", "running"), diagnosis(c, "c", "n1", node)
    assert node not in {n["id"] for n in c.json("nodes")}
    # its scratch folder (in /dev/shm: memory) went with it, not left until the cluster stops
    gone = scratch_dir(c.env.get("FERRY_SCRATCH_DIR", ""), c.data_dir / "nodes" / node, node)
    assert not gone.exists(), sorted(gone.iterdir())
    assert c.logs("d") == "kept after its node is gone\n"  # from the store: its node is gone
    go.touch()
    done = c.wait_state("c", "succeeded", timeout=240)
    assert done["exit_code"] == 0
    assert c.logs("c") == want
    c.wait_state("b", "succeeded", timeout=240)
    assert c.logs("b") == want
    # never below --min: n1 stays
    time.sleep(5)
    assert [n["id"] for n in c.json("nodes")] == ["n1"]

    # a job that only a "big" node fits: the provider has none left, the cluster stays as it was
    events = subprocess.Popen([str(BIN / "ferry"), "events", "-o", "json"], env=c.env, stdout=subprocess.PIPE,
                              text=True)
    try:
        wide = c.json("run", "--name", "wide", "--cpus", "6", "--", "sleep", "600")
        failed = wait_until(lambda: [n for n in fleet_nodes(c).values() if n["state"] == "failed"], 60,
                            "the provider to refuse the launch")
        assert failed[0]["offer"] == "big/local-a/on-demand"
        assert "insufficient capacity" in failed[0]["reason"]
        assert [n["id"] for n in c.json("nodes")] == ["n1"]
        assert c.json("status", "wide")["state"] == "pending"
        time.sleep(4)  # a few more plans, each finding wide stuck for the same reason
    finally:
        events.terminate()
        out, _ = events.communicate(timeout=30)
    blocked = [e for line in out.splitlines() if (e := json.loads(line))["kind"] == "scale_up_blocked"
               and e["data"].get("job") == wide["id"]]
    assert len(blocked) == 1, blocked  # said once while the reason stays the same
    assert "launches of some were refused" in blocked[0]["message"]
    c.ferry("kill", "wide")


GROWING = """
import os, random, sys, time, zlib
chunks, crc = [], 0
for i in range(int(sys.argv[1])):  # grows by 64 MiB a step
    chunk = bytearray(random.Random(i).randbytes(64 << 20))
    chunks.append(chunk)
    crc = zlib.crc32(chunk, crc)
    print("grow", i, crc, flush=True)
    time.sleep(0.5)
while not os.path.exists(sys.argv[3]):  # until the test has seen it move (however slow the machine)
    time.sleep(0.2)
for r in range(int(sys.argv[2])):  # then holds it, rewriting a little each round
    c = chunks[r % len(chunks)]
    c[:1 << 20] = random.Random(1000 + r).randbytes(1 << 20)
    print("hold", r, zlib.crc32(c), flush=True)
    time.sleep(0.5)
"""
RIGHT_SIZED = """
nodes:
  - {id: n1, cpus: 2, memory: 1GiB, instance_type: small, zone: local-a, price_per_hour: 0.1}
instance_types:
  - {name: small, zone: local-a, cpus: 2, memory: 1GiB, price_per_hour: 0.1, available: 1}
  - {name: highmem, zone: local-a, cpus: 2, memory: 4GiB, price_per_hour: 0.3, available: 1}
"""


@pytest.fixture
def right_sized(criu_bin: str) -> Iterator[Cluster]:
    yield from provided(RIGHT_SIZED)


def test_a_job_that_outgrows_its_node_gets_one_that_fits_and_its_output_is_identical(right_sized: Cluster,
                                                                                      tmp_path: Path) -> None:
    c = right_sized
    c.json("autoscale", "--min", "1", "--max", "2", "--scale-up-after", "1s", "--scale-down-after", "1h")
    go = tmp_path / "grow-go"  # the job holds its memory, silent, until this file exists
    argv = [sys.executable, "-c", GROWING, "18", "30", str(go)]  # 1.1 GiB: more than n1 has
    want = reference_output([*argv[:-1], "/"])  # the same output, without the wait
    c.json("run", "--name", "grow", "--right-size", "--memory", "128MiB", "--", *argv)
    c.wait_state("grow", "running")
    # its request follows its use, then outgrows n1: a highmem node is launched and it moves there
    launched = wait_until(lambda: [n for n in fleet_nodes(c).values() if n["state"] == "running"], 120,
                          "a node for the outgrown job")
    assert launched[0]["offer"] == "highmem/local-a/on-demand"
    moved = wait_until(lambda: (s := c.json("status", "grow"))["node"] == launched[0]["id"]
                       and s["state"] == "running" and s, 180, "the job to move to the new node",
                       explain=lambda: diagnosis(c, "grow", "n1", launched[0]["id"]))
    assert moved["right_size"] is True and moved["memory_bytes"] > 1 << 30
    assert moved["outgrown"] is False
    go.touch()
    done = c.wait_state("grow", "succeeded", timeout=240)
    assert done["exit_code"] == 0
    assert c.logs("grow") == want
