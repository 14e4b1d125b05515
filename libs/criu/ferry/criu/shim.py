"""The per-job monitor (like podman's conmon): ``python -m ferry.criu.shim launch|restore ...``.

    python -m ferry.criu.shim launch --job-dir D --incarnation K [--cwd DIR] [--env-json FILE] \
        [--hide DIR ...] [--network host|isolated|bridge --address A --gateway G --host-if N
        [--node-netns PATH]] -- ARGV...
    python -m ferry.criu.shim adopt --job-dir D --incarnation K --pid PID
    python -m ferry.criu.shim restore --job-dir D --incarnation K --images IMGDIR \
        --inherit FILE_IN_D=ORIGINAL_ABS_PATH|file[MNT:INODE] ... [--criu BIN] [--criu-arg ARG ...] \
        [--node-netns PATH]

Processes:

    starter (the caller's child)  validates, forks, waits for the monitor's report, then exits:
        0 and one JSON line {"pid": <workload host pid>, "shim_pid": <monitor pid>} on stdout, or
        1 and a one-line error on stderr (for restore, CRIU's log excerpt on the following lines).
    monitor                       the starter's child, reparented when the starter exits; leads a
        session of its own (setsid), child subreaper, stdio on D/shim.log. launch: unshares a PID
        namespace and forks the workload as its PID 1, in a private mount namespace with a /proc
        and a /dev of its own (``linux.mount_own_proc``, ``linux.private_dev``), each --hide
        folder (the node's secrets and data) under an empty tmpfs (``linux.hide_dirs``), and
        without the capabilities that would undo that (``linux.drop_capabilities``); restore:
        runs ``criu restore -d``, whose restored root is reparented to it; adopt: watches a
        process another supervisor started (``monitor_adopt``). Writes D/shim.json,
        reports, waits for the workload, writes D/exit.json, exits. It never writes to D/stdout or D/stderr.

The monitor outlives whoever started it, so exit codes are collected even when the node service is
restarted; that service finds the job again through shim.json and exit.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from ferry.common.errors import UsageError
from ferry.criu import container
from ferry.criu.binary import find_criu
from ferry.criu.external import is_external_key
from ferry.criu.handoff import HandoffReply, write_reply
from ferry.criu.hold import LeaseWatch
from ferry.criu.jobdir import ExitInfo, JobDir, ShimInfo
from ferry.criu.linux import (
    CLONE_NEWPID,
    drop_capabilities,
    hide_dirs,
    isolate_network,
    mount_own_proc,
    private_dev,
    refuse_io_uring,
    reset_signals,
    set_child_subreaper,
    setns,
    unshare,
)
from ferry.criu.logs import failure_summary
from ferry.criu.runner import RESTORE_LOG, CriuRunner
from ferry.criu.veth import JobLink, attach, enter

__all__ = ["main"]

log = logging.getLogger("ferry.criu.shim")

Report = Callable[[dict[str, Any]], None]


class Refused(UsageError):
    """Invalid request, found before anything started."""


@dataclass(frozen=True)
class LaunchPlan:
    job_dir: JobDir
    incarnation: int
    argv: list[str]
    executable: str
    cwd: str
    env: dict[str, str]
    hide: tuple[str, ...] = ()
    network: str = "host"
    container: bool = False  # run <job dir>/bundle with runc (ferry.criu.container)
    link: JobLink | None = None  # network "bridge": the veth the monitor makes (ferry.criu.veth)


@dataclass(frozen=True)
class AdoptPlan:
    job_dir: JobDir
    incarnation: int
    pid: int


@dataclass(frozen=True)
class RestorePlan:
    job_dir: JobDir
    incarnation: int
    images: Path
    inherit: list[tuple[Path, str]]
    criu: str
    criu_args: tuple[str, ...] = ()
    container: bool = False
    node_netns: str | None = None  # criu restore runs there: a bridge-network job's veth lands on its bridge


# -- validation (in the starter) -----------------------------------------------------------------


def _resolve_executable(cmd: str, env: dict[str, str], cwd: str) -> str:
    if "/" in cmd:
        path = os.path.join(cwd, cmd)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
        raise Refused(f"command not found or not executable: {cmd}")
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        raise Refused(f"command not found: {cmd} (PATH={env.get('PATH', os.defpath)})")
    return os.path.abspath(found)


def _load_env(path: str | None) -> dict[str, str]:
    if path is None:
        return dict(os.environ)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"cannot read --env-json {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise Refused(f"--env-json {path} must hold a JSON object of strings")
    return data


def plan_launch(ns: argparse.Namespace, argv: list[str]) -> LaunchPlan:
    if ns.container:  # the command and its folder are the bundle's (ferry.criu.container)
        if not (container.bundle_of(JobDir(ns.job_dir)) / "config.json").is_file():
            raise Refused(f"--container: no bundle in {ns.job_dir}")
        return LaunchPlan(JobDir(ns.job_dir), ns.incarnation, argv, "", "/", {}, container=True)
    if not argv:
        raise Refused("no command given (expected: launch ... -- ARGV...)")
    cwd = os.path.abspath(ns.cwd) if ns.cwd else os.getcwd()
    if not os.path.isdir(cwd):
        raise Refused(f"working directory does not exist: {cwd}")
    env = _load_env(ns.env_json)
    executable = _resolve_executable(argv[0], env, cwd)
    hide = tuple(os.path.realpath(p) for p in ns.hide)
    for path in hide:
        if path == "/" or not os.path.isabs(path):
            raise Refused(f"--hide wants a folder other than /, got {path!r}")
        for needed, what in ((cwd, "working directory"), (executable, "command")):
            if os.path.realpath(needed) == path or os.path.realpath(needed).startswith(path + "/"):
                raise Refused(f"the job's {what} {needed} is inside {path}, which jobs must not see")
    link = None
    if ns.network == "bridge":
        if not (ns.address and ns.gateway and ns.host_if):
            raise Refused("--network bridge needs --address, --gateway and --host-if")
        link = JobLink(ns.address, ns.gateway, ns.host_if, ns.node_netns or None)
    return LaunchPlan(JobDir(ns.job_dir), ns.incarnation, argv, executable, cwd, env, hide, ns.network, link=link)


def plan_restore(ns: argparse.Namespace) -> RestorePlan:
    job_dir = JobDir(ns.job_dir)
    images = Path(ns.images).absolute()
    if not (images / "inventory.img").is_file():
        raise Refused(f"no CRIU images in {images} (inventory.img missing)")
    criu = find_criu(ns.criu)
    if criu is None:
        raise Refused(f"criu binary {ns.criu!r} not found")
    inherit = []
    for item in ns.inherit:
        name, sep, original = item.partition("=")
        local = (job_dir.path / name).resolve()
        if not sep or not name or not (os.path.isabs(original) or is_external_key(original)):
            raise Refused(f"--inherit wants FILE_IN_JOB_DIR=ORIGINAL_ABS_PATH or =file[MNT:INODE], got {item!r}")
        if not local.is_relative_to(job_dir.path.resolve()):
            raise Refused(f"--inherit file {name!r} is outside the job directory")
        if not local.is_file():
            raise Refused(f"--inherit file {local} does not exist")
        inherit.append((local, original))
    if ns.node_netns and not os.path.exists(ns.node_netns):
        raise Refused(f"--node-netns {ns.node_netns} does not exist")
    return RestorePlan(job_dir, ns.incarnation, images, inherit, criu, tuple(ns.criu_arg), ns.container,
                       ns.node_netns or None)


# -- detaching -----------------------------------------------------------------------------------


def detach(job_dir: JobDir, monitor: Callable[[Report], int]) -> int:
    """Run ``monitor`` in a detached child (its own session); relay its report; return the starter's exit code."""
    job_dir.create()
    job_dir.clear_run_state()
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # One fork, not the daemon's two: the monitor leads a session of its own (it opens no
    # terminal), and is reparented when this starter exits, as a grandchild would have been when
    # the intermediate did. The second fork cost about 1.5 ms of a launch's 20 ms of CPU here.
    if os.fork() == 0:
        code = 1
        try:
            os.close(r)
            os.setsid()
            code = _monitor_main(job_dir, lambda msg: _write_and_close(w, msg), monitor)
        finally:
            os._exit(code)
    os.close(w)
    chunks = []  # until the monitor reported and closed its end (its workload's copy closes on exec)
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    try:
        msg = json.loads(b"".join(chunks))
    except ValueError:
        print(f"ferry-shim: the monitor died before reporting; see {job_dir.shim_log}", file=sys.stderr)
        return 1
    if msg.get("ok"):
        print(json.dumps({"pid": msg["pid"], "shim_pid": msg["shim_pid"]}), flush=True)
        return 0
    print(f"ferry-shim: {msg.get('error', 'failed')}", file=sys.stderr)
    for line in msg.get("detail", []):
        print(line, file=sys.stderr)
    sys.stderr.flush()
    return 1


