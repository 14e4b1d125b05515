"""The records Ferry keeps in JetStream KV and sends on the bus: jobs, nodes, checkpoints, ops."""

import time
import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from ferry.common.errors import UsageError
from ferry.common.jobnet import PortMap
from ferry.common.opargs import OpArgs, Plain
from ferry.common.record import Record
from ferry.common.sealing import SealedEnv


def now() -> float:
    return time.time()


def new_id(prefix: str) -> str:
    """A short, sortable-enough, collision-safe id: `<prefix>-<12 hex>`."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


DEFAULT_TENANT = "default"  # the tenant of every job where the API has no tokens file

class Network(StrEnum):
    """Where a job's sockets live (``ferry run --network``)."""

    HOST = "host"  # the node's own network: its ports are the node's, a restore may find them taken
    ISOLATED = "isolated"  # a network namespace of its own with loopback only; dumped and restored with the job
    # its own namespace too, with an address of the cluster's job range (kept wherever it runs) on
    # a veth to its node's bridge, NAT to the outside and published ports (ferry.common.jobnet)
    BRIDGE = "bridge"

    @property
    def own_namespace(self) -> bool:
        """The job's sockets live in a namespace of its own, dumped and restored with it."""
        return self is not Network.HOST


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    RESTORING = "restoring"
    MIGRATING = "migrating"
    PREEMPTED = "preempted"  # stopped with a final checkpoint; restore or migrate brings it back
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    ENDED = "ended"  # an adopted process ended and its parent collected the status before Ferry could read it


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.ENDED})
BUSY_STATES = frozenset({JobState.CHECKPOINTING, JobState.RESTORING, JobState.MIGRATING})


class Job(Record):
    id: str
    name: str
    argv: list[str]
    env: SealedEnv = Field(default_factory=SealedEnv)  # names in the clear, values sealed to the nodes
    cwd: str = "/"
    state: JobState = JobState.PENDING
    node: str | None = None
    requested_node: str | None = None
    restarts: int = 0
    incarnation: int = 0  # fencing token: bumped whenever the job starts somewhere
    last_checkpoint: str | None = None
    checkpoints: int = 0
    exit_code: int | None = None
    error: str | None = None
    reason: str | None = None
    created: float = Field(default_factory=now)
    updated: float = Field(default_factory=now)
    checkpoint_every_s: float = 0.0
    next_checkpoint_at: float | None = None
    priority: int = 0
    op: str | None = None  # the op in flight on this job, if any
    cpus: float = 0.0  # requested; 0: no request
    memory_bytes: int = 0
    gpus: int = 0
    deadline: float | None = None  # absolute time by which the job should have finished
    max_downtime_s: float | None = None
    work_s: float | None = None  # about how long it computes to its end (`--work`), if it said
    ran_s: float = 0.0  # time it ran, up to `running_since` (ferry.policy.progress)
    running_since: float | None = None  # when it last started running; None while it does not run
    last_move_at: float | None = None
    move_cost_s: float = 30.0  # measured: last checkpoint plus restore time
    last_move_lost_s: float | None = None  # what its last move cost it in progress (ferry.policy.lost)
    parked_by: str | None = None  # "user" (checkpoint --stop) or "capacity" (preempt-and-save)
    moving_to: str | None = None  # during a move: the target, whose capacity the job already holds
    gpu_model: str | None = None  # e.g. "H100": a substring of the GPU's name
    gpu_memory_bytes: int = 0  # per GPU
    gpu_shared: bool = False
    gpu_uuids: list[str] = Field(default_factory=list)  # assigned on its node (CUDA_VISIBLE_DEVICES)
    kill_requested: bool = False
    kill_op: str | None = None  # the kill op waiting for the job to end
    tenant: str = DEFAULT_TENANT  # its API token's tenant; its checkpoints are sealed with that tenant's keys
    network: Network = Network.HOST
    # runs in the foreground of a `ferry run|restore --here` on its node: that caller's supervisor
    # (a SLURM step, a container runtime) owns its restarts, so Ferry never moves or restarts it
    here: bool = False
    # `ferry adopt`: the process another supervisor started, watched where it runs (None once Ferry
    # restored it); `adopted` stays: its session leader is not in its tree, so dumps use --shell-job
    adopt_pid: int | None = None
    adopted: bool = False
    bundle: str | None = None  # an OCI container (runc): the bundle it was started from, or
    image: str | None = None  # the image (its own copy of either travels with its checkpoints)
    address: str | None = None  # --network bridge: its address in the cluster's job range, for its life
    publish: list[PortMap] = Field(default_factory=list)  # --network bridge: node ports that reach it
    # who or what started it, as the user or an integration said: `source` (slurm, kubernetes, ray),
    # `slurm.job`, ... (`ferry run --label`, `ferry ps --source`)
    labels: dict[str, str] = Field(default_factory=dict)
    # `ferry run --gang`: the group it is checkpointed, restored and failed over with (ferry.policy.gangs)
    gang: str | None = None
    gang_checkpoint: str | None = None  # the newest committed group checkpoint it belongs to
    # `ferry run --right-size`: its memory request follows its use (ferry.policy.rightsize), and it
    # moves to a node that fits when it outgrows its own; `outgrown`: no node fits it now (the
    # autoscaler launches one)
    right_size: bool = False
    outgrown: bool = False

    @property
    def container(self) -> bool:
        return bool(self.bundle or self.image)

    @property
    def supervised_elsewhere(self) -> bool:
        """Its supervisor is not Ferry (``--here``, adopted): Ferry never moves or restarts it."""
        return self.here or self.adopt_pid is not None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class NodeState(StrEnum):
    READY = "ready"
    DRAINING = "draining"
    PREEMPTING = "preempting"
    LOST = "lost"


