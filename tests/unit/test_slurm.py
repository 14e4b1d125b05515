"""Ferry under SLURM, its pure parts: reading scontrol's and squeue's output, what a `--ferry` task
decides (start, restore, wait; requeue after a stop), and what the bridge does about what it read."""

import pytest

from ferry.cli.slurm.bridge import Action, Bridge, FerryJob, FerryNode, reconcile
from ferry.cli.slurm.plan import (
    BATCH_STEP,
    JobView,
    SlurmStep,
    labels,
    plan,
    requeue_reason,
    restore_line,
    workload_env,
)
from ferry.common.errors import FerryError, UsageError
from ferry.common.scontrol import SlurmJob, SlurmNode, parse_job, parse_nodes, parse_preempt_mode, parse_queue

# what Debian's SLURM 22.05 printed here (one line each, shortened where nothing is read)
NODES = (
    "NodeName=node-1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=2 NodeHostName=vm Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1 State=IDLE+DRAIN ThreadsPerCore=1 "
    "Partitions=low,high  CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= ExtSensorsTemp=n/s "
    "Reason=maint by admin x=1 [root@2026-12-03T06:56:33]\n"
    "NodeName=node-2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=1 State=MIXED ThreadsPerCore=1 ExtSensorsTemp=n/s\n"
    "NodeName=node-3 State=IDLE*+DRAIN+NOT_RESPONDING Reason=ferry: spot interruption notice [root@2026-12-03T07:00]\n"
)
JOB = ("JobId=42 JobName=train.sh UserId=root(0) Priority=4294901759 JobState=COMPLETING Reason=None "
       "Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 RunTime=00:00:27 PreemptEligibleTime=2026-12-03T06:51:01 "
       "PreemptTime=2026-12-03T06:51:28 SuspendTime=None Partition=low NodeList=node-1 Command=/tmp/x/train.sh\n")


def test_nodes_are_read_with_their_state_flags_and_the_reason_an_admin_gave() -> None:
    one, two, three = parse_nodes(NODES)
    assert (one.name, one.state, one.flags) == ("node-1", "IDLE", frozenset({"DRAIN"}))
    assert one.reason == "maint by admin x=1"
    assert one.drained and not one.drained_by_ferry
    assert (two.state, two.drained, two.reason) == ("MIXED", False, "")
    assert three.state == "IDLE" and three.drained_by_ferry and "NOT_RESPONDING" in three.flags


def test_a_job_its_preemption_the_queue_and_a_partitions_preempt_mode() -> None:
    job = parse_job(JOB)
    assert job == SlurmJob(id=42, state="COMPLETING", partition="low", restarts=1, preempted=True)
    assert parse_job(JOB.replace("PreemptTime=2026-12-03T06:51:28", "PreemptTime=None")).preempted is False  # type: ignore[union-attr]
    assert parse_job("") is None
    queue = parse_queue("42|RUNNING\n43|PENDING\n44_2|completed\nbad\n")
    assert queue == {42: "RUNNING", 43: "PENDING", 44: "COMPLETED"}
    assert parse_preempt_mode("PartitionName=low GraceTime=20 PreemptMode=CANCEL State=UP\n") == "CANCEL"


def step(restart: int = 0, step_id: int = BATCH_STEP) -> SlurmStep:
    return SlurmStep(job_id=42, step_id=step_id, restart_count=restart, node="node-1", every="", program=["/s.sh"])


def test_a_step_is_read_from_the_plugins_environment() -> None:
    env = {"FERRY_SLURM_ARGV0": "/spool/job00042/slurm_script", "FERRY_SLURM_JOB_ID": "42",
           "FERRY_SLURM_STEP_ID": str(BATCH_STEP), "SLURM_RESTART_COUNT": "2", "SLURMD_NODENAME": "node-2",
           "FERRY_SLURM_EVERY": "10m"}
    s = SlurmStep.from_env(env, ["a", "b"])
    assert (s.base_name, s.restart_count, s.node, s.every, s.program) == (
        "slurm-42", 2, "node-2", "10m", ["/spool/job00042/slurm_script", "a", "b"])
    assert labels(s) == {"source": "slurm", "slurm.job": "42", "slurm.step": "batch"}
    assert SlurmStep.from_env({**env, "FERRY_SLURM_STEP_ID": "3"}, []).base_name == "slurm-42-step3"
    with pytest.raises(UsageError, match="run by the ferry SPANK plugin"):
        SlurmStep.from_env({}, [])
    with pytest.raises(UsageError, match="FERRY_SLURM_JOB_ID='x': not a number"):
        SlurmStep.from_env({**env, "FERRY_SLURM_JOB_ID": "x"}, [])


