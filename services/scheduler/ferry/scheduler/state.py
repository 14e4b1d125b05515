"""The scheduler's view of the cluster: jobs, nodes and prices as watch-fed local copies of their
KV buckets (``ferry.common.mirror``), written through to JetStream KV.

The scheduler is the only writer of job and op records, so a plain put is safe; its own writes go
into its copy at once. What only reads (placement, the checks of a submit, the tick's walk) reads
the jobs that have not ended (``live_jobs``) or looks one up by name (``job_named``) without a
copy, so that their cost does not grow with the cluster's history of finished jobs; what changes a
job gets a copy (``job``, ``find_job``, ``gang_jobs``). It keeps no state that KV does not also
hold, so a restarted scheduler picks up exactly where the last one stopped. Checkpoints are read
from KV when needed; so are ops, except those it wrote itself lately (``OpsWritten``): after the
API or the autoscaler created an op, the scheduler is its only writer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable

from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.errors import ConflictError, NotFoundError
from ferry.common.mirror import Mirror
from ferry.common.models import CheckpointRecord, Event, Job, Node, Op, OpState, PriceRecord, now
from ferry.policy import progress

log = logging.getLogger(__name__)


def job_tokens(job: Job) -> list[str]:
    """What the scheduler looks jobs up by, besides id and name: the job-network address each holds,
    the ports each live one publishes, its gang."""
    out = [f"address:{job.address}"] if job.address else []
    if not job.terminal:
        out += [f"publish:{m.proto}/{m.host}" for m in job.publish]
    if job.gang:
        out.append(f"gang:{job.gang}")
    return out


class _TakenAddresses:
    """The job-network addresses in use, as ``allocate`` asks about them (one at a time)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def __contains__(self, address: object) -> bool:
        return isinstance(address, str) and self._state.address_taken(address)


class OpsWritten:
    """The ops the scheduler wrote lately, as written (a copy in, a copy out), so that reading one
    back costs no KV request: a submit's op was read twice more after its first write. Bounded
    (the oldest go first); an op whose write failed is forgotten (KV has the truth)."""

    def __init__(self, most: int = 4096) -> None:
        self.most = most
        self._ops: OrderedDict[str, Op] = OrderedDict()

    def get(self, op_id: str) -> Op | None:
        op = self._ops.get(op_id)
        return op.clone() if op is not None else None

    def wrote(self, op: Op) -> None:
        self._ops[op.id] = op.clone()
        self._ops.move_to_end(op.id)
        while len(self._ops) > self.most:
            self._ops.popitem(last=False)

    def forget(self, op_id: str) -> None:
        self._ops.pop(op_id, None)


