"""Real CRIU: dump a running workload, kill it, restore it into another job directory.

The restore side does what a migrator does: it rebuilds stdout/stderr in the new job directory at
the sizes recorded while the tree was frozen, and maps the original paths onto them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.criu.jobdir import JobDir
from ferry.criu.launch import launch, restore
from ferry.criu.linux import is_gone, ns_pids
from ferry.criu.runner import CriuRunner, DumpResult
from ferry.criu.treekill import kill_tree
from tests.integration.criu_helpers import COUNTER, ENV, wait_exit, wait_for

pytestmark = [pytest.mark.usefixtures("criu_ok"), pytest.mark.criu, pytest.mark.timeout(60)]

# A tree: the writer loop and the reader loop are two children joined by a pipe; the root waits.
PIPE_TREE = (
    'i=0; while [ "$i" -lt 120 ]; do echo "$i"; i=$((i+1)); sleep 0.01; done'
    ' | while read -r l; do echo "got $l"; done; exit 7'
)


def lines_in(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def checkpoint_and_kill(runner: CriuRunner, src: JobDir, pid: int, images: Path) -> DumpResult:
    result = await runner.dump(pid, images, leave_running=True, record_sizes=[src.stdout, src.stderr])
    # Left running: still alive and still writing.
    assert not is_gone(pid)
    size = result.file_sizes[str(src.stdout)]
    await wait_for("output after the dump", lambda: src.stdout.stat().st_size > size + 20)
    await kill_tree(pid, grace_s=1.0)
    assert (await wait_exit(src)).signal == 9
    return result


def rebuild(src: JobDir, dst: JobDir, result: DumpResult) -> dict[str, str]:
    """What a migrator does with the files that travel with a checkpoint."""
    dst.create()
    inherit = {}
    for name, path in (("stdout", src.stdout), ("stderr", src.stderr)):
        size = result.file_sizes[str(path)]
        (dst.path / name).write_bytes(path.read_bytes()[:size])
        inherit[name] = result.file_keys.get(str(path), str(path))
    return inherit


async def test_restore_elsewhere_continues_the_sequence(tmp_path: Path, criu_ok: CriuRunner, pids: list[int]) -> None:
    src = JobDir(tmp_path / "node-a" / "job")
    info = await launch(src, ["sh", "-c", COUNTER], cwd=tmp_path, env=ENV, incarnation=1)
    pids.append(info.pid)
    await wait_for("some output", lambda: len(lines_in(src.stdout)) >= 20)

    result = await checkpoint_and_kill(criu_ok, src, info.pid, tmp_path / "images")
    recorded = result.file_sizes[str(src.stdout)]
    assert recorded > 0 and result.file_sizes[str(src.stderr)] == 0
    assert src.stdout.read_bytes()[:recorded].endswith(b"\n")  # sizes taken while frozen

    dst = JobDir(tmp_path / "node-b" / "job")
    inherit = rebuild(src, dst, result)
    restored = await restore(
        dst, tmp_path / "images", inherit=inherit, incarnation=2, criu_bin=criu_ok.check().path or "criu"
    )
    pids.append(restored.pid)
    assert restored.mode == "restore" and restored.incarnation == 2 and restored.pid != info.pid
    nspid = ns_pids(restored.pid)
    assert len(nspid) == 2 and nspid[-1] == 1, nspid

    before = len(src.stdout.read_bytes()[:recorded].splitlines())
    await wait_for("restored output", lambda: len(lines_in(dst.stdout)) >= before + 30)
    numbers = lines_in(dst.stdout)
    assert numbers == [str(i) for i in range(len(numbers))]  # no gap, no repeat
    assert dst.stderr.read_bytes() == b""

    await kill_tree(restored.pid, grace_s=0)
    ended = await wait_exit(dst)
    assert ended.signal == 9 and ended.incarnation == 2


async def test_pipe_tree_survives_and_exit_code_is_recorded(
    tmp_path: Path, criu_ok: CriuRunner, pids: list[int]
) -> None:
    src = JobDir(tmp_path / "a")
    info = await launch(src, ["sh", "-c", PIPE_TREE], cwd=tmp_path, env=ENV, incarnation=1)
    pids.append(info.pid)
    await wait_for("some output", lambda: len(lines_in(src.stdout)) >= 15)

    result = await checkpoint_and_kill(criu_ok, src, info.pid, tmp_path / "images")
    assert src.read_exit() is not None

    dst = JobDir(tmp_path / "b")
    restored = await restore(dst, tmp_path / "images", inherit=rebuild(src, dst, result), incarnation=2)
    pids.append(restored.pid)
    ended = await wait_exit(dst, timeout_s=20)
    assert ended.code == 7 and ended.signal is None and ended.incarnation == 2
    assert lines_in(dst.stdout) == [f"got {i}" for i in range(120)]
