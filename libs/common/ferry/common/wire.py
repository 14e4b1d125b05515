"""Wire formats on the bus, as pure functions: subject names, headers and message bodies.

Subjects (all under `ferry.`):
    cmd.scheduler                       API -> scheduler commands (work queue)
    cmd.node.<node>.<service>           scheduler -> checkpointer / migrator commands (work queue)
    evt.node.<node>.<kind>              node services -> scheduler (stream, durable consumer)
    evt.job.<job>.<kind>                scheduler -> anyone (user-visible events)
    evt.cluster.<kind>[.<key>]          health, pricing -> anyone (a node lost, a price changed)
    progress.<op>                       node -> API progress of a long op (core NATS, not stored)
    rpc.node.<node>.logs                API -> node log reads (core NATS request/reply)
"""

import json
import re
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from ferry.common.errors import FerryError
from ferry.common.jobnet import PortMap
from ferry.common.models import DEFAULT_TENANT, CheckpointRecord, Job, Network, OpKind, new_id, now
from ferry.common.moves import LiveReport, NodeOptions, PageSource
from ferry.common.record import Record
from ferry.common.sealing import SealedEnv

CMD_STREAM = "FERRY_CMD"
EVT_STREAM = "FERRY_EVT"
AUDIT_STREAM = "FERRY_AUDIT"
AUDIT_SUBJECTS = "ferry.audit.>"
AUDIT_MAX_AGE_S = 90 * 86400
CMD_SUBJECTS = "ferry.cmd.>"
EVT_SUBJECTS = "ferry.evt.>"
KV_JOBS = "ferry_jobs"
KV_NODES = "ferry_nodes"
KV_CHECKPOINTS = "ferry_ckpts"
KV_OPS = "ferry_ops"
KV_SERVICES = "ferry_services"
KV_PRICES = "ferry_prices"
KV_GANGS = "ferry_gangs"
KV_AUTOSCALE = "ferry_autoscale"  # the policy `ferry autoscale` sets, key "policy"
KV_FLEET = "ferry_fleet"  # the nodes the autoscaler launched or retires

SCHEDULER_CMD = "ferry.cmd.scheduler"
NODE_EVENTS = "ferry.evt.node.>"

NodeService = Literal["checkpointer", "migrator"]

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
MSG_ID_HEADER = "Nats-Msg-Id"


class WireError(FerryError):
    """A message on the bus that does not decode into what its subject promises."""


def is_token(value: str) -> bool:
    """Whether `value` can be one subject token (and so a job, node or checkpoint id)."""
    return _TOKEN.fullmatch(value) is not None  # not match(): "$" also matches before a final newline


def token(value: str) -> str:
    """`value` checked as one subject token (no dots, spaces or wildcards)."""
    if not is_token(value):
        raise WireError(f"{value!r} cannot be used in a subject: use letters, digits, '-' and '_'")
    return value


def node_cmd_subject(node: str, service: NodeService) -> str:
    return f"ferry.cmd.node.{token(node)}.{service}"


def node_event_subject(node: str, kind: str) -> str:
    return f"ferry.evt.node.{token(node)}.{token(kind)}"


def job_event_subject(job: str, kind: str) -> str:
    return f"ferry.evt.job.{token(job)}.{token(kind)}"


JOB_EVENTS_PREFIX = "ferry.evt.job."
CLUSTER_EVENTS_PREFIX = "ferry.evt.cluster."


def cluster_event_subject(kind: str, key: str | None = None) -> str:
    """A cluster-wide event (`ferry events` streams them with the jobs' ones); `key` names what
    it is about (a node, a price), any dots in it made underscores."""
    base = f"{CLUSTER_EVENTS_PREFIX}{token(kind)}"
    return f"{base}.{token(key.replace('.', '_'))}" if key is not None else base


def is_user_event(subject: str) -> bool:
    """Whether `subject` carries an event for people and tools (a job's or the cluster's)."""
    return subject.startswith((JOB_EVENTS_PREFIX, CLUSTER_EVENTS_PREFIX))


def audit_subject(tenant: str) -> str:
    return f"ferry.audit.{token(tenant)}"


def progress_subject(op: str) -> str:
    return f"ferry.progress.{token(op)}"


def logs_subject(node: str) -> str:
    return f"ferry.rpc.node.{token(node)}.logs"


def ckpt_key(job: str, checkpoint: str) -> str:
    return f"{token(job)}.{token(checkpoint)}"


def gang_key(gang: str, checkpoint: str) -> str:
    return f"{token(gang)}.{token(checkpoint)}"


