"""A node that falls silent holds its jobs before anyone may declare it lost (self-fencing): the
checkpointer's side.

Health declares a node lost once the heartbeat in its record is ``heartbeat_timeout_s`` old, and the
scheduler then restores the node's jobs elsewhere from their last checkpoints. A node that is alive
but silent (its NATS server died, a network cut, its checkpointer paused or down) would keep
running those jobs beside their restored copies.

So each beat that lands is a lease (``Lease``): it runs until ``heartbeat + timeout - margin``,
before health may act. After the beat (a lease that ran out: after the fence that follows it,
which kills a copy the job moved away from) the checkpointer writes it into the node's lease file
(``JobHolds.grant``); each
job's monitor holds its tree when that runs out and releases it when it is renewed
(``ferry.criu.hold``). A node that finds itself declared lost when it is back grants nothing for
one more timeout: the scheduler acts on the loss by bumping the job's incarnation, and the fence
then kills the copy instead.

No CRIU dump starts while the lease is out or the job is held, and a dump during which a hold
landed is discarded: CRIU records a stopped task as stopped, and its restore would stay stopped.
"""

import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ferry.criu.hold import HELD_FILE, held_since, hold_tree, lease_path, read_lease, write_lease
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.node.procs import signal_tree


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


class JobHolds:
    """What the checkpointer does for the holds of its node's jobs: grants the lease its monitors
    follow, refuses dumps while it is out, and gives a tree a failed final dump left stopped back
    to the hold."""

    def __init__(self, work_dir: Path, lease: Lease) -> None:
        self.path, self.lease = lease_path(work_dir), lease
        # the deadline last written (by a predecessor too): the monitors hold the jobs from then on
        self.granted = read_lease(self.path) or float("-inf")

    def grant(self, now: float, *, before_fence: bool = False) -> None:
        """After a beat landed and the fence killed the copies that moved on: the monitors may run
        their jobs until the lease's deadline (and release those they held). `before_fence`: right
        after the beat, only while the last grant still runs: nothing was held for it to release,
        and a slow fence (a read per job) does not make the monitors hold running jobs."""
        if before_fence and now >= self.granted:
            return
        if not self.lease.may_release(now) or self.lease.deadline <= self.granted:
            return
        write_lease(self.path, self.lease.deadline)
        self.granted = self.lease.deadline

    def dump_refused(self, jd: JobDir, now: float) -> str | None:
        """Why no dump of the job in `jd` may start now, or None."""
        if (jd.path / HELD_FILE).exists():
            return "the job is held: this node lost the bus, and a dump now would record it stopped"
        if now >= self.granted:  # what the monitors go by
            return f"this node has not reached the bus for {now - self.lease.heartbeat:.1f}s: its jobs are held"
        return None

    def give_back(self, jd: JobDir, shim: ShimInfo) -> None:
        """A stop that did not happen (a final dump that failed) lets the tree run on, unless the
        node's jobs are held: then the hold takes it, and its monitor resumes it with the lease."""
        if (jd.path / HELD_FILE).exists() or time.time() >= self.granted:
            hold_tree(jd, shim.pid, shim.incarnation, stopped_too=True)
            if held_since(jd, shim.incarnation):
                return
            # not recorded (a full disk): nobody would resume it; its monitor holds it again at once
        signal_tree(shim.pid, signal.SIGCONT)
