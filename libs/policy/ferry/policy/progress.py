"""How much a job has run and has left: the scheduler accounts the time a job spends running
(each time it saves the record), and a job submitted with ``--work`` (about how long it computes
to its end) has its remaining work derived from that, which the deadline checks and the SLA-risk
signal use. Pure functions of the record and the time.

The time run counts from each start or restore, so after an interruption it includes the work
that the interruption threw away (the restore went back to an older checkpoint): the remaining
work it gives is then a little low, never high, and the deadline checks add the loss of one
interruption on top of it.
"""

from ferry.common.models import Job, JobState

RUNNING = frozenset({JobState.RUNNING, JobState.CHECKPOINTING})  # the program makes progress


def account(job: Job, now: float) -> None:
    """Updates ``ran_s`` and ``running_since`` for the state ``job`` is saved in."""
    if job.state in RUNNING:
        if job.running_since is None:
            job.running_since = now
    elif job.running_since is not None:
        job.ran_s += max(0.0, now - job.running_since)
        job.running_since = None


def ran_s(job: Job, now: float) -> float:
    """Time the job has run, up to ``now``."""
    return job.ran_s + (max(0.0, now - job.running_since) if job.running_since is not None else 0.0)


def remaining_s(job: Job, now: float) -> float | None:
    """Work left, when the job said how much it has (``--work``); None when it did not."""
    if job.work_s is None:
        return None
    return max(0.0, job.work_s - ran_s(job, now))