class JobSpec(Record):
    name: str
    tenant: str = DEFAULT_TENANT
    argv: list[str]
    env: SealedEnv = Field(default_factory=SealedEnv)
    cwd: str = "/"
    node: str | None = None
    checkpoint_every_s: float = 0.0
    priority: int = 0
    cpus: float = 0.0
    memory_bytes: int = 0
    gpus: int = 0
    deadline: float | None = None
    max_downtime_s: float | None = None
    work_s: float | None = None
    gpu_model: str | None = None
    gpu_memory_bytes: int = 0
    gpu_shared: bool = False
    network: Network = Network.HOST
    here: bool = False
    adopt_pid: int | None = None
    bundle: str | None = None
    image: str | None = None
    publish: list[PortMap] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    gang: str | None = None
    right_size: bool = False

    def to_job(self, job_id: str, op_id: str) -> Job:
        """The job record of this spec (the one place its fields are copied): `node` is a request."""
        return Job(id=job_id, op=op_id, requested_node=self.node, adopted=self.adopt_pid is not None,
                   **self.model_dump(exclude={"node"}))


class SchedulerCommand(Record):
    """A request for the scheduler; `op` names the Op record the requester watches."""

    op: str
    kind: OpKind
    job: str = ""  # job id; empty for submit
    spec: JobSpec | None = None
    stop: bool = False
    node: str | None = None
    checkpoint: str | None = None
    grace_s: float = 5.0
    live: bool = False
    tcp_established: bool = False
    here: bool = False  # restore: in the foreground of the caller on `node`
    gang: str | None = None  # checkpoint, restore: every member of this gang, as one
    nodes: list[str] = Field(default_factory=list)  # a gang's restore: where its members go, in order
    allow_colocate: bool = False  # a gang's restore: members may share a node


NodeCommandKind = Literal["launch", "kill", "checkpoint", "restore",
                          "live_prepare", "live_freeze", "live_restore", "live_end", "live_resume",
                          "gang_lock", "gang_release"]


class NodeCommand(Record):
    id: str = Field(default_factory=lambda: new_id("nc"))
    kind: NodeCommandKind
    op: str | None = None
    job: Job
    incarnation: int
    checkpoint: str | None = None
    parent: str | None = None
    stop: bool = False
    hold: bool = False  # with `stop`: the dumped tree stays stopped after the commit (a gang's release ends it)
    grace_s: float = 5.0
    options: NodeOptions = Field(default_factory=NodeOptions)  # CRIU options, an armed fault
    pages: PageSource | None = None  # live_restore: where the frozen source serves the memory


NodeEventKind = Literal[
    "notice",
    "started",
    "launch_failed",
    "exited",
    "checkpoint_committed",
    "checkpoint_failed",
    "restored",
    "restore_failed",
    "checkpoints_expired",  # an ended job's checkpoints were deleted (keep_ended_s): deleted_checkpoints
    "live_frozen",  # the source is frozen and its page server listens: restore on the target
    "live_freeze_failed",  # the source runs on
    "live_local",  # every page reached the target: end the source
    "live_lost",  # the target failed after it ran: it is killed; the source must resume
    "live_resumed",  # the source runs again after a failed live move
    "live_resume_failed",  # the source is gone: restore from the last committed checkpoint
    "gang_locked",  # a gang member's network is locked: nothing reaches it or leaves it
    "gang_lock_failed",  # it could not be (not running here): the gang checkpoint is undone
    "gang_released",  # unlocked (or, after a final group checkpoint, ended)
]


class NodeEvent(Record):
    id: str = Field(default_factory=lambda: new_id("ne"))
    kind: NodeEventKind
    node: str
    job: str
    incarnation: int
    op: str | None = None
    time: float = Field(default_factory=now)
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    by_checkpoint: bool = False
    checkpoint: CheckpointRecord | None = None
    error: str | None = None
    error_code: int = 1
    unverifiable: bool = False  # restore_failed: the checkpoint's data did not verify (not CRIU's failure)
    restore_ms: float | None = None
    deadline: float | None = None  # notice: when the node goes away
    deleted_checkpoints: list[str] = Field(default_factory=list)  # removed by the retention policy
    live: LiveReport | None = None  # live moves: where to connect and what was measured


class Progress(Record):
    op: str
    phase: str
    done: int = 0
    total: int = 0


class LogRequest(Record):
    job: str
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = 0
    max_bytes: int = 256 * 1024
    stored: bool = False  # the output the store kept of an ended job (its own node is gone)


class LogReply(Record):
    data_hex: str = ""
    offset: int = 0
    error: str | None = None

    @property
    def data(self) -> bytes:
        return bytes.fromhex(self.data_hex)


M = TypeVar("M", bound=BaseModel)


def encode(message: BaseModel) -> bytes:
    return message.model_dump_json().encode()


def op_of(data: bytes) -> str | None:
    """The op id a message names, read leniently from a message that did not decode; None when
    it names none that is a valid token."""
    try:
        op = json.loads(data).get("op")
    except (ValueError, AttributeError):
        return None
    return op if isinstance(op, str) and is_token(op) else None


def decode(model: type[M], data: bytes) -> M:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise WireError(f"malformed {model.__name__}: {exc.errors()[0]['msg']}") from exc