class ClusterState:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._ops = OpsWritten()
        self._jobs = Mirror(bus.jobs, live=lambda j: not j.terminal, unique=lambda j: j.name, tokens=job_tokens)
        self._nodes = Mirror(bus.nodes)
        self._prices = Mirror(bus.prices)

    async def start(self) -> None:
        """Reads the jobs, nodes and prices and starts following them."""
        await asyncio.gather(self._jobs.start(), self._nodes.start(), self._prices.start())

    async def close(self) -> None:
        await asyncio.gather(self._jobs.close(), self._nodes.close(), self._prices.close())

    async def job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id!r}")
        return job

    def find_job(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    async def jobs(self) -> list[Job]:
        """A copy of every job, finished ones too (costly with a long history: prefer the others)."""
        return self._jobs.values()

    def live_jobs(self) -> list[Job]:
        """The jobs that have not ended, themselves: to read only."""
        return self._jobs.live()

    def all_jobs(self) -> list[Job]:
        """Every job, finished ones too, themselves: to read only."""
        return self._jobs.view()

    def address_taken(self, address: str) -> bool:
        """Whether a job (an ended one too: it may be restored) holds this job-network address."""
        return self._jobs.held(f"address:{address}")

    def publishers(self, ports: Iterable[tuple[str, int]]) -> list[Job]:
        """The live jobs that publish any of these (protocol, host port), themselves: to read only."""
        return [j for proto, port in sorted(set(ports)) for j in self._jobs.holders(f"publish:{proto}/{port}")]

    def gang_named(self, gang: str) -> list[Job]:
        """The jobs of the gang (ended members too), themselves: to read only."""
        return self._jobs.holders(f"gang:{gang}")

    def job_named(self, name: str) -> Job | None:
        """The job of that name, itself: to read only."""
        return self._jobs.find(name)

    def gang_jobs(self, gang: str) -> list[Job]:
        """A copy of every job of the gang (members that ended too)."""
        return [j.clone() for j in self.gang_named(gang)]

    def taken_addresses(self) -> _TakenAddresses:
        return _TakenAddresses(self)

    async def nodes(self) -> list[Node]:
        return self._nodes.values()

    def node_records(self) -> list[Node]:
        """The node records themselves (no copies; a changed node is another object): to read only."""
        return self._nodes.view()

    def find_node(self, node_id: str) -> Node | None:
        return self._nodes.get(node_id)

    async def node(self, node_id: str) -> Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"no node {node_id!r}: `ferry nodes` lists them")
        return node

    async def reread_nodes(self) -> None:
        """Reads the nodes from the bucket again: after a NATS restart the watch may have missed
        heartbeats, and a node would look silent that is not."""
        await self._nodes.resync()

    def noted_node(self, node: Node, revision: int) -> None:
        """A node record the scheduler wrote itself (compare-and-set)."""
        self._nodes.note(node.id, node, revision)

    async def prices(self) -> list[PriceRecord]:
        return self._prices.values()

    async def save_job(self, job: Job, event: str | None = None, message: str = "") -> None:
        job.updated = now()
        progress.account(job, job.updated)
        self._jobs.note(job.id, job, await self.bus.jobs.put(job.id, job))
        if event:
            await self.emit(Event(kind=event, job=job.id, node=job.node or "", message=message,
                                  data={"state": job.state, "name": job.name}))

    async def emit(self, event: Event) -> None:
        try:
            await self.bus.publish(wire.job_event_subject(event.job or "none", event.kind), event,
                                   msg_id=event.id)
        except Exception as exc:  # an event is informational: never fail a transition for it
            log.warning("could not publish event %s: %s", event.kind, exc)

    async def op(self, op_id: str) -> Op | None:
        written = self._ops.get(op_id)
        return written if written is not None else await self.bus.ops.get(op_id)

    async def save_op(self, op: Op) -> None:
        op.updated = now()
        try:
            await self.bus.ops.put(op.id, op)
        except BaseException:  # written or not: the next read asks KV
            self._ops.forget(op.id)
            raise
        self._ops.wrote(op)

    async def finish_op(self, op_id: str | None, *, error: str | None = None, error_code: int = 1,
                        error_kind: str = "", job: Job | None = None, **fields: object) -> None:
        """Ends the op; `error_kind` names the error's class (``errors.kind_of``) when one ended it;
        `job`: the job as the op leaves it (carried by the op, so a waiter reads only the op)."""
        if not op_id:
            return
        op = await self.op(op_id)
        if op is None or op.finished:
            return
        for key, value in fields.items():
            setattr(op, key, value)
        op.state = OpState.FAILED if error else OpState.DONE
        op.error = error
        op.error_code = error_code if error else 0
        op.error_kind = error_kind if error else ""
        op.total_ms = (time.time() - op.created) * 1000
        if job is not None:
            op.job, op.job_record = op.job or job.id, job.clone()
        await self.save_op(op)

    async def save_checkpoint(self, record: CheckpointRecord) -> bool:
        """Stores the record; False when it was stored already (a redelivered event)."""
        key = wire.ckpt_key(record.job, record.id)
        existing = await self.bus.checkpoints.get(key)
        if existing is not None and existing.state == record.state:
            return False
        await self.bus.checkpoints.put(key, record)
        return True

    async def checkpoint(self, job: Job, checkpoint_id: str) -> CheckpointRecord:
        record = await self.bus.checkpoints.get(wire.ckpt_key(job.id, checkpoint_id))
        if record is None:
            raise NotFoundError(f"job {job.name} has no checkpoint {checkpoint_id!r}: "
                                f"`ferry checkpoints {job.name}` lists them")
        if record.state != "committed":
            raise ConflictError(f"checkpoint {checkpoint_id} of job {job.name} failed; pick a committed one")
        return record