def test_the_first_start_runs_and_a_restart_restores_waits_or_starts_over() -> None:
    assert plan(step(), []).action == "run" and plan(step(), []).name == "slurm-42"
    parked = JobView("slurm-42", "preempted", "ck-1", 1.0)
    decided = plan(step(1), [parked])
    assert (decided.action, decided.name) == ("restore", "slurm-42") and "ck-1" in decided.why
    assert plan(step(1), [JobView("slurm-42", "running", "ck-1", 1.0)]).action == "wait"
    fresh = plan(step(1), [JobView("slurm-42", "preempted", "", 1.0)])
    assert (fresh.action, fresh.name) == ("run", "slurm-42-r1") and "no checkpoint" in fresh.why
    # the newest of the step's Ferry jobs counts; another job's name never does
    newer = [parked, JobView("slurm-42-r1", "succeeded", "", 2.0), JobView("slurm-420", "preempted", "ck-9", 3.0)]
    assert plan(step(2), newer) == plan(step(2), newer[:2])
    assert plan(step(2), newer).name == "slurm-42-r2"
    assert plan(step(1), []).why.startswith("SLURM started it again (restart 1) but Ferry holds no job of it")


@pytest.mark.parametrize(
    ("job", "mode", "requeues"),
    [
        (SlurmJob(42, "RUNNING", "low", 0, preempted=False), "", True),  # Ferry parked it (drain, spot notice)
        (SlurmJob(42, "COMPLETING", "low", 0, preempted=True), "CANCEL", True),  # CANCEL does not requeue
        (SlurmJob(42, "COMPLETING", "low", 0, preempted=True), "REQUEUE", False),  # SLURM requeues it itself
        (SlurmJob(42, "COMPLETING", "low", 0, preempted=False), "", False),  # scancel, time limit, scontrol requeue
        (None, "", False),
    ],
)
def test_the_task_requeues_only_what_slurm_would_not(job: SlurmJob | None, mode: str, requeues: bool) -> None:
    assert (requeue_reason(job, mode) is not None) is requeues


def test_the_output_says_whether_it_continues_from_a_final_or_a_periodic_checkpoint() -> None:
    assert restore_line("slurm-42", "ck-1", True, 0.0, 1) == (
        "restoring slurm-42 from its final checkpoint ck-1, taken as it stopped (SLURM restart 1)")
    assert restore_line("slurm-42", "ck-2", False, 12.4, 2) == (
        "restoring slurm-42 from its newest periodic checkpoint ck-2, taken 12 s before Ferry saw it stop: what "
        "it did after that runs again (SLURM restart 2)")
    assert restore_line("slurm-42", "ck-3", None, 0.0, 1) == "restoring slurm-42 from checkpoint ck-3 (SLURM restart 1)"


def test_the_workload_never_sees_ferrys_address_token_or_the_plugins_variables() -> None:
    env = {"PATH": "/bin", "SLURM_JOB_ID": "42", "FERRY_TOKEN": "secret", "FERRY_ADDR": "x:1",
           "SPANK__SLURM_SPANK_OPTION_ferry_ferry": "", "_SLURM_SPANK_OPTION_ferry_ferry_every": "10m"}
    assert workload_env(env) == {"PATH": "/bin", "SLURM_JOB_ID": "42"}


def node(name: str, *flags: str, reason: str = "", state: str = "IDLE") -> SlurmNode:
    return SlurmNode(name, state, frozenset(flags), reason)


def test_a_slurm_drain_drains_ferry_and_a_resume_undrains_it() -> None:
    actions, mirrored = reconcile([node("n1", "DRAIN", reason="disk"), node("n2")],
                                  [FerryNode("n1", "ready"), FerryNode("n2", "ready")], [], {}, set())
    assert actions == [Action("drain_ferry", "n1", "drained in SLURM: disk")] and mirrored == {"n1"}
    actions, mirrored = reconcile([node("n1", "DRAIN", reason="disk")], [FerryNode("n1", "draining")], [], {}, mirrored)
    assert actions == [] and mirrored == {"n1"}  # nothing more while it drains
    actions, mirrored = reconcile([node("n1")], [FerryNode("n1", "draining")], [], {}, mirrored)
    assert actions == [Action("undrain_ferry", "n1", "resumed in SLURM")] and mirrored == set()


