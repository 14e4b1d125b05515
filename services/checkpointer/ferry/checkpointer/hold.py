"""A node cut off from the bus holds its jobs before anyone may declare it lost (self-fencing).

Health declares a node lost once the heartbeat in its record is ``heartbeat_timeout_s`` old, and the
scheduler then restores the node's jobs elsewhere from their last checkpoints. A node that is alive
but cannot reach the bus (its NATS server died, a network cut) keeps running those jobs: both
copies ran until the node heard the bus again and fenced its own (``CheckpointerService.fence``).

So each beat that lands is a lease (``Lease``): it runs until ``heartbeat + timeout - margin``,
before health may act. When it runs out, every job here is held: the processes of its tree that
run get SIGSTOP (``hold_tree``), and which ones is written into the job's folder, so that a
restarted checkpointer knows. A beat that lands again, and the fence after it (a copy the job moved
away from is killed), release the others: SIGCONT to exactly the processes the hold stopped
(``release_tree``). A node that finds itself declared lost when it is back waits one more timeout
first: the scheduler acts on the loss by bumping the job's incarnation, and the fence then kills
the copy instead.

While a job is held, no CRIU dump of it starts: CRIU records a stopped task as stopped, and its
restore would stay stopped (``CheckpointerService.dump_refused``). A job cut off is thus paused, not
lost, and never runs beside its restored copy. What this does not cover: a checkpointer that is
itself paused or down for longer than the timeout holds nothing (the shims run on without it).
"""

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from ferry.criu.jobdir import JobDir, ShimInfo, write_json_atomic
from ferry.criu.lazy_common import proc_state
from ferry.criu.linux import process_tree
from ferry.node.procs import signal_tree

log = logging.getLogger(__name__)

HELD_FILE = "held.json"
"""In a held job's folder: the incarnation held and the processes the hold stopped."""
NOT_RUNNING = frozenset("TtZX")  # /proc/PID/stat states: stopped, traced, zombie, dead


@dataclass
class Lease:
    """How long this node's last beat that landed lets it run its jobs. Wall-clock seconds, as
    health compares the record's heartbeat with its own clock."""

    timeout_s: float
    interval_s: float
    heartbeat: float = float("-inf")  # of the newest record that landed; until one does: run out
    release_after: float = 0.0  # after a declared loss: when held jobs may run again

    @property
    def margin_s(self) -> float:
        """How long before health's verdict the jobs are held: two beats or a quarter of the
        timeout, whichever is longer (at most half of it). 1 s with 0.5 s beats and a 3 s timeout."""
        return min(max(2 * self.interval_s, self.timeout_s / 4), self.timeout_s / 2)

    @property
    def deadline(self) -> float:
        return self.heartbeat + self.timeout_s - self.margin_s

    def renew(self, heartbeat: float, was_lost: bool, now: float) -> None:
        """A record with heartbeat `heartbeat` was written; `was_lost`: health had declared the node lost."""
        self.heartbeat = max(self.heartbeat, heartbeat)
        if was_lost:
            self.release_after = now + self.timeout_s

    def expired(self, now: float) -> bool:
        return now >= self.deadline

    def may_release(self, now: float) -> bool:
        return not self.expired(now) and now >= self.release_after


class Held(BaseModel):
    incarnation: int
    pids: list[int]


