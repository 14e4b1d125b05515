"""A transition's result: the new job and op, and the effects that carry it out, in order."""

from dataclasses import dataclass, field
from typing import NamedTuple

from ferry.common import wire
from ferry.common.models import Event, Job, Op, OpKind, OpState


@dataclass(frozen=True)
class SaveJob:
    job: Job
    event: str | None = None  # also publish a job event of this kind
    message: str = ""


@dataclass(frozen=True)
class SaveOp:
    op: Op


@dataclass(frozen=True)
class Send:
    """A node command, to the node service of ``cmd.job.node``."""

    service: wire.NodeService
    cmd: wire.NodeCommand


@dataclass(frozen=True)
class Emit:
    event: Event


Effect = SaveJob | SaveOp | Send | Emit


class Placement(NamedTuple):
    """Where a job could go now (``node`` None: nowhere, and ``why``)."""

    node: str | None
    why: str = ""
    gpus: tuple[str, ...] = ()


@dataclass
class Step:
    """Builds a transition's result on copies of the job and op it was given."""

    job: Job
    op: Op
    effects: list[Effect] = field(default_factory=list)

    @classmethod
    def of(cls, job: Job, op: Op) -> "Step":
        return cls(job.clone(), op.clone())

    def save_job(self, event: str | None = None, message: str = "") -> None:
        self.effects.append(SaveJob(self.job.clone(), event, message))

    def save_op(self) -> None:
        self.effects.append(SaveOp(self.op.clone()))

    def send(self, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        self.effects.append(Send(service, cmd))

    def emit(self, event: Event) -> None:
        self.effects.append(Emit(event))

    def finish(self, now: float, *, error: str | None = None, error_code: int = 1, **fields: object) -> None:
        """Ends the op (once: an op that ended stays as it ended), carrying the job as it is now."""
        done = ended(self.op, now, error=error, error_code=error_code, job=self.job, **fields)
        if done is not None:
            self.op = done
            self.save_op()

    def commands(self) -> list[Send]:
        return [e for e in self.effects if isinstance(e, Send)]


def no_op(job: Job, kind: OpKind = OpKind.SUBMIT) -> Op:
    """An op that has ended already: what a step stands on when the job has no op in flight (or
    its record is gone), so that ending it changes nothing."""
    return Op(id=job.op or "none", kind=kind, job=job.id, state=OpState.DONE)


def ended(op: Op, now: float, *, error: str | None = None, error_code: int = 1, job: Job | None = None,
          **fields: object) -> Op | None:
    """`op` as it ends (in `error`, if given), with `job` as the op leaves it; None when it had
    ended already (an op ends once)."""
    if op.finished:
        return None
    out = op.clone()
    for key, value in fields.items():
        setattr(out, key, value)
    out.state = OpState.FAILED if error else OpState.DONE
    out.error = error
    out.error_code = error_code if error else 0
    out.error_kind = ""
    out.total_ms = (now - out.created) * 1000
    out.job_record = job.clone() if job is not None else None
    return out


def derived_id(prefix: str, op_id: str) -> str:
    """An id that is the same every time the same op is handled (op-abc123 -> ck-abc123)."""
    return f"{prefix}-{op_id.split('-', 1)[-1]}"


def next_checkpoint_at(job: Job, now: float) -> float | None:
    """When the job's next periodic checkpoint is due, counted from `now`."""
    return now + job.checkpoint_every_s if job.checkpoint_every_s > 0 else None
