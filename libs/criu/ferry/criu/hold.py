"""Holding a job's processes while its node may not run it (self-fencing, the job's side).

Health declares a node lost once its heartbeat is ``heartbeat_timeout_s`` old, and the scheduler
then restores the node's jobs elsewhere. The node's checkpointer writes, after each beat that
landed (after the fence that follows it when the lease had run out), until when its jobs may run:
``lease`` in the node's work folder, one number (wall-clock seconds, as health compares
heartbeats), a margin before health may act. Each job's monitor (``ferry.criu.shim``) reads it
when it runs out (``LeaseWatch``, a timer: no polling while the lease is good): past it, the
monitor stops (SIGSTOP) every running process of its workload's tree and names them in
``held.json`` in the job's folder; when the file says the job may run again it resumes (SIGCONT)
exactly those, still in that tree. A process stopped by someone else stays stopped.

The monitor, not the checkpointer, takes the hold: a checkpointer that is paused, killed or cut off
from the bus writes no lease, so every way a node can fall silent holds its jobs. A checkpointer
that finds the node declared lost when it is back writes no lease until its fence has killed the
copies that moved on. Both sides change ``held.json`` under a lock (``held.lock``).

A task CRIU has seized is in tracing stop (``t``) and is left alone: the hold takes it once the dump
let it go. A hold that lands in the instant before CRIU seizes a task is seen by the checkpointer
after the dump (``held_since``), which then discards that checkpoint: CRIU records a stopped task as
stopped, and its restore would stay stopped.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from pydantic import BaseModel

from ferry.criu.jobdir import JobDir, write_json_atomic
from ferry.criu.linux import proc_state, process_tree

log = logging.getLogger(__name__)

LEASE_FILE = "lease"
"""In a node's work folder: until when (wall-clock seconds) its jobs may run."""
HELD_FILE = "held.json"
"""In a held job's folder: the incarnation held and the processes the hold stopped."""
LOCK_FILE = "held.lock"
NOT_RUNNING = frozenset("TtZX")  # /proc/PID/stat states: stopped, traced, zombie, dead
HOLD_PASS_S = 0.2  # while held: how often the tree is looked at again (new processes, a dump that ended)
NO_LEASE_S = 5.0  # no lease written on this node (yet): when to look again


def lease_path(work_dir: Path) -> Path:
    return work_dir / LEASE_FILE


def node_lease_of(jd: JobDir) -> Path:
    """The lease of the node whose job folder `jd` is (``<work>/jobs/<job>``)."""
    return lease_path(jd.path.parent.parent)


def write_lease(path: Path, until: float) -> None:
    """Readers see the old number or the new one, never a part (no fsync: a machine that went down
    has no jobs left to hold)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{until:.3f}\n")
    os.replace(tmp, path)


def read_lease(path: Path) -> float | None:
    try:
        with open(path, "rb") as f:
            return float(f.read(64))
    except (OSError, ValueError):
        return None


class Held(BaseModel):
    incarnation: int
    pids: list[int]


def read_held(jd: JobDir) -> Held | None:
    try:
        return Held.model_validate_json((jd.path / HELD_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def held_since(jd: JobDir, incarnation: int) -> bool:
    """Whether a hold of this incarnation is recorded (after a dump: it landed while CRIU ran)."""
    held = read_held(jd)
    return held is not None and held.incarnation == incarnation


@contextlib.contextmanager
def _locked(jd: JobDir) -> Iterator[None]:
    fd = os.open(jd.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def hold_tree(jd: JobDir, pid: int, incarnation: int, *, stopped_too: bool = False) -> list[int]:
    """Stops the processes of the tree of `pid` that run, and adds them to the job's held file;
    returns those it stopped now. `stopped_too`: takes the stopped ones too (a final dump left the
    tree stopped and gave up: the release is to resume it). A process forked while the tree is
    read is caught by the next pass."""
    with _locked(jd):
        held = read_held(jd)
        pids = set(held.pids) if held is not None and held.incarnation == incarnation else set()
        stopped = []
        for p in process_tree(pid):
            if p in pids:
                continue
            state = proc_state(p)
            if state is None:  # gone
                continue
            if state in NOT_RUNNING:
                if stopped_too:
                    pids.add(p)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
                pids.add(p)
        if pids and (held is None or set(held.pids) != pids):
            try:
                write_json_atomic(jd.path / HELD_FILE, Held(incarnation=incarnation, pids=sorted(pids)))
            except OSError as exc:  # a full disk: the monitor still knows what it stopped (LeaseWatch)
                log.error("cannot record the hold of %s in %s: %s", stopped, jd.path, exc)
    return stopped


def release_tree(jd: JobDir, pid: int, incarnation: int, also: Collection[int] = ()) -> list[int]:
    """Resumes what the hold of `incarnation` stopped, and `also` (what a monitor stopped whose
    record could not be written), that is still in the tree of `pid`; removes the held file;
    returns the processes resumed."""
    resumed = []
    with _locked(jd):
        held = read_held(jd)
        pids = set(also) | (set(held.pids) if held is not None and held.incarnation == incarnation else set())
        if pids:
            tree = set(process_tree(pid))
            for p in sorted(pids & tree):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)
                    resumed.append(p)
        (jd.path / HELD_FILE).unlink(missing_ok=True)
    return resumed


class LeaseWatch:
    """A monitor's side: holds its workload's tree while the node's lease is out, releases it when
    the lease is good again. ``tick`` does one look and says when the next is due; ``arm`` runs
    it on SIGALRM (the monitor sits in ``waitpid``, which the handler interrupts and Python resumes)."""

    def __init__(self, jd: JobDir, pid: int, incarnation: int, lease: Path | None = None) -> None:
        self.jd, self.pid, self.incarnation = jd, pid, incarnation
        self.lease = lease if lease is not None else node_lease_of(jd)
        self.stopped: set[int] = set()  # what this monitor stopped: resumed even if the held file was lost

    def tick(self, now: float) -> float:
        """One look at the lease; the seconds until the next."""
        until = read_lease(self.lease)
        if until is None:
            return NO_LEASE_S
        if now >= until:
            stopped = hold_tree(self.jd, self.pid, self.incarnation)
            self.stopped.update(stopped)
            if stopped:
                log.warning("the node's lease ran out %.1f s ago: processes %s held until it is renewed, so that "
                            "the job never runs beside a copy restored elsewhere", now - until, stopped)
            return HOLD_PASS_S
        if self.stopped or (self.jd.path / HELD_FILE).exists():  # ours, or a failed final dump given back
            resumed = release_tree(self.jd, self.pid, self.incarnation, self.stopped)
            log.warning("the node's lease is renewed: processes %s resumed", resumed)
            self.stopped = set()
        return until - now

    def _on_alarm(self, signum: int, frame: object) -> None:
        try:
            delay = self.tick(time.time())
        except Exception:  # never into the monitor's own work: the next look tries again
            log.exception("the lease watch failed")
            delay = HOLD_PASS_S
        signal.setitimer(signal.ITIMER_REAL, max(delay, 0.01))

    def arm(self) -> None:
        signal.signal(signal.SIGALRM, self._on_alarm)
        self._on_alarm(signal.SIGALRM, None)

    @staticmethod
    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