def read_held(jd: JobDir) -> Held | None:
    try:
        return Held.model_validate_json((jd.path / HELD_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def hold_tree(jd: JobDir, shim: ShimInfo, *, stopped_too: bool = False) -> list[int]:
    """Stops the processes of the job's tree that run, and adds them to its held file; returns
    those it stopped now. `stopped_too`: takes the stopped ones too (a final dump left the tree
    stopped and gave up: the release is to resume it). A process forked while the tree is read is
    caught by the next pass (the caller repeats while the lease is out)."""
    held = read_held(jd)
    pids = set(held.pids) if held is not None and held.incarnation == shim.incarnation else set()
    stopped = []
    for pid in process_tree(shim.pid):
        if pid in pids:
            continue
        state = proc_state(pid)
        if state is None:  # gone
            continue
        if state in NOT_RUNNING:
            if stopped_too:
                pids.add(pid)
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            pids.add(pid)
    if pids and (held is None or set(held.pids) != pids):
        write_json_atomic(jd.path / HELD_FILE, Held(incarnation=shim.incarnation, pids=sorted(pids)))
    return stopped


def release_tree(jd: JobDir) -> list[int]:
    """Resumes what the hold stopped, when that copy still runs here (a copy the fence killed, or
    another incarnation, is left alone); removes the held file; returns the processes resumed."""
    held = read_held(jd)
    shim = jd.read_shim()
    resumed = []
    if held is not None and shim is not None and shim.incarnation == held.incarnation:
        tree = set(process_tree(shim.pid))
        for pid in held.pids:
            if pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    resumed.append(pid)
    (jd.path / HELD_FILE).unlink(missing_ok=True)
    return resumed


HOLD_PASS_S = 0.2  # while the lease is out: how often the jobs are looked at again (new processes, a dump that ended)


class JobHolds:
    """The holds of one node's jobs: taken while its lease is out, released after a beat that
    landed and the fence after it. `running()`: the node's running jobs; `busy(job_id)`: the job
    is the frozen source of a live move, whose op owns its stopped state."""

    def __init__(self, jobs_dir: Path, lease: Lease, running: Callable[[], dict[str, ShimInfo]],
                 busy: Callable[[str], bool]) -> None:
        self.jobs_dir, self.lease, self.running, self.busy = jobs_dir, lease, running, busy
        # a restarted checkpointer keeps its predecessor's holds until its own beat releases them
        self.held = {d.name for d in jobs_dir.iterdir() if (d / HELD_FILE).exists()}
        self.dumping: set[str] = set()  # a CRIU dump of these runs now: held once it ended

    def dump_refused(self, job_id: str, now: float) -> str | None:
        """Why no dump of `job_id` may start now, or None. Checked, then ``dumping`` entered, with
        no await between: a hold never stops a tree CRIU is dumping."""
        if job_id in self.held:
            return "the job is held: this node lost the bus, and a dump now would record it stopped"
        if self.lease.expired(now):
            return f"this node has not reached the bus for {now - self.lease.heartbeat:.1f}s: its jobs are held"
        return None

    @contextlib.contextmanager
    def dump_of(self, job_id: str) -> Iterator[None]:
        self.dumping.add(job_id)
        try:
            yield
        finally:
            self.dumping.discard(job_id)

    def give_back(self, jd: JobDir, shim: ShimInfo) -> None:
        """A stop that did not happen (a final dump that failed) lets the tree run on, unless the
        node's jobs are held: then the hold takes it, and its release resumes it."""
        name = jd.path.name
        if name in self.held or self.lease.expired(time.time()):
            hold_tree(jd, shim, stopped_too=True)
            self.held.add(name)
        else:
            signal_tree(shim.pid, signal.SIGCONT)

    async def hold_all(self) -> None:
        for job_id, shim in self.running().items():
            if job_id in self.dumping or self.busy(job_id):
                continue
            jd = JobDir(self.jobs_dir / job_id, canonical=True)
            stopped = await asyncio.to_thread(hold_tree, jd, shim)
            if stopped and job_id not in self.held:
                log.warning("this node cannot reach the bus: job %s held (processes %s) until it can, so that "
                            "it never runs beside a copy restored elsewhere", job_id, stopped)
            self.held.add(job_id)

    async def release_all(self, now: float) -> None:
        """After a beat landed and the fence killed the copies that moved on."""
        if not self.held or not self.lease.may_release(now):
            return
        for job_id in sorted(self.held):
            resumed = await asyncio.to_thread(release_tree, JobDir(self.jobs_dir / job_id, canonical=True))
            log.warning("this node reaches the bus again: job %s released (processes %s resumed)", job_id, resumed)
            self.held.discard(job_id)

    async def run(self, stopping: asyncio.Event) -> None:
        """Holds the jobs whenever the lease runs out, until the service stops."""
        while not stopping.is_set():
            now = time.time()
            if self.lease.expired(now):
                try:
                    await self.hold_all()
                except OSError as exc:  # a job folder or /proc read: the next pass again
                    log.warning("holding the jobs: %s", exc)
                wait = HOLD_PASS_S
            else:
                wait = max(self.lease.deadline - now, 0.01)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await stopping.wait()