class JobUsage(Record):
    """What a running job uses, as its node sampled it (the whole process tree)."""

    rss_bytes: int = 0
    peak_rss_bytes: int = 0  # the highest seen on this node since it started or was restored here
    cpu: float = 0.0  # cores, averaged since the last sample
    # GPUs (NVML): the memory its processes hold on the busiest of its GPUs, the peak of that, and
    # that GPU's utilisation (percent); zeros without GPUs
    gpu_memory_bytes: int = 0
    peak_gpu_memory_bytes: int = 0
    gpu_utilization: float = 0.0
    at: float = Field(default_factory=now)


class Node(Record):
    id: str
    state: NodeState = NodeState.READY
    criu_ok: bool = False
    criu_version: str | None = None
    criu_error: str | None = None
    lazy_pages: bool = False
    lazy_pages_error: str | None = None  # why it cannot do post-copy
    heartbeat: float = Field(default_factory=now)
    started: float = Field(default_factory=now)
    cpus: int = 0
    memory_bytes: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    jobs: list[str] = Field(default_factory=list)
    address: str = ""
    net_ip: str | None = None  # where the other nodes route its bridge-network jobs (None: it has no job network)
    net_error: str | None = None  # why it has none
    price_per_hour: float = 0.0
    spot: bool = False
    gpus: int = 0
    preemptions: int = 0  # interruption notices and losses seen on this node
    notice_deadline: float | None = None
    gpu_list: list[dict[str, Any]] = Field(default_factory=list)  # ferry.gpu.models.GpuInfo, as JSON
    gpu_driver: str | None = None
    gpu_error: str | None = None  # the NVIDIA driver is there but broken
    gpu_conditions: list[str] = Field(default_factory=list)  # one line per unhealthy GPU condition
    usage: dict[str, JobUsage] = Field(default_factory=dict)  # job id -> what it uses (ferry.node.usage)


class CheckpointRecord(Record):
    id: str
    job: str
    job_name: str = ""
    parent: str | None = None
    node: str = ""
    state: Literal["committed", "failed"] = "committed"
    created: float = Field(default_factory=now)
    criu_version: str = ""
    kernel: str = ""
    bytes_logical: int = 0
    bytes_stored: int = 0
    bytes_uploaded: int = 0
    freeze_ms: float = 0.0
    dump_ms: float = 0.0
    dumped_at: float | None = None  # when its dump began (wall clock): the job's last moment of progress
    cpu_s: float | None = None  # the CPU seconds the job's process tree had used by then
    cores: float | None = None  # the cores it used in the seconds before (ferry.node.usage)
    upload_ms: float = 0.0
    total_ms: float = 0.0
    manifest_key: str = ""
    error: str | None = None
    log_excerpt: list[str] = Field(default_factory=list)
    final: bool = False
    incarnation: int = 0
    gpu_bytes: int = 0  # device memory moved into the dump by the CUDA driver's checkpoint API
    gpu_lock_ms: float = 0.0
    gpu_checkpoint_ms: float = 0.0
    sockets: list[str] = Field(default_factory=list)  # the Internet sockets it carried ("tcp A <-> B established")


class GangCheckpoint(Record):
    """A committed group checkpoint of a gang (KV ``ferry_gangs``): written once every member's own
    checkpoint committed, and only then; a restore of the gang takes each member's from here."""

    id: str
    gang: str
    tenant: str = DEFAULT_TENANT
    created: float = Field(default_factory=now)
    members: dict[str, str] = Field(default_factory=dict)  # job id -> its checkpoint in the group
    names: dict[str, str] = Field(default_factory=dict)  # job id -> job name
    nodes: dict[str, str] = Field(default_factory=dict)  # job id -> where it was dumped
    lock_ms: float = 0.0  # how long the gang's network was locked: its members could not talk
    freeze_ms: float = 0.0  # the slowest member's freeze (members dump in parallel)
    freeze_ms_sum: float = 0.0  # what dumping them one after another would have frozen
    bytes_uploaded: int = 0
    final: bool = False  # `--stop`: the members ended with it