def _write_and_close(w: int, msg: dict[str, Any]) -> None:
    try:
        os.write(w, json.dumps(msg).encode())
    finally:
        os.close(w)


def foreground(job_dir: JobDir, incarnation: int, monitor: Callable[[Report], int]) -> int:
    """Run ``monitor`` in this process (``--foreground``, for a ``--here`` caller that runs the
    shim as its child, ``ferry.criu.handoff``): its report goes to the job directory, where the
    node service waits for it, and this process ends with the workload's exit status."""
    job_dir.create()
    job_dir.clear_run_state()
    os.setpgid(0, 0)  # its own group: a cancelled restore kills the monitor's group, never the caller
    sys.stdout.flush()
    sys.stderr.flush()
    error = os.dup(2)  # the caller still hears why a start failed

    def deliver(msg: dict[str, Any]) -> None:
        write_reply(job_dir, HandoffReply(incarnation=incarnation, **msg))
        if not msg.get("ok"):
            os.write(error, f"ferry-shim: {msg.get('error', 'failed')}\n".encode())

    # The caller decides what a SIGTERM means. A handler, not SIG_IGN, which CRIU would inherit:
    # its cgroup helper then never ends, and the restore hangs.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    if _monitor_main(job_dir, deliver, monitor) != 0:
        return 1
    ended = job_dir.read_exit()
    if ended is None or ended.incarnation != incarnation:
        return 1
    if ended.signal is not None:
        return 128 + ended.signal
    return ended.code if ended.code is not None else 1


