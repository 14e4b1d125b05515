"""End to end under SLURM (issue 13): real munged, slurmctld and three slurmds (Debian's SLURM), the
Ferry SPANK plugin that ./setup.sh built and installed, a real `ferry up` whose nodes have the
SLURM nodes' names, and `ferry slurm bridge`. A `sbatch --ferry` training job that SLURM preempts
(REQUEUE, and CANCEL with GraceTime), requeues, drains, loses with its node, or moves off a node
under a spot notice continues from its checkpoint: its output is that of an uninterrupted run. A
job without --ferry is left alone; bad input is refused by sbatch. Fails, never skips, when SLURM
or the plugin is missing."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, PY, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster, wait_until
from tests.slurm import Slurm, require_slurm, start_slurm, stop_slurm

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

NODES = ["node-1", "node-2", "node-3"]
# fast heartbeats (a lost node is noticed after 3 s); an ended job's checkpoints go 3 s after it ended
FAST = {"FERRY_HEARTBEAT_TIMEOUT_S": "3", "FERRY_HEARTBEAT_INTERVAL_S": "0.5", "FERRY_KEEP_ENDED_S": "3"}
STEPS = 300
TRAIN = [PY, str(WORKLOADS / "train.py"), "--steps", str(STEPS), "--sleep", "0.04", "--width", "512"]


@dataclass
class Both:
    ferry: Cluster
    slurm: Slurm

    def submit(self, name: str, *options: str, script: str = "") -> int:
        """A batch job whose script prints where and how often it started, then trains (bash stays
        its parent, so the script itself is part of what is checkpointed)."""
        path = self.slurm.root / f"{name}.sh"
        path.write_text(script or (
            "#!/bin/bash\n"
            "echo \"started on $SLURMD_NODENAME, restart ${SLURM_RESTART_COUNT:-0}\" >&2\n"
            f"{' '.join(TRAIN)}\n"
            "echo \"train.py exited $?\" >&2\n"))
        return self.slurm.sbatch("-J", name, "-o", str(self.out(name)), "-e", str(self.err(name)), *options, str(path))

    def out(self, name: str) -> Path:
        return self.slurm.root / f"{name}.out"

    def err(self, name: str) -> Path:
        return self.slurm.root / f"{name}.err"

    def lines(self, name: str) -> int:
        try:
            return len(self.out(name).read_text().splitlines())
        except FileNotFoundError:
            return 0

    def finished(self, job_id: int, name: str, timeout: float = 240) -> dict[str, str]:
        try:
            return self.slurm.wait_job(job_id, {"COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "PREEMPTED"},
                                       timeout)
        except AssertionError:
            print(self.diagnose(name))
            raise

    def diagnose(self, name: str) -> str:
        texts = [f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in (self.err(name),) if p.exists()]
        return "\n".join([*texts, self.slurm.logs(),
                          self.ferry.log_tails("scheduler", *[f"checkpointer@{n}" for n in NODES])])


@pytest.fixture(scope="module")
def both(criu_bin: str) -> Iterator[Both]:
    require_slurm()
    ferry = start_cluster(Path(tempfile.mkdtemp(prefix="ferry-slurm-e2e-")), nodes=len(NODES), env=FAST)
    try:
        slurm = start_slurm(ferry.addr, NODES)
    except BaseException:
        stop_cluster(ferry)
        raise
    try:
        slurm.start_bridge()
        yield Both(ferry, slurm)
    finally:
        stop_slurm(slurm)
        stop_cluster(ferry)


def identical(both: Both, name: str) -> None:
    got = both.out(name).read_text()
    want = reference_output(TRAIN)
    assert got == want, f"{name}: {len(got.splitlines())} lines, {len(want.splitlines())} wanted\n{both.diagnose(name)}"


def job_of(both: Both, job_id: int, suffix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = both.ferry.json("status", f"slurm-{job_id}{suffix}")
    return found


def test_a_preempted_job_continues_from_its_checkpoint_after_slurm_requeues_it(both: Both) -> None:
    plain = both.slurm.sbatch("-o", str(both.slurm.root / "plain.out"), "--wrap", "echo plain $SLURM_JOB_ID")
    job = both.submit("pre", "--ferry", "-p", "low")
    wait_until(lambda: both.lines("pre") > 60, 120, "the job's first lines")
    node = both.slurm.job(job)["NodeList"]
    started = both.ferry.json("ps", "--source", "slurm", "-o", "json")
    assert [j["name"] for j in started] == [f"slurm-{job}"]
    assert started[0]["labels"] == {"source": "slurm", "slurm.job": str(job), "slurm.step": "batch"}
    assert started[0]["node"] == node and started[0]["here"]
    # a high-priority job that needs the whole node preempts it (PreemptMode=REQUEUE)
    high = both.slurm.sbatch("-p", "high", "-w", node, "-c", "2", "--wrap", "sleep 60")
    done = both.finished(job, "pre")
    both.slurm.run("scancel", str(high))
    assert done["JobState"] == "COMPLETED" and done["ExitCode"] == "0:0", both.diagnose("pre")
    assert done["Restarts"] == "1" and done["NodeList"] != node
    identical(both, "pre")
    err = both.err("pre").read_text()
    assert f"restoring slurm-{job} from its final checkpoint ck-" in err and "(SLURM restart 1)" in err, err
    status = job_of(both, job)
    assert (status["state"], status["restarts"], status["node"]) == ("succeeded", 1, done["NodeList"])
    # SLURM's view stays SLURM's, and a job without --ferry is left alone
    assert both.slurm.wait_job(plain, {"COMPLETED"})["ExitCode"] == "0:0"
    assert (both.slurm.root / "plain.out").read_text() == f"plain {plain}\n"
    assert f"slurm-{plain}" not in {j["name"] for j in both.ferry.json("ps", "-a", "-o", "json")}


def test_a_step_preempted_with_preempt_mode_cancel_is_requeued_by_ferry_and_continues(both: Both) -> None:
    """PreemptMode=CANCEL with GraceTime signals a step's tasks as soon as the job is chosen (a batch
    script only when slurmctld next checks time limits, up to 30 s later); SLURM cancels rather than
    requeues, so the step's task requeues the job itself once the checkpoint is committed, and the
    step continues from it when the script runs again. The output file is opened for appending:
    nothing is printed twice."""
    script = ("#!/bin/bash\n"
              "echo \"started on $SLURMD_NODENAME, restart ${SLURM_RESTART_COUNT:-0}\" >&2\n"
              f"srun --ferry {' '.join(TRAIN)}\n"
              "echo \"srun exited $?\" >&2\n")
    job = both.submit("cancel", "-p", "lowc", "--open-mode=append", script=script)
    wait_until(lambda: both.lines("cancel") > 60, 120, "the step's first lines")
    assert job_of(both, job, "-step0")["labels"]["slurm.step"] == "0"
    node = both.slurm.job(job)["NodeList"]
    high = both.slurm.sbatch("-p", "high", "-w", node, "-c", "2", "--wrap", "sleep 60")
    done = both.finished(job, "cancel")
    both.slurm.run("scancel", str(high))
    assert (done["JobState"], done["Restarts"]) == ("COMPLETED", "1"), both.diagnose("cancel")
    identical(both, "cancel")
    err = both.err("cancel").read_text()
    assert "SLURM preempted it with PreemptMode=CANCEL, which does not requeue" in err, err
    assert f"restoring slurm-{job}-step0 from its final checkpoint" in err, err


def test_a_requeued_job_whose_checkpoint_does_not_verify_starts_from_scratch_and_says_why(both: Both) -> None:
    job = both.submit("bad", "--ferry", "--open-mode=append")
    wait_until(lambda: both.lines("bad") > 30, 120, "the job's first lines")
    both.slurm.run("scontrol", "requeuehold", str(job))  # an admin's requeue, held: SIGTERM, a final checkpoint
    both.slurm.wait_job(job, {"PENDING"}, 60)
    parked = wait_until(lambda: (s := job_of(both, job))["state"] == "preempted" and s, 60, "the final checkpoint")
    manifests = list((both.ferry.data_dir / "store" / "manifests" / parked["id"]).glob("*.json"))
    assert manifests
    for manifest in manifests:
        manifest.write_bytes(manifest.read_bytes()[:100])  # truncated: no checkpoint of it verifies
    both.slurm.run("scontrol", "release", str(job))
    done = both.finished(job, "bad")
    assert (done["JobState"], done["Restarts"]) == ("COMPLETED", "1"), both.diagnose("bad")
    err = both.err("bad").read_text()
    assert "the checkpoint could not be restored" in err and f"starting from scratch as slurm-{job}-r1" in err, err
    # it ran again from the start, after the lines of the first run
    lines = both.out("bad").read_text().splitlines()
    want = reference_output(TRAIN).splitlines()
    assert lines[-len(want):] == want and lines[0] == want[0], both.diagnose("bad")
    # the checkpoints expire with the SLURM job: the bridge ends the Ferry job nothing will restore,
    # and its checkpoints go keep_ended_s (3 s here) later, from the store too
    gone = wait_until(lambda: (s := job_of(both, job))["state"] == "killed" and not s["last_checkpoint"] and s, 60,
                      "the abandoned Ferry job to end and its checkpoints to expire")
    assert gone["checkpoints"] == 0 and both.ferry.json("checkpoints", f"slurm-{job}") == []
    assert not list((both.ferry.data_dir / "store" / "manifests" / parked["id"]).glob("*.json"))


def test_a_drained_node_sends_its_ferry_jobs_elsewhere_and_a_resume_undrains_ferry(both: Both) -> None:
    job = both.submit("drain", "--ferry")
    wait_until(lambda: both.lines("drain") > 60, 120, "the job's first lines")
    node = both.slurm.job(job)["NodeList"]
    both.slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=maintenance by ops")
    try:
        done = both.finished(job, "drain")
        assert (done["JobState"], done["Restarts"]) == ("COMPLETED", "1"), both.diagnose("drain")
        assert done["NodeList"] != node
        identical(both, "drain")
        err = both.err("drain").read_text()
        assert f"restoring slurm-{job} from its final checkpoint" in err, err
        assert {n["id"]: n["state"] for n in both.ferry.json("nodes")}[node] == "draining"
    finally:
        both.slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
    wait_until(lambda: {n["id"]: n["state"] for n in both.ferry.json("nodes")}[node] == "ready", 30,
               "the bridge to undrain the Ferry node")


def test_a_spot_notice_on_a_ferry_node_drains_it_in_slurm_and_the_job_continues_elsewhere(both: Both) -> None:
    job = both.submit("spot", "--ferry")
    wait_until(lambda: both.lines("spot") > 60, 120, "the job's first lines")
    node = both.slurm.job(job)["NodeList"]
    both.ferry.ferry("chaos", "spot-notice", node, "--in", "10m")  # the node lives on until the module ends
    drained = wait_until(lambda: (n := both.slurm.node(node))["State"].find("DRAIN") >= 0 and n, 30,
                         "the bridge to drain the node in SLURM")
    assert drained["Reason"].startswith("ferry: spot interruption notice"), drained
    done = both.finished(job, "spot")
    assert (done["JobState"], done["Restarts"]) == ("COMPLETED", "1"), both.diagnose("spot")
    assert done["NodeList"] != node
    identical(both, "spot")


def test_a_job_whose_node_dies_continues_from_its_last_periodic_checkpoint(both: Both) -> None:
    job = both.submit("crash", "--ferry", "--ferry-every=2s")
    wait_until(lambda: both.lines("crash") > 80, 120, "the job's first lines")
    wait_until(lambda: job_of(both, job)["last_checkpoint"], 60, "a periodic checkpoint")
    node = both.slurm.job(job)["NodeList"]
    both.ferry.ferry("chaos", "kill-node", node)
    both.slurm.kill_node(node)
    done = both.finished(job, "crash", timeout=300)
    assert (done["JobState"], done["Restarts"]) == ("COMPLETED", "1"), both.diagnose("crash")
    assert done["NodeList"] != node
    identical(both, "crash")
    err = both.err("crash").read_text()
    assert f"restoring slurm-{job} from its newest periodic checkpoint ck-" in err, err


def test_bad_input_is_refused_by_sbatch_and_an_unreachable_ferry_leaves_the_job_running(both: Both) -> None:
    queued = both.slurm.run("squeue", "-h", "-o", "%i").stdout.split()
    bad = both.slurm.run("sbatch", "--ferry-every=10 minutes", "--wrap", "true", check=False)
    assert bad.returncode != 0 and "--ferry-every=10 minutes: not a duration" in bad.stderr, bad.stderr
    assert both.slurm.run("squeue", "-h", "-o", "%i").stdout.split() == queued
    # the task itself, as the plugin starts it, with no Ferry at the address it was given
    env = {**os.environ, "FERRY_ADDR": "127.0.0.1:1", "FERRY_SLURM_ARGV0": "/bin/sh", "FERRY_SLURM_JOB_ID": "7",
           "FERRY_SLURM_STEP_ID": "0", "SLURMD_NODENAME": "node-1", "FERRY_TOKEN": "not-for-the-job"}
    started = time.monotonic()
    ran = subprocess.run([str(BIN / "ferry-slurm-task"), "-c", "echo ran; env | grep -c ^FERRY_ ; exit 3"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 3 and ran.stdout == "ran\n0\n", ran
    assert "Ferry cannot be reached" in ran.stderr and "runs without checkpoints" in ran.stderr
    assert time.monotonic() - started < 15
    # Ferry answers but cannot start it here (a SLURM node that is no Ferry node): it runs, and says why
    env.update(FERRY_ADDR=both.ferry.addr, SLURMD_NODENAME="node-9")
    other = subprocess.run([str(BIN / "ferry-slurm-task"), "-c", "echo ran"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert other.returncode == 0 and other.stdout == "ran\n", other
    assert "no node 'node-9' has joined the cluster" in other.stderr and "runs without checkpoints" in other.stderr
    assert "slurm-7-step0" not in {j["name"] for j in both.ferry.json("ps", "-a", "-o", "json")}
