"""`ferry run --here` and `ferry restore --here`: the job runs as a child of this command.

What a SLURM step or a container runtime needs: the workload starts (or comes back from its
checkpoint) as a descendant of the calling process, in its cgroup (or ``--cgroup PATH``), its
output appears on this command's stdout and stderr, and the command ends with the job's exit
status. Ferry still supervises it as any other job: it checkpoints it, reports its exit, fences it.

The node's service hands the job's shim to this command (``ferry.criu.handoff``), which runs it
as its child; so this command must run on the job's node, as the user the node services run as.

Signals: SIGTERM or SIGINT stop the job. With ``--checkpoint-on-term`` the job is checkpointed
first (``ferry checkpoint --stop``), so that ``ferry restore JOB --here`` continues it; otherwise
it gets SIGTERM, then SIGKILL after the grace period. A job stopped by a checkpoint ends this
command with STOPPED_EXIT (128 + SIGTERM: a supervisor sees a terminated step, not a success).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ferry.cli.client import Client
from ferry.cli.output import job_dict, print_json
from ferry.common.errors import FerryError, UsageError, from_kind
from ferry.criu.handoff import POLL_S, Handoff, find_offer, read_reply
from ferry.criu.jobdir import JobDir
from ferry.criu.treekill import kill_tree
from ferry.v1 import ferry_pb2 as pb

__all__ = ["STOPPED_EXIT", "Foreground", "join_cgroup", "restore_here", "run_here"]

STOPPED_EXIT = 128 + signal.SIGTERM
END_RECORD_WAIT_S = 10.0  # how long the command waits for the job's end to be recorded
TAKE_TIMEOUT_S = 120.0
STOP_WAIT_S = 600.0  # for the checkpoint that stops the job to be committed
FOLLOW_S = 0.1


def join_cgroup(path: str) -> None:
    """Moves this process (and so the job it starts) into the cgroup at `path`."""
    procs = Path(path) / "cgroup.procs"
    if not procs.is_file():
        raise UsageError(f"--cgroup {path}: not a cgroup (it has no cgroup.procs)")
    try:
        procs.write_text(f"{os.getpid()}\n")
    except OSError as exc:
        raise UsageError(f"--cgroup {path}: cannot join it: {exc.strerror or exc}") from exc


class _Follower(threading.Thread):
    """Copies what the job appends to one of its output files onto one of ours."""

    def __init__(self, path: Path, out: BinaryIO, offset: int) -> None:
        super().__init__(daemon=True)
        self.path, self.out, self.offset = path, out, offset
        self.done = threading.Event()

    def copy(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while chunk := f.read(1 << 16):
                    self.out.write(chunk)
                    self.offset += len(chunk)
            self.out.flush()
        except (FileNotFoundError, BrokenPipeError):
            pass

    def run(self) -> None:
        while not self.done.wait(FOLLOW_S):
            self.copy()
        self.copy()


@dataclass
class Foreground:
    """Takes the job's start from its node and runs it as this process's child.

    `stop`: called (in a thread) on SIGTERM or SIGINT when the job is to be checkpointed before it
    stops; without it the signal ends the job after `grace_s`."""

    jobs_dir: Path  # the node's job directories
    job: str  # the job's name (its id may not be known yet: a submit returns once the job runs)
    newer_than: int  # the job's incarnation before this command's request
    stop: Callable[[], None] | None = None
    grace_s: float = 10.0
    replay: bool = False  # a restore prints the job's output from its start, not from the checkpoint on
    job_dir: JobDir | None = None
    child: subprocess.Popen[bytes] | None = None
    stopping: bool = False
    _stopper: threading.Thread | None = None
    _followers: list[_Follower] = field(default_factory=list)

    def take(self, abandon: threading.Event) -> Handoff | None:
        """The node's offer; None when `abandon` is set first (the request failed) or none came."""
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        while time.monotonic() < deadline and not abandon.is_set():
            found = find_offer(self.jobs_dir, self.job, newer_than=self.newer_than)
            if found is not None:
                self.job_dir, offered = found
                return offered
            abandon.wait(POLL_S)
        return None

    def run(self, offered: Handoff) -> int:
        """Runs the offered shim; returns the exit status this command should end with."""
        assert self.job_dir is not None, "take() first"
        starts = {"stdout": 0, "stderr": 0}
        if offered.mode == "restore" and not self.replay:  # an earlier run printed what came before the checkpoint
            starts = {name: _size(self.job_dir.path / name) for name in starts}
        self._followers = [_Follower(self.job_dir.stdout, sys.stdout.buffer, starts["stdout"]),
                           _Follower(self.job_dir.stderr, sys.stderr.buffer, starts["stderr"])]
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.child = subprocess.Popen(offered.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            # the output is copied once the job runs: a restore that fails prints none of the old output
            while self.child.poll() is None and read_reply(self.job_dir, offered.incarnation) is None:
                time.sleep(POLL_S)
            reply = read_reply(self.job_dir, offered.incarnation)
            if reply is not None and reply.ok:
                for follower in self._followers:
                    follower.start()
            code = self.child.wait()
            if self._stopper is not None:  # the dump ended the job: wait until its checkpoint is committed
                self._stopper.join(STOP_WAIT_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for follower in self._followers:
                follower.done.set()
            for follower in self._followers:
                if follower.is_alive():
                    follower.join()
        if (self.job_dir.path / f"stop-{offered.incarnation}").exists():
            return STOPPED_EXIT  # a checkpoint stopped it: `ferry restore --here` continues it
        reply = read_reply(self.job_dir, offered.incarnation)
        if reply is not None and not reply.ok:  # it never started (CRIU refused the restore): not its status
            raise FerryError(f"{self.job}: the {offered.mode} on this node failed: {reply.error}")
        return code

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stopping:
            return
        self.stopping = True
        print(f"ferry: {signal.Signals(signum).name}: " + ("checkpointing the job, then stopping it"
              if self.stop else f"stopping the job (SIGKILL after {self.grace_s:.0f} s)"), file=sys.stderr)
        self._stopper = threading.Thread(target=self._stop_job, daemon=True)
        self._stopper.start()

    def _stop_job(self) -> None:
        if self.stop is not None:
            try:
                self.stop()
                return
            except FerryError as exc:
                print(f"ferry: the checkpoint failed ({exc}): stopping the job without one", file=sys.stderr)
        shim = self.job_dir.read_shim() if self.job_dir is not None else None
        if shim is not None:
            asyncio.run(kill_tree(shim.pid, self.grace_s))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# -- the commands --------------------------------------------------------------------------------


def _prepare(client: Client, args: argparse.Namespace) -> Path:
    """Checks that this machine is the job's node and joins --cgroup; returns the node's job folders."""
    node = args.node
    found = next((n for n in client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes if n.id == node), None)
    if found is None:
        raise UsageError(f"--here: no node {node!r} has joined the cluster: `ferry nodes` lists them")
    try:
        owner = Path(found.address).stat().st_uid if found.address else None
    except FileNotFoundError:
        owner = None
    except OSError as exc:  # a folder this user may not even look into
        raise UsageError(f"--here: cannot read the folder of node {node} ({exc.strerror}): run it as the user the "
                         f"node services run as") from None
    if owner is None or not Path(found.address).is_dir():
        raise UsageError(f"--here: the folder of node {node} ({found.address or 'unknown'}) is not on this machine: "
                         f"run the command on that node")
    if owner != os.geteuid():  # the shim it runs reads the node's job folders and runs CRIU as that user
        raise UsageError(f"--here: node {node}'s services run as uid {owner}, this command as uid {os.geteuid()}: "
                         f"run it as the user the node services run as")
    if args.cgroup:
        join_cgroup(args.cgroup)
    return Path(found.address) / "jobs"


def _stopper(client: Client, job: str) -> Callable[[], None]:
    def stop() -> None:
        for update in client.stream(client.stub.Checkpoint, pb.CheckpointRequest(job=job, stop=True)):
            if update.done:
                if update.error:
                    raise FerryError(update.error)
                print(f"ferry: checkpointed as {update.checkpoint.id}; `ferry restore {job} --here` continues it",
                      file=sys.stderr)
                return

    return stop


class _Request(threading.Thread):
    """Runs the API call that makes the node offer the start (it returns once the job runs, so
    only after this command took the offer)."""

    def __init__(self, call: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.failed = threading.Event()
        self.error: FerryError | None = None

    def run(self) -> None:
        try:
            self.call()
        except FerryError as exc:
            self.error = exc
            self.failed.set()


def _op_error(update: pb.OpUpdate) -> FerryError:
    return from_kind(update.error_kind, update.error) if update.error_kind else FerryError(update.error)


def _finish(client: Client, args: argparse.Namespace, fg: Foreground, request: _Request) -> int:
    request.start()
    offered = fg.take(request.failed)
    if offered is None:
        if request.error is not None:
            raise request.error
        with contextlib.suppress(FerryError):  # nobody else would take its start: end it
            client.call(client.stub.KillJob, pb.KillJobRequest(job=fg.job, grace_s=0))
        raise FerryError(f"{fg.job}: node {args.node} offered no start within {TAKE_TIMEOUT_S:.0f} s "
                         f"(`ferry status {fg.job}` says why); it was killed")
    code = fg.run(offered)
    if code != STOPPED_EXIT:  # it ended: return once its end is recorded (`ferry status` then says so)
        with contextlib.suppress(FerryError):  # best effort: the node reports it within a second
            client.call(client.stub.WaitJob, pb.WaitJobRequest(job=fg.job, timeout_s=END_RECORD_WAIT_S))
    if args.output == "json":
        job = client.call(client.stub.GetJob, pb.JobRef(job=fg.job))
        print_json({**job_dict(job), "exit_status": code, "stopped_by_checkpoint": code == STOPPED_EXIT})
    return code


def run_here(client: Client, args: argparse.Namespace) -> int:
    """`ferry run --here`: submits the job for this node and runs it in the foreground."""
    jobs_dir = _prepare(client, args)
    request = args.request
    if not request.name:  # the offer is found by name, so it must be known before the job exists
        request = request.model_copy(update={"name": f"here-{uuid.uuid4().hex[:8]}"})
    fg = Foreground(jobs_dir, request.name, newer_than=-1,
                    stop=_stopper(client, request.name) if args.checkpoint_on_term else None, grace_s=args.grace_s)

    def submit() -> None:
        client.call(client.stub.SubmitJob, pb.SubmitJobRequest(**request.model_dump()))

    return _finish(client, args, fg, _Request(submit))


def restore_here(client: Client, args: argparse.Namespace) -> int:
    """`ferry restore JOB --here`: restores the job on this node, in the foreground."""
    jobs_dir = _prepare(client, args)
    job = client.call(client.stub.GetJob, pb.JobRef(job=args.job))
    fg = Foreground(jobs_dir, job.name, newer_than=job.incarnation,
                    stop=_stopper(client, job.name) if args.checkpoint_on_term else None, grace_s=args.grace_s,
                    replay=args.replay_output)

    def restore() -> None:
        req = pb.RestoreRequest(job=job.id, node=args.node, checkpoint=args.checkpoint or "", here=True)
        for update in client.stream(client.stub.Restore, req):
            if update.done and update.error:
                raise _op_error(update)

    return _finish(client, args, fg, _Request(restore))