def _monitor_main(job_dir: JobDir, deliver: Callable[[dict[str, Any]], None], monitor: Callable[[Report], int]) -> int:
    devnull = os.open(os.devnull, os.O_RDONLY)
    logfd = os.open(job_dir.shim_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(devnull, 0)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(devnull)
    os.close(logfd)
    os.chdir("/")
    with contextlib.suppress(OSError):  # who to kill when the starter gives up on an unfinished restore
        job_dir.monitor_file.write_text(str(os.getpgrp()))
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s shim[%(process)d] %(levelname)s %(message)s",
    )
    reported = False

    def report(msg: dict[str, Any]) -> None:
        nonlocal reported
        if reported:
            return
        reported = True
        deliver(msg)

    try:
        set_child_subreaper()
        return monitor(report)
    except Exception as exc:
        log.exception("monitor failed")
        report({"ok": False, "error": f"shim failed: {exc}"})
        return 1


def _wait_workload(job_dir: JobDir, pid: int, incarnation: int) -> int:
    """Reap children (we are a subreaper) until the workload ends; record how it ended."""
    while True:
        try:
            wpid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            log.error("workload %d vanished without an exit status", pid)
            job_dir.write_exit(ExitInfo(code=None, signal=None, finished=time.time(), incarnation=incarnation))
            return 1
        if wpid != pid:
            log.info("reaped orphan %d (status %#x)", wpid, status)
            continue
        LeaseWatch.disarm()
        code = os.waitstatus_to_exitcode(status)
        info = ExitInfo(
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            finished=time.time(),
            incarnation=incarnation,
        )
        job_dir.write_exit(info)
        log.info("workload %d ended: code=%s signal=%s", pid, info.code, info.signal)
        break
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    return 0


def _started(plan_dir: JobDir, report: Report, pid: int, incarnation: int,
             mode: Literal["launch", "restore", "adopt"]) -> None:
    info = ShimInfo(shim_pid=os.getpid(), pid=pid, incarnation=incarnation, started=time.time(), mode=mode)
    try:
        plan_dir.write_shim(info)
    except BaseException:
        # Nobody could find a workload that shim.json does not name: stop it rather than orphan it.
        os.kill(pid, signal.SIGKILL)
        raise
    log.info("%s: workload pid %d, incarnation %d", mode, pid, incarnation)
    report({"ok": True, "pid": pid, "shim_pid": info.shim_pid})
    # held while the node's lease is out: it may be declared lost and the job restored elsewhere
    LeaseWatch(plan_dir, pid, incarnation).arm()


