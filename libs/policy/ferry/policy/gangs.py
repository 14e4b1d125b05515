"""Gangs: jobs that talk to each other over TCP and so are checkpointed, restored and failed over
as one (``ferry run --gang G``). The checks before a gang operation starts, and where a gang's
members go, as pure functions; the scheduler runs them, and so do the API's dry runs.

Why a gang checkpoint is consistent: every member's network is locked (its link to the node taken
down) before any member is dumped, and stays locked until every dump ended. Nothing crosses between
members in that window, so what each member's kernel acknowledged it had received before the lock,
and what it sent and was not acknowledged is in its dumped send queue: restored together, the
members' TCP stacks retransmit exactly what was in flight. Each member is frozen only for its own
dump, and the members dump in parallel: the gang's freeze is the slowest member's.
"""

from collections.abc import Iterable, Sequence

from ferry.common.errors import ConflictError, NotFoundError, UsageError
from ferry.common.models import BUSY_STATES, GangCheckpoint, Job, JobState

__all__ = ["assign_nodes", "gang_checkpointable", "gang_members", "gang_restorable", "newest_group"]


def gang_members(jobs: Iterable[Job], gang: str) -> list[Job]:
    """The gang's jobs that have not ended for good (killed members are left out), by name."""
    return sorted((j for j in jobs if j.gang == gang and j.state not in (JobState.SUCCEEDED, JobState.KILLED)),
                  key=lambda j: j.name)


def _none_found(gang: str) -> NotFoundError:
    return NotFoundError(f"no gang {gang!r}: `ferry ps` shows each job's gang; `ferry run --gang {gang}` makes one")


def gang_checkpointable(gang: str, members: Sequence[Job]) -> None:
    """Every member runs and nothing else happens to any: else nobody is frozen."""
    if not members:
        raise _none_found(gang)
    for job in members:
        if job.state == JobState.PENDING or (job.state == JobState.RUNNING and not job.node):
            raise ConflictError(f"gang {gang}: member {job.name} is still starting; checkpoint the gang once "
                                f"`ferry ps` shows every member running")
        if job.state in BUSY_STATES or job.op:
            raise ConflictError(f"gang {gang}: member {job.name} is busy ({job.state}, op {job.op}); try again "
                                f"when it is done")
        if job.state != JobState.RUNNING:
            raise ConflictError(f"gang {gang}: member {job.name} is {job.state}: a group checkpoint needs every "
                                f"member running (`ferry restore --gang {gang}` brings a stopped gang back)")


def newest_group(groups: Iterable[GangCheckpoint], members: Sequence[Job]) -> GangCheckpoint | None:
    """The newest group checkpoint that holds every member now in the gang."""
    ids = {j.id for j in members}
    usable = [g for g in groups if ids <= set(g.members)]
    return max(usable, key=lambda g: g.created, default=None)


def gang_restorable(gang: str, members: Sequence[Job], group: GangCheckpoint | None) -> GangCheckpoint:
    """A restore of the whole gang: every member stopped, and a group checkpoint holding them all."""
    if not members:
        raise _none_found(gang)
    for job in members:
        if job.state in BUSY_STATES or job.op:
            raise ConflictError(f"gang {gang}: member {job.name} is busy ({job.state}, op {job.op}); try again "
                                f"when it is done")
        if job.state == JobState.RUNNING:
            raise ConflictError(f"gang {gang}: member {job.name} is running on {job.node}: stop the gang first "
                                f"(`ferry checkpoint --gang {gang} --stop`)")
        if job.state == JobState.PENDING:
            raise ConflictError(f"gang {gang}: member {job.name} never started: there is nothing to restore")
    if group is None:
        raise ConflictError(f"gang {gang} has no committed group checkpoint: `ferry checkpoint --gang {gang}` "
                            f"makes one while every member runs")
    return group


def assign_nodes(members: Sequence[Job], nodes: Sequence[str], *, allow_colocate: bool) -> dict[str, str]:
    """The user's ``--nodes`` for a gang's restore, in member order (by name): job id -> node.
    Refused when members would share a node and the user did not allow it."""
    if not nodes:
        return {}
    if not allow_colocate:
        if len(set(nodes)) != len(nodes):
            raise UsageError("--nodes names a node twice: members would share it; add --allow-colocate "
                             "if they may")
        if len(nodes) < len(members):
            raise UsageError(f"the gang has {len(members)} members and --nodes names {len(nodes)} node(s): name "
                             f"{len(members)}, or add --allow-colocate to let members share nodes")
    elif len(nodes) < 1:
        raise UsageError("--nodes: name at least one node")
    return {job.id: nodes[i % len(nodes)] for i, job in enumerate(members)}