def test_a_spot_notice_or_a_ferry_drain_drains_slurm_and_its_end_resumes_it() -> None:
    actions, _ = reconcile([node("n1"), node("n2")], [FerryNode("n1", "preempting"), FerryNode("n2", "draining")],
                           [], {}, set())
    assert [(a.kind, a.target) for a in actions] == [("drain_slurm", "n1"), ("drain_slurm", "n2")]
    assert actions[0].why.startswith("ferry: spot interruption notice") and actions[1].why == "ferry: drained in Ferry"
    ours = node("n1", "DRAIN", reason=actions[0].why)
    assert reconcile([ours], [FerryNode("n1", "preempting")], [], {}, set())[0] == []  # not mirrored back
    assert reconcile([ours], [FerryNode("n1", "ready")], [], {}, set())[0] == [
        Action("resume_slurm", "n1", "Ferry's reason to drain it is gone")]
    # a lost Ferry node, or a SLURM node Ferry does not know, is SLURM's own business
    assert reconcile([node("n1"), node("x", "DRAIN")], [FerryNode("n1", "lost")], [], {}, set())[0] == []


def test_parked_ferry_jobs_of_ended_slurm_jobs_are_ended() -> None:
    jobs = [FerryJob.of("slurm-1", "preempted", {"source": "slurm", "slurm.job": "1"}),
            FerryJob.of("slurm-2", "preempted", {"source": "slurm", "slurm.job": "2"}),
            FerryJob.of("slurm-3", "preempted", {"source": "slurm", "slurm.job": "3"}),
            FerryJob.of("slurm-4", "running", {"source": "slurm", "slurm.job": "4"}),
            FerryJob.of("mine", "preempted", {"slurm.job": "5"})]
    actions, _ = reconcile([], [], jobs, {2: "PENDING", 3: "CANCELLED"}, set())
    assert [(a.kind, a.target) for a in actions] == [("end_ferry_job", "slurm-1"), ("end_ferry_job", "slurm-3")]
    assert "no longer known to SLURM" in actions[0].why and "(cancelled)" in actions[1].why
    assert reconcile([], [], jobs, None, set())[0] == []  # an unread queue ends nothing


class FakeFerry:
    def __init__(self, nodes: dict[str, str], fail: int = 0) -> None:
        self.states, self.fail = nodes, fail
        self.done: list[tuple[str, str]] = []

    def nodes(self) -> list[FerryNode]:
        return [FerryNode(n, s) for n, s in self.states.items()]

    def jobs(self) -> list[FerryJob]:
        return []

    def drain(self, node: str, undo: bool) -> None:
        if self.fail:
            self.fail -= 1
            raise FerryError("the API is restarting")
        self.states[node] = "ready" if undo else "draining"
        self.done.append(("undrain" if undo else "drain", node))

    def end(self, job: str) -> None:
        self.done.append(("end", job))


class FakeSlurm:
    def __init__(self, drained: dict[str, str]) -> None:
        self.drained = drained  # node -> reason

    def nodes(self) -> list[SlurmNode]:
        return [node(n, "DRAIN", reason=self.drained[n]) if n in self.drained else node(n) for n in ("n1", "n2")]

    def queue(self, job_ids: object) -> dict[int, str]:
        return {}

    def drain(self, name: str, reason: str) -> None:
        self.drained[name] = reason

    def resume(self, name: str) -> None:
        self.drained.pop(name, None)


def test_a_restarted_bridge_still_undrains_what_it_drained_and_a_failed_action_is_tried_again() -> None:
    ferry, slurm = FakeFerry({"n1": "ready", "n2": "ready"}, fail=1), FakeSlurm({"n1": "disk"})
    assert [a.kind for a in Bridge(ferry, slurm).round()] == ["drain_ferry"] and ferry.done == []  # it failed
    first = Bridge(ferry, slurm)
    first.round()
    assert ferry.done == [("drain", "n1")]
    restarted = Bridge(ferry, slurm)  # knows nothing but what SLURM and Ferry show
    assert restarted.round() == []
    slurm.resume("n1")
    restarted.round()
    assert ferry.done == [("drain", "n1"), ("undrain", "n1")] and ferry.states["n1"] == "ready"
    # a Ferry-side drain goes to SLURM with Ferry's reason, and back when Ferry undrains
    ferry.states["n2"] = "draining"
    restarted.round()
    assert slurm.drained == {"n2": "ferry: drained in Ferry"}
    ferry.states["n2"] = "ready"
    restarted.round()
    assert slurm.drained == {}
