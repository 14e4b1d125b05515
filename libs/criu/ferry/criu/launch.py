"""Starting a workload, or restoring one, under its own shim (``python -m ferry.criu.shim``).

The helpers return once the workload runs (the shim wrote ``shim.json``); the shim then outlives
the caller and records ``exit.json``. Cancelling a helper kills only the shim's starter process: a
monitor that got that far still starts the workload and records it in the job directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from ferry.criu.binary import find_criu, setup_hint
from ferry.criu.errors import CriuError, CriuMissing, LaunchFailed, RestoreFailed
from ferry.criu.handoff import FOREGROUND_FLAG, Handoff, offer
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.runner import RESTORE_LOG
from ferry.criu.veth import JobLink
from ferry.criu.zygote import ZygoteClient

__all__ = ["adopt", "launch", "restore"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
HERE_CGROUPS = "--manage-cgroups=ignore"


class _StarterReply(BaseModel):
    pid: int
    shim_pid: int


async def launch(
    job_dir: JobDir,
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    incarnation: int,
    hide: Sequence[str | os.PathLike[str]] = (),
    network: str = "host",
    link: JobLink | None = None,
    container: bool = False,
    here: str | None = None,
    python: str = sys.executable,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    zygote: ZygoteClient | None = None,
) -> ShimInfo:
    """Start ``argv`` as PID 1 of a new PID namespace under a detached shim (``here``, the job's
    name: under a shim that the job's ``--here`` caller runs in its foreground, ``ferry.criu.handoff``).

    Each folder of ``hide`` that exists is out of the workload's sight (an empty tmpfs over it in
    the job's mount namespace). ``network`` "isolated" gives it a network namespace of its own
    with loopback only; "bridge" that and ``link``, a veth to the node's bridge (``ferry.criu.veth``).

    ``env`` is the workload's whole environment (its PATH finds the command); ``cwd`` None means
    the caller's. Raises LaunchFailed (command not found, bad cwd, exec failure, ...).
    """
    job_dir.create()
    env_file = _write_env(job_dir, env)
    try:
        cmd = [python, "-m", "ferry.criu.shim", "launch", "--job-dir", str(job_dir.path)]
        cmd += ["--incarnation", str(incarnation), "--env-json", str(env_file)]
        if cwd is not None:
            cmd += ["--cwd", os.fspath(cwd)]
        for path in hide:
            cmd += ["--hide", os.fspath(path)]
        cmd += ["--network", network]
        if network == "bridge":
            if link is None:
                raise LaunchFailed("a bridge-network job needs its link (address, gateway, veth name)")
            cmd += ["--address", link.address, "--gateway", link.gateway, "--host-if", link.host_if]
            if link.node_netns:
                cmd += ["--node-netns", link.node_netns]
        if container:  # <job dir>/bundle, with runc (ferry.criu.container)
            cmd.append("--container")
        cmd += ["--", *argv]
        if here:
            return await _hand_off(job_dir, here, cmd, "launch", incarnation, timeout_s, LaunchFailed, log_path=None)
        return await _start(job_dir, cmd, timeout_s, LaunchFailed, log_path=None, zygote=zygote)
    finally:
        env_file.unlink(missing_ok=True)


async def adopt(
    job_dir: JobDir,
    pid: int,
    *,
    incarnation: int,
    python: str = sys.executable,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    zygote: ZygoteClient | None = None,
) -> ShimInfo:
    """Watch the running process ``pid`` (``ferry adopt``) under a detached shim, which records its
    end in the job directory as for any workload. Raises LaunchFailed."""
    job_dir.create()
    cmd = [python, "-m", "ferry.criu.shim", "adopt", "--job-dir", str(job_dir.path), "--incarnation",
           str(incarnation), "--pid", str(pid)]
    return await _start(job_dir, cmd, timeout_s, LaunchFailed, log_path=None, zygote=zygote)


async def restore(
    job_dir: JobDir,
    images_dir: Path,
    *,
    inherit: Mapping[str, str],
    incarnation: int,
    criu_bin: str = "criu",
    criu_args: Sequence[str] = (),
    container: bool = False,
    here: str | None = None,
    node_netns: str | None = None,
    python: str = sys.executable,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    zygote: ZygoteClient | None = None,
) -> ShimInfo:
    """Restore the images under a detached shim (``criu_args``: more options for ``criu restore``;
    ``here``: under the job's ``--here`` caller, as for ``launch``; ``node_netns``: where CRIU
    runs, for a bridge-network job whose veth must land on the node's bridge).

    ``inherit`` maps a file in the job directory (e.g. "stdout", rebuilt by the caller at the
    size recorded by the dump) to the absolute path the dumped process had open. Raises
    CriuMissing, or RestoreFailed with CRIU's log excerpt.
    """
    criu = find_criu(criu_bin)
    if criu is None:
        raise CriuMissing(f"criu binary {criu_bin!r} not found: {setup_hint()}")
    images_dir = _absolute(images_dir)
    cmd = [python, "-m", "ferry.criu.shim", "restore", "--job-dir", str(job_dir.path)]
    cmd += ["--incarnation", str(incarnation), "--images", str(images_dir), "--criu", criu]
    for local, original in inherit.items():
        cmd += ["--inherit", f"{local}={original}"]
    if container:
        cmd.append("--container")
    if node_netns:
        cmd += ["--node-netns", node_netns]
    if here:  # CRIU would put the tree back into the cgroups it was dumped in: it stays in the caller's
        criu_args = [*criu_args, HERE_CGROUPS]
    cmd += [f"--criu-arg={arg}" for arg in criu_args]
    log_path = str(images_dir / RESTORE_LOG)
    if here:
        return await _hand_off(job_dir, here, cmd, "restore", incarnation, timeout_s, RestoreFailed,
                               log_path=log_path)
    # a node service that restarts finds a restore still under way by its command line
    # (ferry.node.procs.restores_of), so that a job never runs twice: a fork of the zygote shows
    # the same command line as a new interpreter would (ferry.criu.zygote_server.shim_title)
    return await _start(job_dir, cmd, timeout_s, RestoreFailed, log_path=log_path, zygote=zygote)


async def _hand_off(
    job_dir: JobDir,
    job: str,
    cmd: list[str],
    mode: Literal["launch", "restore"],
    incarnation: int,
    timeout_s: float,
    error: type[CriuError],
    *,
    log_path: str | None,
) -> ShimInfo:
    """Offers the shim's command to the job's ``--here`` caller; returns once its workload runs."""
    argv = [*cmd[:4], FOREGROUND_FLAG, *cmd[4:]]  # python -m ferry.criu.shim MODE --foreground ...
    reply = await offer(job_dir, Handoff(job=job, incarnation=incarnation, mode=mode, argv=argv), timeout_s)
    if reply is None:
        raise error(f"the `--here` command did not take the job's {mode} within {timeout_s:.0f} s "
                    f"(it must run on this node: is it still waiting?)")
    if not reply.ok:
        raise error(reply.error, log_excerpt=reply.detail, log_path=log_path)
    info = job_dir.read_shim()
    if info is None or info.pid != reply.pid or info.incarnation != incarnation:
        raise error(f"the shim reported pid {reply.pid} but {job_dir.shim_file} says {info}")
    return info


def _absolute(path: Path) -> Path:
    return Path(path).absolute()


def _write_env(job_dir: JobDir, env: Mapping[str, str]) -> Path:
    # The environment may hold secrets: a private file, removed as soon as the starter has read it.
    fd, name = tempfile.mkstemp(prefix=".env-", suffix=".json", dir=job_dir.path)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(env), f)
    return Path(name)


async def _start(
    job_dir: JobDir,
    cmd: list[str],
    timeout_s: float,
    error: type[CriuError],
    *,
    log_path: str | None,
    zygote: ZygoteClient | None = None,
) -> ShimInfo:
    code, out, err = await _run_starter(job_dir, cmd, timeout_s, error, zygote)
    lines = err.decode(errors="replace").splitlines()
    if code != 0:
        first = lines[0].removeprefix("ferry-shim: ") if lines else f"the shim exited with {code}"
        raise error(first, log_excerpt=lines[1:], log_path=log_path)
    try:
        reply = _StarterReply.model_validate_json(out.strip().splitlines()[-1])
    except (ValidationError, IndexError) as exc:
        raise error(f"the shim answered {out[:200]!r}; see {job_dir.shim_log}") from exc
    info = job_dir.read_shim()
    if info is None or info.pid != reply.pid or info.shim_pid != reply.shim_pid:
        raise error(f"the shim reported pid {reply.pid} but {job_dir.shim_file} says {info}")
    return info


async def _run_starter(job_dir: JobDir, cmd: list[str], timeout_s: float, error: type[CriuError],
                       zygote: ZygoteClient | None) -> tuple[int, bytes, bytes]:
    """The shim's starter: forked by the node's zygote when it runs (``ferry.criu.zygote``), else
    a new ``python -m ferry.criu.shim``. (exit code, stdout, stderr); killed after ``timeout_s``
    or when the caller is cancelled."""
    if zygote is not None and zygote.available():
        try:
            return await zygote.run(cmd[3:], timeout_s)
        except TimeoutError:
            raise error(f"the shim did not report within {timeout_s:.0f} s; see {job_dir.shim_log}") from None
        except OSError as exc:
            log.warning("the shim zygote at %s did not answer (%s): starting the shim itself", zygote.path, exc)
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise error(f"the shim did not report within {timeout_s:.0f} s; see {job_dir.shim_log}") from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    return proc.returncode if proc.returncode is not None else 1, out, err
