"""The typed contract between the scheduler and the two node halves of a live move.

What a node command carries besides its job (``NodeOptions``: CRIU options, a fault armed by
`ferry chaos fail-live`), where the target fetches the memory from (``PageSource``), and what the
nodes report back as they go (``LiveFrozen``, ``LiveRestored``, ``LiveLocal``). Durations are in
ms, ``*_at`` fields wall-clock seconds.
"""

from typing import Annotated, Literal

from pydantic import Field

from ferry.common.phases import FaultPhase
from ferry.common.record import Record

__all__ = ["FaultPhase", "LiveFrozen", "LiveLocal", "LiveRestored", "NodeOptions", "PageSource"]


class NodeOptions(Record):
    """What a node command carries besides its job and checkpoint."""

    criu_args: list[str] = Field(default_factory=list)
    fail: FaultPhase | None = None  # fault injection (tests, `ferry chaos`): fail in this phase

    def fails_at(self, phase: FaultPhase) -> bool:
        return self.fail == phase


class PageSource(Record):
    """Where a post-copy target restores from: the frozen source's images (all but memory, in the
    store under ``store_job``/``images``) and its page server (``address``:``port``)."""

    address: str
    port: int
    store_job: str
    images: str
    stdout_path: str  # CRIU's external key of the job's output files (``ferry.criu.external``)
    stderr_path: str


class LiveFrozen(PageSource):
    """``live_frozen``: the source is frozen, its images are in the store, its page server listens."""

    type: Literal["frozen"] = "frozen"
    sizes: dict[str, int] = Field(default_factory=dict)
    dump_ms: float = 0.0
    freeze_ms: float = 0.0
    started_at: float = 0.0
    frozen_at: float | None = None
    ready_at: float | None = None
    last_write_at: float | None = None  # the output files' last change: the source's last progress
    bytes_final: int = 0
    upload_ms: float = 0.0
    source_pid: int = 0
    cpu_s: float | None = None  # the CPU seconds the job had used as its final dump began
    cores: float | None = None  # the cores it used in the seconds before

    def page_source(self) -> PageSource:
        return PageSource.model_validate(self.model_dump(include=set(PageSource.model_fields)))


class LiveRestored(Record):
    """``restored`` of a post-copy target: it runs, its memory still arriving."""

    type: Literal["restored"] = "restored"
    fetch_ms: float = 0.0
    restore_ms: float = 0.0
    lazy_start_ms: float = 0.0
    running_at: float | None = None


class LiveLocal(Record):
    """``live_local``: every page reached the target."""

    type: Literal["local"] = "local"
    pages_lazy: int | None = None
    bytes_lazy: int | None = None
    degraded_ms: float | None = None
    local_at: float | None = None
    first_write_at: float | None = None  # the target's first output: its first observable progress
    adopted: bool = False  # reported by a migrator that took the move over from a dead one
    cpu_s: float | None = None  # the CPU seconds the restored job used until its memory was all here


LiveReport = Annotated[LiveFrozen | LiveRestored | LiveLocal, Field(discriminator="type")]