# -- launch --------------------------------------------------------------------------------------


def _exec_workload(plan: LaunchPlan, errpipe: int, linked: tuple[int, int] | None = None) -> NoReturn:
    """In the forked child (PID 1 of the new namespace): set up and exec, or report why not.
    ``linked`` (a bridge network): pipes to say the namespace is there and to wait for its veth."""
    step = "start"
    try:
        os.setsid()
        if plan.network in ("isolated", "bridge"):
            step = "make the job's own network"
            isolate_network()
        if linked is not None:
            step = "wait for the job's veth"
            os.write(linked[0], b"n")
            if os.read(linked[1], 1) != b"y":
                raise OSError(0, "the monitor could not make it")
        step = "mount the job's own /proc"
        mount_own_proc()
        step = "make the job's own /dev"
        staging = tempfile.mkdtemp(prefix=".dev-", dir=plan.job_dir.path)
        private_dev(staging)
        os.rmdir(staging)
        reset_signals()
        step = "open stdio"  # before the job folder may be hidden
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(plan.job_dir.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = os.open(plan.job_dir.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        for fd in (stdin, out, err):
            os.close(fd)
        step = "hide the node's folders"
        hide_dirs(plan.hide)
        step = "refuse io_uring"  # CRIU cannot dump it: libraries fall back to epoll
        refuse_io_uring()
        step = "drop capabilities"
        drop_capabilities()
        step = f"chdir to {plan.cwd}"
        os.chdir(plan.cwd)
        os.closerange(3, errpipe)
        os.closerange(errpipe + 1, 1 << 20)
        step = f"execute {plan.argv[0]}"
        os.execve(plan.executable, plan.argv, plan.env)
    except BaseException as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        try:
            os.write(errpipe, f"cannot {step}: {reason}".encode())
        finally:
            os._exit(127)
    os._exit(127)  # execve returned: impossible


def monitor_launch(plan: LaunchPlan, report: Report) -> int:
    if plan.container:
        pidfile = plan.job_dir.path / "container.pid"
        return _monitor_container(plan.job_dir, plan.incarnation, container.run_command(plan.job_dir, pidfile),
                                  pidfile, "launch", report)
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    unshare(CLONE_NEWPID)
    r, w = os.pipe()  # close-on-exec: EOF without data means the exec succeeded
    linked = (os.pipe(), os.pipe()) if plan.link is not None else None  # (namespace made, veth made)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _exec_workload(plan, w, (linked[0][1], linked[1][0]) if linked else None)
    os.close(w)
    # the monitor's later children (the ip commands) in its own PID namespace again, not the job's
    setns(f"/proc/self/fd/{own_pid_ns}", CLONE_NEWPID)
    os.close(own_pid_ns)
    if linked is not None and plan.link is not None:
        os.close(linked[0][1])
        os.close(linked[1][0])
        ready = os.read(linked[0][0], 1) == b"n"  # else the child failed before: its error follows
        problem = None
        if ready:
            try:
                attach(pid, plan.link)
            except OSError as exc:
                problem = str(exc)
                log.error("the job's veth: %s", problem)
        with contextlib.suppress(OSError):
            os.write(linked[1][1], b"y" if ready and problem is None else b"n")
        os.close(linked[1][1])
        os.close(linked[0][0])
        if problem is not None:
            os.waitpid(pid, 0)
            os.close(r)
            report({"ok": False, "error": f"cannot give the job its network: {problem}"})
            return 1
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    if chunks:
        error = b"".join(chunks).decode(errors="replace")
        os.waitpid(pid, 0)
        log.error("launch failed: %s", error)
        report({"ok": False, "error": error})
        return 1
    _started(plan.job_dir, report, pid, plan.incarnation, "launch")
    return _wait_workload(plan.job_dir, pid, plan.incarnation)


# -- restore -------------------------------------------------------------------------------------


def monitor_restore(plan: RestorePlan, report: Report) -> int:
    if plan.container:
        pidfile = plan.job_dir.path / "container.pid"
        return _monitor_container(plan.job_dir, plan.incarnation,
                                  container.restore_command(plan.job_dir, plan.images, pidfile), pidfile, "restore",
                                  report)
    log_path = plan.images / RESTORE_LOG
    log_path.unlink(missing_ok=True)  # never blame a failure on an older run's log
    if plan.node_netns is not None:  # CRIU makes the node's end of the job's veth in its own namespace
        enter(plan.node_netns)
    pidfile = plan.job_dir.path / "restore.pid"
    pidfile.unlink(missing_ok=True)  # CRIU creates it with O_EXCL
    fds: dict[int, str] = {}
    # CRIU's own output goes to a file, not a pipe: the restored tree must not inherit our end.
    with tempfile.TemporaryFile() as output:
        try:
            for local, original in plan.inherit:
                fds[os.open(local, os.O_WRONLY | os.O_APPEND)] = original
            argv = CriuRunner(plan.criu).restore_command(plan.images, pidfile, fds, plan.criu_args)
            log.info("running %s", " ".join(argv))
            started = time.monotonic()
            rc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, pass_fds=list(fds), check=False
            ).returncode
            log.info("criu restore exited %d after %.0f ms", rc, (time.monotonic() - started) * 1000)
        finally:
            for fd in fds:
                os.close(fd)
        output.seek(0)
        text = output.read().decode(errors="replace")
    if text.strip():
        log.info("criu said:\n%s", text.rstrip())
    if rc != 0:
        excerpt, reason = failure_summary(log_path, text)
        report({"ok": False, "error": f"criu restore failed: {reason}", "detail": excerpt})
        _reap_all()
        return 1
    pid = int(pidfile.read_text().strip())
    _started(plan.job_dir, report, pid, plan.incarnation, "restore")
    return _wait_workload(plan.job_dir, pid, plan.incarnation)


# -- containers ----------------------------------------------------------------------------------


def _monitor_container(job_dir: JobDir, incarnation: int, command: list[str], pidfile: Path,
                       mode: Literal["launch", "restore"], report: Report) -> int:
    """runc starts (or restores) the container detached; its init is reparented to this monitor
    (a subreaper), which copies its stdout and stderr pipes into the job's output files."""
    pidfile.unlink(missing_ok=True)
    container.runc_log(job_dir).unlink(missing_ok=True)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDONLY)
    log.info("running %s", " ".join(command))
    try:
        rc = subprocess.run(command, stdin=devnull, stdout=out_w, stderr=err_w, check=False).returncode
    finally:
        for fd in (out_w, err_w, devnull):
            os.close(fd)
    # what a dump's post-dump script needs to wait until these pipes are copied out (ferry.criu.container)
    (job_dir.path / container.RELAY_FILE).write_text(json.dumps({"pid": os.getpid(), "fds": [out_r, err_r]}))
    relays = [_Relay(out_r, job_dir.stdout), _Relay(err_r, job_dir.stderr)]
    for relay in relays:
        relay.start()
    if rc != 0:
        error = container.runc_error(job_dir, f"runc exited {rc}")
        log.error("runc %s failed: %s", mode, error)
        report({"ok": False, "error": f"runc {'run' if mode == 'launch' else 'restore'} failed: {error}"})
        _reap_all()
        return 1
    pid = int(pidfile.read_text().strip())
    _started(job_dir, report, pid, incarnation, mode)
    code = _wait_workload(job_dir, pid, incarnation)
    done = subprocess.run(container.delete_command(job_dir), capture_output=True, check=False)
    if done.returncode != 0:
        log.warning("runc delete: %s", container.runc_error(job_dir, str(done.returncode)))
    for relay in relays:
        relay.join(10)
    return code


