"""`ferry-slurm-task`: what a SLURM task runs instead of its program when the step asked for
`--ferry` (the SPANK plugin in deploy/slurm swaps it in; the program's argv[0] arrives in
FERRY_SLURM_ARGV0, the rest of its arguments as ours).

First start of the job: the program runs as `ferry run --here` (a Ferry job named after the SLURM
job, labelled source=slurm, the task's descendant, in the step's cgroups), checkpointed every
`--ferry-every` and on SIGTERM (preemption, requeue, scancel) before it stops. A start after a
requeue (SLURM_RESTART_COUNT > 0) restores the job's newest checkpoint in place (`ferry restore
--here`) instead of starting the program over. When Ferry stopped the job with a checkpoint and
SLURM will not start it again by itself (a drained node, a spot notice, PreemptMode=CANCEL), the
task requeues its SLURM job (`ferry.cli.slurm.plan.requeue_reason`).

Never fails because of Ferry: when Ferry cannot be reached, the program runs as SLURM would run it
(and says so on stderr); when the checkpoint cannot be restored, it starts from scratch as a new
Ferry job and says why. One thing wins over that: a job never runs twice, so a start whose Ferry
job is still running elsewhere waits for Ferry to see it stop (its node lost or the job parked),
and gives up (exit 1) rather than run a second copy.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from ferry.cli.slurm.plan import (
    ACTIVE,
    JobView,
    Plan,
    SlurmStep,
    fresh_name,
    labels,
    plan,
    requeue_reason,
    restore_line,
    workload_env,
)
from ferry.common.errors import FerryError
from ferry.common.scontrol import Scontrol, SlurmError

__all__ = ["main", "run"]

WAIT_ACTIVE_S = 180.0  # how long a restart waits for the job's earlier run to be seen stopped
WAIT_POLL_S = 1.0
CONNECT_S = 3.0  # a Ferry that does not answer in this long is not there: the job runs without it


def _say(line: str) -> None:
    print(f"ferry: {line}", file=sys.stderr, flush=True)


def _exec_plain(step: SlurmStep, why: str) -> NoReturn:
    """Runs the program as SLURM would have, replacing this process."""
    _say(f"{why}: SLURM job {step.job_id} runs without checkpoints")
    env = workload_env(os.environ)
    program = shutil.which(step.program[0], path=env.get("PATH")) or step.program[0]
    os.execve(program, step.program, env)


def _views(client: object) -> list[JobView]:
    from ferry.cli.client import Client
    from ferry.v1 import ferry_pb2 as pb

    assert isinstance(client, Client)
    jobs = client.call(client.stub.ListJobs, pb.ListJobsRequest(all=True), timeout=10.0).jobs
    return [JobView(j.name, j.state, j.last_checkpoint, j.created) for j in jobs]


def _restore_why(client: object, name: str, restart: int) -> str:
    """The line the output gets before a restore: which checkpoint, final or periodic."""
    from ferry.cli.client import Client
    from ferry.v1 import ferry_pb2 as pb

    assert isinstance(client, Client)
    job = client.call(client.stub.GetJob, pb.JobRef(job=name), timeout=10.0)
    try:
        found = [c for c in client.call(client.stub.ListCheckpoints, pb.JobRef(job=name), timeout=10.0).checkpoints
                 if c.id == job.last_checkpoint]
    except FerryError:
        found = []
    if not found:
        return restore_line(name, job.last_checkpoint, None, 0.0, restart)
    return restore_line(name, job.last_checkpoint, found[0].final, max(0.0, job.updated - found[0].created), restart)


def _here_args(step: SlurmStep, action: str, name: str) -> list[str]:
    common = ["--here", "--node", step.node, "--checkpoint-on-term"]
    if action == "restore":
        # SLURM opened the output file again (truncated, its default): print the output from the start
        out = os.fstat(sys.stdout.fileno())
        replay = stat.S_ISREG(out.st_mode) and out.st_size == 0
        return ["restore", name, *common, *(["--replay-output"] if replay else [])]
    env = workload_env(os.environ)
    return ["run", "--name", name, *common, *(["--checkpoint-every", step.every] if step.every else []),
            *[f"--label={k}={v}" for k, v in labels(step).items()],
            *[f"--env={k}={v}" for k, v in sorted(env.items())], "--", *step.program]


def _requeue_if_needed(step: SlurmStep, slurm: Scontrol) -> None:
    """After Ferry stopped the job with a checkpoint: requeue the SLURM job when SLURM would not."""
    try:
        job = slurm.job(step.job_id)
        mode = slurm.preempt_mode(job.partition) if job is not None and job.preempted else ""
        why = requeue_reason(job, mode)
        if why is not None:
            _say(f"requeueing SLURM job {step.job_id}: {why}")
            slurm.requeue(step.job_id)
    except SlurmError as exc:
        _say(f"could not requeue SLURM job {step.job_id} ({exc}); `scontrol requeue {step.job_id}` continues it "
             f"from its checkpoint")


def _start(step: SlurmStep, client: object, decided: Plan) -> int:
    from ferry.cli import commands
    from ferry.cli.client import Client
    from ferry.cli.here import restore_here, run_here
    from ferry.cli.main import parse_args

    assert isinstance(client, Client)
    if decided.action == "restore":
        args = parse_args(_here_args(step, "restore", decided.name))
        commands.validate_here(args)
        try:
            return restore_here(client, args)
        except FerryError as exc:
            if any(j.name == decided.name and j.state in ACTIVE for j in _views(client)):
                raise  # it came back somewhere: never a second copy
            decided = Plan("run", fresh_name(step, _views(client)), "")
            _say(f"the checkpoint could not be restored ({exc}): starting from scratch as {decided.name}")
    args = parse_args(_here_args(step, "run", decided.name))
    commands.validate_here(args)
    commands.validate_run(args)
    try:
        return run_here(client, args)
    except FerryError as exc:
        try:
            started = any(j.name == decided.name and j.state in ACTIVE for j in _views(client))
        except FerryError:
            started = False
        if started:
            raise
        return _exec_plain(step, f"Ferry could not start it ({exc})")


def run(step: SlurmStep, slurm: Scontrol | None = None) -> int:
    from ferry.cli.client import Client, default_addr
    from ferry.cli.here import STOPPED_EXIT

    if not step.node:
        return _exec_plain(step, "neither FERRY_NODE_ID nor SLURMD_NODENAME names this node")
    try:
        client = Client(default_addr(), connect_timeout=CONNECT_S)
        jobs = _views(client)
    except FerryError as exc:
        return _exec_plain(step, f"Ferry cannot be reached ({exc})")
    deadline = time.monotonic() + WAIT_ACTIVE_S
    decided = plan(step, jobs)
    while decided.action == "wait":
        if time.monotonic() > deadline:
            _say(f"{decided.why}; gave up after {WAIT_ACTIVE_S:.0f} s rather than run it twice "
                 f"(`ferry status {decided.name}`)")
            return 1
        time.sleep(WAIT_POLL_S)
        decided = plan(step, _views(client))
    if decided.action == "restore":
        _say(_restore_why(client, decided.name, step.restart_count))
    elif decided.why:
        _say(decided.why)
    code = _start(step, client, decided)
    if code == STOPPED_EXIT:
        _requeue_if_needed(step, slurm or Scontrol())
    return code


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        step = SlurmStep.from_env(os.environ, args)
    except FerryError as exc:
        print(f"ferry-slurm-task: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    try:
        code = run(step)
    except FerryError as exc:
        _say(str(exc))
        code = exc.exit_code
    sys.exit(code)
