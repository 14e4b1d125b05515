"""Real CRIU: a job cannot see the node's secrets folder, the node's disks or the capabilities
that would undo that, at launch and after a dump and restore (issue 11: workloads run as root).

The shim mounts an empty read-only tmpfs over each folder it is told to hide, gives the job a
/dev of its own without block devices, drops CAP_SYS_ADMIN and its like from the job's bounding
set, and refuses io_uring (a seccomp filter; CRIU cannot dump a ring); CRIU dumps and restores
all four with the job."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ferry.criu.errors import LaunchFailed
from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.linux import DEVICES, DROPPED_CAPABILITIES
from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree
from tests.integration.criu_helpers import COUNTER, ENV, wait_exit, wait_for
from tests.integration.test_criu_migrate import lines_in, rebuild

pytestmark = [pytest.mark.criu, pytest.mark.timeout(60)]

# Every 50 ms, one JSON line: what reading the secret gives, what /dev holds, the bounding set,
# and what umount of the hidden folder gives (a root job with CAP_SYS_ADMIN would succeed).
PROBE = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
secret, hidden = sys.argv[1], sys.argv[2]
while True:
    try:
        got = open(secret).read()
    except OSError as exc:
        got = type(exc).__name__
    rc = libc.umount2(hidden.encode(), 2)
    caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapBnd")][0]
    umount = rc if rc == 0 else os.strerror(ctypes.get_errno())
    ring = libc.syscall(425, 8, ctypes.create_string_buffer(120))  # io_uring_setup
    print(json.dumps({"secret": got, "dev": sorted(os.listdir("/dev")), "capbnd": int(caps, 16),
                      "umount": umount, "io_uring": ring if ring >= 0 else os.strerror(ctypes.get_errno())}),
          flush=True)
    time.sleep(0.05)
"""


def probes(job: JobDir) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines_in(job.stdout)]


def assert_shut_out(seen: list[dict[str, Any]]) -> None:
    assert seen
    for probe in seen:
        assert probe["secret"] in ("PermissionError", "FileNotFoundError"), probe
        assert probe["umount"] == "Operation not permitted", probe
        assert probe["io_uring"] == "Function not implemented", probe  # CRIU could not dump a ring
        assert not probe["capbnd"] & sum(1 << n for n in DROPPED_CAPABILITIES.values()), hex(probe["capbnd"])
        assert probe["capbnd"] & (1 << 1), "CAP_DAC_OVERRIDE, which root jobs expect, was dropped too"
        assert set(DEVICES) <= set(probe["dev"]), probe["dev"]
        assert not any(name.startswith(("vd", "sd", "nvme", "loop", "zram")) for name in probe["dev"]), probe["dev"]


async def test_a_job_never_sees_the_hidden_folder_before_or_after_a_restore(tmp_path: Path, criu_ok: CriuRunner,
                                                                            pids: list[int]) -> None:
    secrets = tmp_path / "node" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "store.keys").write_text("the node's keyring")
    (secrets / "store.keys").chmod(0o600)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    argv = [sys.executable, "-c", PROBE, str(secrets / "store.keys"), str(tmp_path / "node")]
    src = JobDir(tmp_path / "a")
    info = await launch(src, argv, cwd=cwd, env=ENV, incarnation=1, hide=[tmp_path / "node"])
    pids.append(info.pid)
    await wait_for("output", lambda: len(lines_in(src.stdout)) >= 3)
    assert_shut_out(probes(src))
    assert (secrets / "store.keys").read_text() == "the node's keyring", "the node lost its own view"
    assert not list(src.path.glob(".dev-*")), "the staging folder of the job's /dev was left behind"

    dumped = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False,
                                record_sizes=[src.stdout, src.stderr])
    await wait_exit(src)
    copied = sum(p.stat().st_size for p in (tmp_path / "images").glob("tmpfs-*"))
    assert copied < 64 << 10, f"{copied} bytes of tmpfs in the images: more than the job's own /dev"

    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped), incarnation=2)
    pids.append(restored.pid)
    await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= len(lines_in(src.stdout)) + 3)
    assert_shut_out(probes(dst))
    await kill_tree(restored.pid, grace_s=0)


async def test_another_containers_mount_gone_before_the_restore_does_not_fail_it(tmp_path: Path, criu_ok: CriuRunner,
                                                                                 pids: list[int]) -> None:
    """A container's root filesystem mounted on the node when the job started, gone (its container
    ended) by the restore. Before, the job's mount namespace kept a copy of it, CRIU recorded it
    as an external mount, and the restore failed on its missing mount point (CI: a containerd
    test ran beside a CRIU one)."""
    rootfs = tmp_path / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / "c1" / "rootfs"
    rootfs.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "ferry-test-rootfs", str(rootfs)]
    await asyncio.to_thread(subprocess.run, mount, check=True)
    try:
        (tmp_path / "cwd").mkdir()
        src = JobDir(tmp_path / "a")
        info = await launch(src, ["sh", "-c", COUNTER], cwd=tmp_path / "cwd", env=ENV, incarnation=1)
        pids.append(info.pid)
        await wait_for("output", lambda: len(lines_in(src.stdout)) >= 3)
        assert str(rootfs) not in Path(f"/proc/{info.pid}/mountinfo").read_text(), \
            "the job sees another container's root filesystem"
        dumped = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=False,
                                    record_sizes=[src.stdout, src.stderr])
        await wait_exit(src)
    finally:  # the container ends: its root filesystem and its folder go
        await asyncio.to_thread(subprocess.run, ["umount", str(rootfs)], check=True)
        shutil.rmtree(tmp_path / "state")
    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, dumped), incarnation=2)
    pids.append(restored.pid)
    await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= len(lines_in(src.stdout)) + 3)
    await kill_tree(restored.pid, grace_s=0)


async def test_a_job_whose_working_directory_is_hidden_is_refused(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    with pytest.raises(LaunchFailed, match=r"inside .*which jobs must not see"):
        await launch(JobDir(tmp_path / "a"), ["true"], cwd=tmp_path / "node", env=ENV, incarnation=1,
                     hide=[tmp_path / "node"])
