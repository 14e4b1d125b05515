"""What a `--ferry` SLURM task decides, as pure functions of what SLURM and Ferry say: which
Ferry job it is, whether to start the program or restore it, and whether to requeue the SLURM job
after Ferry stopped it with a checkpoint. `ferry.cli.slurm.task` carries the decisions out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ferry.common.errors import UsageError
from ferry.common.labels import SOURCE_LABEL
from ferry.common.scontrol import SlurmJob

__all__ = ["ACTIVE", "BATCH_STEP", "JobView", "Plan", "SlurmStep", "fresh_name", "labels", "plan", "requeue_reason",
           "restore_line", "workload_env"]

BATCH_STEP = 0xFFFFFFFB  # SLURM_BATCH_SCRIPT: the step id of a batch job's script
ACTIVE = frozenset({"pending", "running", "checkpointing", "restoring", "migrating"})
RESTORABLE = frozenset({"preempted", "failed", "killed"})
# what the task's environment carries for the launcher alone: never handed to the workload
_PRIVATE_PREFIXES = ("FERRY_", "SPANK__SLURM_SPANK_OPTION_ferry", "_SLURM_SPANK_OPTION_ferry")


@dataclass(frozen=True)
class SlurmStep:
    """The step as the SPANK plugin and SLURM describe it in the task's environment."""

    job_id: int
    step_id: int
    restart_count: int
    node: str
    every: str  # --ferry-every ("" for none)
    program: list[str]

    @property
    def step(self) -> str:
        return "batch" if self.step_id == BATCH_STEP else str(self.step_id)

    @property
    def base_name(self) -> str:
        """The Ferry job's name: `slurm-42` for a batch script, `slurm-42-step3` for a step."""
        return f"slurm-{self.job_id}" if self.step_id == BATCH_STEP else f"slurm-{self.job_id}-step{self.step_id}"

    @classmethod
    def from_env(cls, env: Mapping[str, str], args: Sequence[str]) -> SlurmStep:
        def number(name: str, default: int | None = None) -> int:
            value = env.get(name, "")
            if not value and default is not None:
                return default
            try:
                return int(value)
            except ValueError:
                raise UsageError(f"{name}={value!r}: not a number (is this run by the ferry SPANK plugin?)") from None

        argv0 = env.get("FERRY_SLURM_ARGV0", "")
        if not argv0:
            raise UsageError("FERRY_SLURM_ARGV0 is not set: ferry-slurm-task is run by the ferry SPANK plugin "
                             "(sbatch --ferry), not by hand")
        return cls(job_id=number("FERRY_SLURM_JOB_ID"), step_id=number("FERRY_SLURM_STEP_ID"),
                   restart_count=number("SLURM_RESTART_COUNT", 0),
                   node=env.get("FERRY_NODE_ID") or env.get("SLURMD_NODENAME", ""),
                   every=env.get("FERRY_SLURM_EVERY", ""), program=[argv0, *args])


def labels(step: SlurmStep) -> dict[str, str]:
    """The labels of the step's Ferry job: `ferry ps --source slurm`, and how the bridge finds the
    SLURM job of a Ferry job."""
    return {SOURCE_LABEL: "slurm", "slurm.job": str(step.job_id), "slurm.step": step.step}


@dataclass(frozen=True)
class JobView:
    """What the plan needs of a Ferry job."""

    name: str
    state: str
    last_checkpoint: str
    created: float


@dataclass(frozen=True)
class Plan:
    """What to do: run the program as a new Ferry job `name`, restore job `name`, or wait for `name`
    (its earlier run is still active); `why` is the line the job's output gets."""

    action: Literal["run", "restore", "wait"]
    name: str
    why: str


def _ours(step: SlurmStep, jobs: Sequence[JobView]) -> list[JobView]:
    """The Ferry jobs of this SLURM step, oldest first: `slurm-42`, then `slurm-42-r2`, ..."""
    base = step.base_name
    return sorted((j for j in jobs if j.name == base or (j.name.startswith(f"{base}-r") and j.name[len(base) + 2:]
                                                        .isdigit())), key=lambda j: j.created)


def fresh_name(step: SlurmStep, jobs: Sequence[JobView]) -> str:
    """A name no Ferry job has yet: the base name, else `-r<restart count>`, else the next free one."""
    taken = {j.name for j in jobs}
    if step.base_name not in taken:
        return step.base_name
    n = max(step.restart_count, 1)
    while f"{step.base_name}-r{n}" in taken:
        n += 1
    return f"{step.base_name}-r{n}"


def plan(step: SlurmStep, jobs: Sequence[JobView]) -> Plan:
    """The pure decision: given Ferry's jobs, what this start of the SLURM step does."""
    ours = _ours(step, jobs)
    newest = ours[-1] if ours else None
    if step.restart_count == 0 or newest is None:
        why = "" if step.restart_count == 0 else (f"SLURM started it again (restart {step.restart_count}) but Ferry "
                                                  f"holds no job of it: starting from scratch")
        return Plan("run", fresh_name(step, jobs), why)
    if newest.state in ACTIVE:
        return Plan("wait", newest.name, f"{newest.name} is still {newest.state} in Ferry: waiting for it to stop "
                                         f"before it continues here")
    if newest.state in RESTORABLE and newest.last_checkpoint:
        return Plan("restore", newest.name, f"restoring {newest.name} from checkpoint {newest.last_checkpoint} "
                                            f"(SLURM restart {step.restart_count})")
    reason = "it has no checkpoint" if not newest.last_checkpoint else f"it is {newest.state}"
    return Plan("run", fresh_name(step, jobs), f"{newest.name} cannot be restored ({reason}): starting from scratch")


def restore_line(name: str, checkpoint: str, final: bool | None, age_s: float, restart: int) -> str:
    """What the job's output says as it continues: from which checkpoint, and whether it is the final
    one (taken as it stopped) or the newest periodic one (the work done after it runs again)."""
    if final:
        kind = f"its final checkpoint {checkpoint}, taken as it stopped"
    elif final is None:
        kind = f"checkpoint {checkpoint}"
    else:
        kind = (f"its newest periodic checkpoint {checkpoint}, taken {age_s:.0f} s before Ferry saw it stop: "
                f"what it did after that runs again")
    return f"restoring {name} from {kind} (SLURM restart {restart})"


def requeue_reason(job: SlurmJob | None, preempt_mode: str) -> str | None:
    """Why the launcher must requeue its SLURM job once Ferry stopped the job with a checkpoint, or
    None when SLURM already decides what comes next (it requeues, or the job was cancelled).

    - SLURM still runs the job: Ferry parked it (its node was drained, a spot notice came, or a user
      stopped it). Ended now, the batch script would fail; requeued, SLURM starts it elsewhere.
    - SLURM preempts it under PreemptMode=CANCEL, which cancels without requeueing."""
    if job is None:
        return None
    if job.state == "RUNNING" and not job.preempted:
        return "Ferry parked it with a checkpoint; requeued, SLURM starts it again elsewhere"
    if job.preempted and "CANCEL" in preempt_mode:
        return "SLURM preempted it with PreemptMode=CANCEL, which does not requeue; requeued, it continues later"
    return None


def workload_env(env: Mapping[str, str]) -> dict[str, str]:
    """The task's environment without what only the launcher may see (Ferry's address, token and
    the plugin's variables): workloads never get the cluster's credentials."""
    return {k: v for k, v in env.items() if not k.startswith(_PRIVATE_PREFIXES)}
