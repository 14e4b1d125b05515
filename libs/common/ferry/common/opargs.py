"""What an op carries while it runs (``Op.args``), one model per kind of operation.

The scheduler writes them, the API and the CLI never read them (they read the op's state, phase,
error and result), so they can change with the scheduler. ``type`` tells them apart in KV.
"""

from typing import Annotated, Literal

from pydantic import Field

from ferry.common.moves import FaultPhase, LiveFrozen, LiveLocal, LiveRestored
from ferry.common.record import Record


class Plain(Record):
    """A submit, kill or drain: nothing beyond the op's own fields."""

    type: Literal["plain"] = "plain"


class CheckpointArgs(Record):
    """A checkpoint of a running job, the user's or the scheduler's (periodic, parking)."""

    type: Literal["checkpoint"] = "checkpoint"
    stop: bool = False
    periodic: bool = False
    parked_by: str | None = None  # "capacity" when the scheduler parks the job (preempt-and-save)
    reason: str | None = None  # the parked job's reason


class RestorePhase(Record):
    """What a restore on a node needs to remember, whatever op it belongs to."""

    target: str | None = None
    unverifiable: dict[str, float] = Field(default_factory=dict)  # checkpoints that did not verify: created
    checkpoint_ms: float = 0.0  # a move's checkpoint, for the job's measured move cost
    dumped_at: float | None = None  # a move's: when its final dump began (its last moment of progress)


class RestoreArgs(RestorePhase):
    """A restore of a stopped job: the user's, a failover's, or a parked job coming back."""

    type: Literal["restore"] = "restore"
    pinned: bool = False  # the user named the checkpoint: no other one instead
    failover: str | None = None  # the lost node
    resume: bool = False  # capacity came back for a parked job


class ColdMove(RestorePhase):
    """A move by a final checkpoint and a restore elsewhere (rolled back to the source on failure)."""

    type: Literal["cold_move"] = "cold_move"
    source: str | None = None
    stop: bool = True
    evacuate: str | None = None  # the source's state when the scheduler moves the job off it
    rebalance: str | None = None  # why the scheduler found a better node
    criu_args: list[str] = Field(default_factory=list)
    rolled_back: bool = False
    target_error: str | None = None


class Round(Record):
    """One pre-copy round of a live move: a committed checkpoint taken while the job ran."""

    checkpoint: str
    bytes_uploaded: int
    bytes_logical: int = 0
    freeze_ms: float = 0.0
    dumped_at: float | None = None  # when its dump began
    cpu_s: float | None = None  # the CPU seconds the job had used by then
    cores: float | None = None  # the cores it used in the seconds before


class LiveMove(RestorePhase):
    """A live move (``ferry.scheduler.ops.live_move`` walks its phases)."""

    type: Literal["live_move"] = "live_move"
    mode: Literal["postcopy", "precopy"] = "postcopy"
    source: str = ""
    source_incarnation: int = 0
    stop: bool = True
    evacuate: str | None = None
    rebalance: str | None = None
    criu_args: list[str] = Field(default_factory=list)
    fault: FaultPhase | None = None
    rounds: list[Round] = Field(default_factory=list)
    fallback_checkpoint: str | None = None  # a fresh periodic checkpoint used instead of a round
    round_why: str | None = None  # post-copy: why it took a round anyway (no fresh checkpoint)
    images: str | None = None  # the frozen source's images in the store (all but memory)
    frozen: LiveFrozen | None = None
    restored: LiveRestored | None = None
    local: LiveLocal | None = None
    final_bytes: int | None = None  # pre-copy only: the final checkpoint's delta
    final_freeze_ms: float | None = None
    final_cpu_s: float | None = None  # pre-copy only: the job's CPU seconds as the final dump began
    target_error: str | None = None
    rolled_back: bool = False
    fallback_error: str | None = None  # neither copy ran: restored from the last committed checkpoint


class GangCheckpointArgs(Record):
    """A group checkpoint of a gang (``ferry.scheduler.ops.gang``): lock, dump, commit, release."""

    type: Literal["gang_checkpoint"] = "gang_checkpoint"
    gang: str
    members: list[str] = Field(default_factory=list)  # job ids, in the order of their checkpoint ids
    stop: bool = False
    periodic: bool = False
    reason: str | None = None  # why the members were parked (preempt-and-save), for `--stop`
    parked_by: str = "user"  # "capacity": the scheduler parked the gang to make room
    locked: list[str] = Field(default_factory=list)
    locked_at: float | None = None  # when the first member's network was locked
    committed: dict[str, str] = Field(default_factory=dict)  # job id -> its committed checkpoint
    freeze_ms: dict[str, float] = Field(default_factory=dict)
    bytes_uploaded: int = 0
    released: list[str] = Field(default_factory=list)
    error: str | None = None  # why it is being undone (set once: the first member's failure)
    fault: bool = False  # `ferry chaos fail-live round`: the last member's dump fails (to see it undone)


class Survivor(Record):
    """A gang member that still ran when another member's node was lost: where, and as which incarnation."""

    node: str
    incarnation: int


class GangRestoreArgs(Record):
    """A restore of a whole gang from one group checkpoint, each member on its node."""

    type: Literal["gang_restore"] = "gang_restore"
    gang: str
    group: str  # the group checkpoint
    members: dict[str, str] = Field(default_factory=dict)  # job id -> its checkpoint in the group
    targets: dict[str, str] = Field(default_factory=dict)  # job id -> node
    restored: list[str] = Field(default_factory=list)
    unblocked: list[str] = Field(default_factory=list)  # restored members whose ports are open again
    failed: dict[str, str] = Field(default_factory=dict)  # job id -> why its restore failed
    failover: str | None = None  # the lost node, when a failover started it
    stopping: dict[str, "Survivor"] = Field(default_factory=dict)  # a failover's survivors: ended first
    released: list[str] = Field(default_factory=list)  # ... and those of them that are
    fresh_start: bool = False  # a failover without a group checkpoint: the members start again


OpArgs = Annotated[Plain | CheckpointArgs | RestoreArgs | ColdMove | LiveMove | GangCheckpointArgs | GangRestoreArgs,
                   Field(discriminator="type")]
