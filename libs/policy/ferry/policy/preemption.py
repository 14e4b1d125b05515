"""Preempt-and-save: which lower-priority jobs to park (with a final checkpoint) so that a job
that must leave its node fits elsewhere."""

from collections.abc import Sequence

from ferry.common.models import Job, JobState
from ferry.policy.decisions import JobView, NodeView


def victims(job: JobView, jobs: Sequence[Job], views: Sequence[NodeView], exclude: str) -> tuple[str, list[Job]] | None:
    """The first usable node (by id, `exclude` aside) where parking the fewest lower-priority jobs,
    lowest priority and youngest first, makes room for `job`, and those jobs; None when no set of
    lower-priority jobs on any node would. `views` count the capacity `jobs` hold."""
    for view in sorted((v for v in views if v.usable and v.id != exclude), key=lambda v: v.id):
        candidates = sorted((j for j in jobs if j.node == view.id and j.priority < job.priority
                             and j.state in (JobState.RUNNING, JobState.CHECKPOINTING)),
                            key=lambda j: (j.priority, -j.created))
        free_c, free_m, free_g = view.free_cpus, view.free_memory_bytes, view.free_gpus
        chosen: list[Job] = []
        for victim in candidates:
            if free_c >= job.cpus and free_m >= job.memory_bytes and free_g >= job.gpus:
                break
            chosen.append(victim)
            free_c, free_m, free_g = free_c + victim.cpus, free_m + victim.memory_bytes, free_g + victim.gpus
        if chosen and free_c >= job.cpus and free_m >= job.memory_bytes and free_g >= job.gpus:
            return view.id, chosen
    return None