class _Relay(threading.Thread):
    """Copies a pipe into an output file until every writer is gone."""

    def __init__(self, fd: int, path: Path) -> None:
        super().__init__(daemon=True)
        self.fd, self.path = fd, path

    def run(self) -> None:
        out = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            while chunk := os.read(self.fd, 65536):
                os.write(out, chunk)
        finally:
            os.close(out)
            os.close(self.fd)


# -- adopt ---------------------------------------------------------------------------------------


def monitor_adopt(plan: AdoptPlan, report: Report) -> int:
    """Watches a process that another supervisor started (it stays that one's child) until it
    ends. Its exit status goes to its parent: it is read from /proc while the process is a zombie
    not yet reaped, and recorded as unknown when the parent was quicker."""
    try:
        pidfd = os.pidfd_open(plan.pid)
    except OSError as exc:
        report({"ok": False, "error": f"cannot watch process {plan.pid}: {exc.strerror or exc}"})
        return 1
    _started(plan.job_dir, report, plan.pid, plan.incarnation, "adopt")
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while not poller.poll():
        pass
    code, sig = _zombie_status(plan.pid)
    os.close(pidfd)
    plan.job_dir.write_exit(ExitInfo(code=code, signal=sig, finished=time.time(), incarnation=plan.incarnation))
    log.info("adopted process %d ended: code=%s signal=%s", plan.pid, code, sig)
    return 0


