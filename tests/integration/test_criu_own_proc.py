"""Real CRIU: a job's PID namespace has a /proc of its own, in a private mount namespace, before and
after a dump and restore, and after a second dump and restore (issue 10, item 6); the host's mounts
are untouched, and no tmpfs of the host is copied into the images (only the job's own small /dev).

Before, the job saw the host's /proc, so CRIU's parasite mounted the namespace's proc in a
``proc.crtools`` directory in the job's working directory, where jobs sharing that directory
collided. With its own /proc the parasite opens /proc directly and makes no such directory."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import launch, restore
from ferry.criu.procfs_guard import PARASITE_DIR
from ferry.criu.runner import CriuRunner, DumpResult
from ferry.criu.treekill import kill_tree
from tests.integration.criu_helpers import ENV, wait_exit, wait_for
from tests.integration.test_criu_migrate import lines_in, rebuild

pytestmark = [pytest.mark.criu, pytest.mark.timeout(60)]

# Every 50 ms: how many processes its /proc shows, and what the host's /dev/shm marker says.
WATCH = 'while :; do n=$(ls -d /proc/[0-9]* | wc -l); echo "$n $(cat "$MARKER" 2>/dev/null)"; sleep 0.05; done'


def mounts_of(pid: int | str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each mount `pid` sees."""
    found = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        found.append((fields[4], fields[sep + 1]))
    return found


def leaked(host_mounts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Mounts the host gained since `host_mounts` where the job mounts its own (/proc and /dev):
    others come from tests that run beside this one (a cluster's network namespaces, say)."""
    gained = Counter(mounts_of("self")) - Counter(host_mounts)  # a second /proc over the first counts
    return sorted(m for m in gained.elements() if m[0] in ("/proc", "/dev") or m[0].startswith(("/proc/", "/dev/")))


def own_proc(pid: int) -> bool:
    """Its /proc is a proc other than the host's: another device, another mount namespace."""
    return (os.stat(f"/proc/{pid}/root/proc").st_dev != os.stat("/proc").st_dev
            and os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"))


async def restore_and_run(src: JobDir, dst: JobDir, images: Path, dumped: DumpResult, incarnation: int,
                          pids: list[int]) -> tuple[ShimInfo, int]:
    """Restores `images` into `dst` as a migrator would; returns once it writes on in its own /proc
    (the restored job, and how many lines its output had at the restore)."""
    restored = await restore(dst, images, inherit=rebuild(src, dst, dumped), incarnation=incarnation)
    pids.append(restored.pid)
    before = len(lines_in(dst.stdout))
    await wait_for("output after the restore", lambda: len(lines_in(dst.stdout)) >= before + 3)
    assert own_proc(restored.pid)
    return restored, before


async def test_a_job_has_its_own_proc_before_and_after_a_restore(tmp_path: Path, criu_ok: CriuRunner,
                                                                 pids: list[int]) -> None:
    marker = Path("/dev/shm") / f"ferry-own-proc-{os.getpid()}"
    marker.write_text("before")
    host_mounts = mounts_of("self")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    try:
        src = JobDir(tmp_path / "a")
        info = await launch(src, ["sh", "-c", WATCH], cwd=cwd, env={**ENV, "MARKER": str(marker)}, incarnation=1)
        pids.append(info.pid)
        await wait_for("output", lambda: len(lines_in(src.stdout)) >= 3)
        assert own_proc(info.pid)
        counts = [int(line.split()[0]) for line in lines_in(src.stdout)]
        assert max(counts) <= 4, counts  # sh, ls and wc: the namespace's processes, not the host's
        assert len(list(Path("/proc").glob("[0-9]*"))) > 4 * max(counts)
        assert leaked(host_mounts) == [], "the job's mounts reached the host"

        result = await criu_ok.dump(info.pid, tmp_path / "images", leave_running=True,
                                    record_sizes=[src.stdout, src.stderr])
        assert not (cwd / PARASITE_DIR).exists()
        copied = list((tmp_path / "images").glob("tmpfs-*"))  # the job's own /dev (linux.private_dev) only
        assert len(copied) == 1 and copied[0].stat().st_size < 64 << 10, f"a host tmpfs was copied: {copied}"
        await kill_tree(info.pid, grace_s=0)
        await wait_exit(src)

        marker.write_text("after")  # the restored job sees the host's /dev/shm, not a copy of it
        dst = JobDir(tmp_path / "b")
        restored, before = await restore_and_run(src, dst, tmp_path / "images", result, 2, pids)
        assert os.stat(f"/proc/{restored.pid}/root/dev/shm").st_dev == os.stat("/dev/shm").st_dev
        after = lines_in(dst.stdout)[before:]
        assert all(line.endswith(" after") and int(line.split()[0]) <= 4 for line in after), after
        assert leaked(host_mounts) == []

        # its output files were opened in the node's namespace this time (by the shim, handed to
        # CRIU): they are external by their key, so the restored job dumps and restores again
        again = await criu_ok.dump(restored.pid, tmp_path / "images-2", leave_running=False,
                                   record_sizes=[dst.stdout, dst.stderr])
        assert set(again.file_keys) == {str(dst.stdout), str(dst.stderr)}
        assert all(k.startswith("file[") for k in again.file_keys.values())
        await wait_exit(dst)
        await restore_and_run(dst, JobDir(tmp_path / "c"), tmp_path / "images-2", again, 3, pids)
    finally:
        marker.unlink(missing_ok=True)