class OpKind(StrEnum):
    SUBMIT = "submit"
    KILL = "kill"
    CHECKPOINT = "checkpoint"
    RESTORE = "restore"
    MIGRATE = "migrate"
    DRAIN = "drain"


class OpState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Op(Record):
    """One user or scheduler action on a job, tracked until it ends (the API waits on it)."""

    id: str
    kind: OpKind
    job: str = ""
    state: OpState = OpState.PENDING
    phase: str = ""
    created: float = Field(default_factory=now)
    updated: float = Field(default_factory=now)
    error: str | None = None
    error_code: int = 0
    error_kind: str = ""  # the error's class in ferry.common.errors (kind_of), when it ended in one
    checkpoint: str | None = None
    restore_ms: float | None = None
    total_ms: float | None = None
    args: OpArgs = Field(default_factory=Plain)  # what the op carries while it runs, by its type
    result: dict[str, Any] = Field(default_factory=dict)  # what a live move measured; a fallback's why
    # what the op ended with, written with its end so that whoever waits for it reads the op once
    job_record: Job | None = None
    checkpoint_record: CheckpointRecord | None = None

    @property
    def finished(self) -> bool:
        return self.state in (OpState.DONE, OpState.FAILED)


class Event(Record):
    """What happened, for people and tools: published on `ferry.evt.job.*` and streamed by the API."""

    id: str = Field(default_factory=lambda: new_id("ev"))
    kind: str
    job: str = ""
    node: str = ""
    time: float = Field(default_factory=now)
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class AuditEntry(Record):
    """One mutating call to the API, allowed or not: on the audit stream (`ferry audit`)."""

    time: float = Field(default_factory=now)
    tenant: str
    who: str
    role: str
    method: str
    target: str = ""
    outcome: str  # "ok" or the gRPC status name
    error: str = ""
    reason: str = ""  # why, in the caller's words (required of agents)
    cost_per_hour: float = 0.0  # the hourly price of the node the call sent work to (a move's target)
    undo: bool = False  # an undrain


class ServiceBeat(Record):
    """A service's liveness record (KV `ferry_services`), read by `--check` probes."""

    service: str
    instance: str
    pid: int
    ready: bool = False
    time: float = Field(default_factory=now)


class PriceRecord(Record):
    """A current price, as the pricing service keeps it (KV `ferry_prices`)."""

    zone: str
    region: str = ""
    instance_type: str
    market: str
    price_per_hour: float
    timestamp: float = 0.0
    source: str = ""
    previous_price_per_hour: float | None = None  # the price this one replaced (the trend)
    previous_timestamp: float | None = None


class AutoscalePolicy(Record):
    """What ``ferry autoscale`` sets (KV ``ferry_autoscale``, key ``policy``): the autoscaler's bounds."""

    enabled: bool = True
    min_nodes: int = Field(default=1, ge=0)
    max_nodes: int = Field(default=8, ge=1)
    target_utilization: float = Field(default=0.8, gt=0, le=1)
    scale_down_after_s: float = Field(default=600.0, ge=0)
    scale_up_after_s: float = Field(default=5.0, ge=0)
    updated: float = Field(default_factory=now)

    @classmethod
    def checked(cls, **fields: Any) -> "AutoscalePolicy":
        """The policy, or a UsageError that says in one line what is wrong (the CLI and the API)."""
        flags = {"min_nodes": "--min", "max_nodes": "--max", "target_utilization": "--target-utilization",
                 "scale_down_after_s": "--scale-down-after", "scale_up_after_s": "--scale-up-after"}
        try:
            return cls(**fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = flags.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else ""
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise UsageError(f"{where}: {msg}" if where else msg) from None

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalePolicy":
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"--min {self.min_nodes} is above --max {self.max_nodes}")
        return self


FleetState = Literal["launching", "running", "failed", "retiring", "terminated"]


class FleetNode(Record):
    """A node the autoscaler launched or retires (KV ``ferry_fleet``), so that a restarted
    autoscaler knows what it was doing."""

    id: str
    provider: str
    offer: str  # instance type / zone / market
    state: FleetState
    price_per_hour: float = 0.0
    reason: str = ""
    since: float = Field(default_factory=now)
    op: str = ""  # the drain op of a node that retires