def _zombie_status(pid: int) -> tuple[int | None, int | None]:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None, None
    if fields[0] != "Z" or len(fields) < 50:
        return None, None
    status = int(fields[49])  # exit_code (field 52), as waitpid would give it
    code = os.waitstatus_to_exitcode(status)
    return (code, None) if code >= 0 else (None, -code)


def _reap_all() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


# -- command line --------------------------------------------------------------------------------


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The command line's parser, built once per process (a zygote builds it before it forks)."""
    top = argparse.ArgumentParser(prog="python -m ferry.criu.shim", description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="mode", required=True)
    for mode in ("launch", "restore", "adopt"):
        p = sub.add_parser(mode)
        p.add_argument("--job-dir", required=True)
        p.add_argument("--incarnation", type=int, required=True)
        p.add_argument("--foreground", action="store_true",
                       help="monitor in this process, report in the job directory, exit with the workload's status "
                            "(what a `--here` caller runs)")
        if mode == "launch":
            p.add_argument("--cwd")
            p.add_argument("--env-json")
            p.add_argument("--hide", action="append", default=[], metavar="DIR",
                           help="a folder the workload must not see (repeat)")
            p.add_argument("--network", choices=["host", "isolated", "bridge"], default="host",
                           help="isolated: a network namespace of the workload's own, loopback only; bridge: "
                                "that and a veth to the node's bridge (ferry.criu.veth)")
            p.add_argument("--address", help="bridge: the job's address")
            p.add_argument("--gateway", help="bridge: the bridge's address")
            p.add_argument("--host-if", help="bridge: the name of the node's end of the veth")
            p.add_argument("--container", action="store_true", help="run the job folder's OCI bundle with runc")
        elif mode == "adopt":
            p.add_argument("--pid", type=int, required=True, help="the process to watch (it is not our child)")
        else:
            p.add_argument("--images", required=True)
            p.add_argument("--inherit", action="append", default=[], metavar="FILE_IN_D=ORIGINAL_ABS_PATH")
            p.add_argument("--criu", default="criu")
            p.add_argument("--criu-arg", action="append", default=[], metavar="ARG",
                           help="one more option for criu restore (repeat)")
            p.add_argument("--container", action="store_true", help="restore the job folder's OCI bundle with runc")
        if mode in ("launch", "restore"):
            p.add_argument("--node-netns", default="", help="the network namespace of the node's bridge")
    return top


def main(args: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    command: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, command = args[:cut], args[cut + 1 :]
    ns = parser().parse_args(args)
    try:
        if ns.mode == "launch":
            lplan = plan_launch(ns, command)
            monitor: Callable[[Report], int] = lambda report: monitor_launch(lplan, report)  # noqa: E731
            job_dir = lplan.job_dir
        elif ns.mode == "adopt":
            aplan = AdoptPlan(JobDir(ns.job_dir), ns.incarnation, ns.pid)
            monitor = lambda report: monitor_adopt(aplan, report)  # noqa: E731
            job_dir = aplan.job_dir
        else:
            if command:
                raise Refused("restore takes no command")
            rplan = plan_restore(ns)
            monitor = lambda report: monitor_restore(rplan, report)  # noqa: E731
            job_dir = rplan.job_dir
        if ns.foreground:
            return foreground(job_dir, ns.incarnation, monitor)
        return detach(job_dir, monitor)
    except (Refused, OSError) as exc:
        print(f"ferry-shim: {exc}", file=sys.stderr)
        if ns.foreground:  # the node service waits for an answer
            with contextlib.suppress(OSError):
                write_reply(JobDir(ns.job_dir), HandoffReply(incarnation=ns.incarnation, ok=False, error=str(exc)))
        return 1


if __name__ == "__main__":
    sys.exit(main())
