"""Whether a job's state lets an action start now: the scheduler's checks before it begins an
operation, which the API's dry runs (Plan) run too, so a dry run is refused as the call would be.
Each raises ConflictError with the sentence the user sees, or returns."""

from ferry.common.errors import ConflictError
from ferry.common.models import BUSY_STATES, Job, JobState


def require_idle(job: Job, what: str) -> None:
    if job.state in BUSY_STATES or job.op:
        raise ConflictError(f"job {job.name} is busy ({job.state}, op {job.op}); try the {what} "
                            f"again when it is done")


def checkpointable(job: Job) -> None:
    """A user's checkpoint: only of a running job that nothing else is happening to."""
    require_idle(job, "checkpoint")
    if job.state != JobState.RUNNING:
        raise ConflictError(f"job {job.name} is {job.state}: only a running job can be checkpointed")


def restorable(job: Job, checkpoint_id: str | None) -> str:
    """The checkpoint a restore of ``job`` starts from (the one asked for, else its newest)."""
    require_idle(job, "restore")
    if job.state == JobState.RUNNING:
        raise ConflictError(f"job {job.name} is running on {job.node}: use `ferry migrate {job.name} "
                            f"--to NODE`, or `ferry checkpoint {job.name} --stop` first")
    if job.state in (JobState.PENDING, JobState.SUCCEEDED):
        raise ConflictError(f"job {job.name} is {job.state}: there is nothing to restore")
    ckpt_id = checkpoint_id or job.last_checkpoint
    if not ckpt_id:
        raise ConflictError(f"job {job.name} has no committed checkpoint to restore")
    return ckpt_id


def migratable(job: Job) -> None:
    require_idle(job, "migrate")
    if job.state != JobState.RUNNING:
        raise ConflictError(f"job {job.name} is {job.state}: only a running job can be migrated "
                            f"(use `ferry restore` for a stopped one)")
    if job.supervised_elsewhere:
        raise ConflictError(f"job {job.name} runs under its own supervisor on {job.node} (`--here` or "
                            f"adopted), which owns it: `ferry checkpoint {job.name} --stop`, then `ferry restore "
                            f"{job.name} --node NODE` moves it")


def not_there(job: Job, target: str) -> None:
    if target == job.node:
        raise ConflictError(f"job {job.name} runs on {target} already")


def live_movable(job: Job) -> None:
    if job.container:
        raise ConflictError(f"job {job.name} is a container: live moves of containers are not built; drop --live")
    if job.gpu_uuids:
        raise ConflictError(f"job {job.name} uses GPUs: CUDA state cannot be served lazily; drop --live")
