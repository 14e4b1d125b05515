"""Mirror against a real nats-server: what the scheduler decides from follows the bucket (writes,
deletes, other writers), keeps the owner's own last write, and hands out copies."""

import asyncio
import logging
import signal
import subprocess
from pathlib import Path

import pytest

from ferry.common.bus import Bus
from ferry.common.mirror import Mirror
from ferry.common.models import Job, JobState
from ferry.common.ports import free_port
from tests.conftest import BIN


def job(id: str, **kw: object) -> Job:
    return Job.model_validate({"id": id, "name": id, "argv": ["x"]} | kw)


async def until(check: object, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.02)


async def test_the_mirror_follows_writes_and_deletes_and_hands_out_copies(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "test-mirror")
    other = await Bus.connect(nats_url, "test-mirror-other")
    mirror = Mirror(bus.jobs)
    try:
        await bus.jobs.put("job-a", job("job-a"))
        await mirror.start()
        assert [j.id for j in mirror.values()] == ["job-a"]  # what was there before it started
        await other.jobs.put("job-b", job("job-b", state=JobState.RUNNING))
        await until(lambda: mirror.get("job-b") is not None, "another writer's record did not arrive")
        got = mirror.get("job-b")
        assert got is not None and got.state == JobState.RUNNING
        got.state = JobState.FAILED  # a reader's change stays in its copy
        again = mirror.get("job-b")
        assert again is not None and again.state == JobState.RUNNING
        await other.jobs.delete("job-a")
        await until(lambda: mirror.get("job-a") is None, "a delete did not arrive")
    finally:
        await mirror.close()
        await other.close()
        await bus.close()


async def test_the_owners_write_is_seen_at_once_and_an_older_copy_does_not_undo_it(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "test-mirror")
    mirror = Mirror(bus.jobs)
    try:
        await mirror.start()
        first = await bus.jobs.put("job-c", job("job-c"))
        second = await bus.jobs.put("job-c", job("job-c", state=JobState.RUNNING))
        mirror.note("job-c", job("job-c", state=JobState.RUNNING), second)
        assert (c := mirror.get("job-c")) is not None and c.state == JobState.RUNNING
        mirror.note("job-c", job("job-c"), first)  # the watch delivering the earlier write late
        assert (c := mirror.get("job-c")) is not None and c.state == JobState.RUNNING
        await asyncio.sleep(0.3)  # the watch's own copies of both writes change nothing
        assert (c := mirror.get("job-c")) is not None and c.state == JobState.RUNNING
    finally:
        await mirror.close()
        await bus.close()


async def test_a_quiet_watch_that_missed_a_write_reads_the_bucket_again(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = await Bus.connect(nats_url, "test-mirror")
    mirror = Mirror(bus.jobs, resync_s=0.3)
    try:
        await mirror.start()
        delivered = Mirror._apply
        monkeypatch.setattr(mirror, "_apply", lambda entry: None)  # a watch that delivers nothing
        await bus.jobs.put("job-d", job("job-d"))
        await bus.jobs.put("job-e", job("job-e"))
        await bus.jobs.delete("job-e")
        await asyncio.sleep(0.1)
        assert mirror.get("job-d") is None  # missed
        monkeypatch.setattr(mirror, "_apply", lambda entry: delivered(mirror, entry))
        await until(lambda: mirror.get("job-d") is not None, "no resync after a quiet watch that missed a write")
        assert mirror.get("job-e") is None
    finally:
        await mirror.close()
        await bus.close()


async def test_a_quiet_watch_that_missed_nothing_reads_no_record_again(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of a quiet copy costs one request, however many records the bucket holds: an
    idle cluster's CPU does not grow with the jobs that ever ran."""
    bus = await Bus.connect(nats_url, "test-mirror")
    mirror = Mirror(bus.jobs, resync_s=0.2)
    reads: list[str] = []
    checks: list[int] = []
    try:
        for i in range(30):
            await bus.jobs.put(f"job-q{i}", job(f"job-q{i}"))
        await mirror.start()
        get_rev, last_revision = bus.jobs.get_rev, bus.jobs.last_revision

        async def counted_get_rev(key: str) -> object:
            reads.append(key)
            return await get_rev(key)

        async def counted_last_revision() -> int:
            checks.append(1)
            return await last_revision()

        monkeypatch.setattr(bus.jobs, "get_rev", counted_get_rev)
        monkeypatch.setattr(bus.jobs, "last_revision", counted_last_revision)
        await until(lambda: len(checks) >= 3, "no check after three quiet periods")
        assert reads == []
        assert len(mirror.values()) == 30
    finally:
        await mirror.close()
        await bus.close()


async def test_after_nats_comes_back_the_mirror_watches_again_at_once(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A restarted server: the watch starts again when the connection is back, well before the
    periodic resync (an hour here) would have read the bucket."""
    port = free_port()
    argv = [str(BIN / "nats-server"), "-js", "-sd", str(tmp_path / "js"), "-a", "127.0.0.1", "-p", str(port)]
    server = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    bus = await Bus.connect(url, "test-mirror")
    mirror = Mirror(bus.jobs, resync_s=3600)
    caplog.set_level(logging.INFO, logger="ferry.common.mirror")
    try:
        await mirror.start()
        server.send_signal(signal.SIGKILL)
        await server.wait()
        server = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        writer = await Bus.connect(url, "test-writer", connect_timeout=20)
        try:
            await writer.jobs.put("job-e", job("job-e"))
        finally:
            await writer.close()
        await until(lambda: mirror.get("job-e") is not None, "the write after the restart did not arrive", 20)
        assert any(r.getMessage().startswith("NATS came back: watching") for r in caplog.records), \
            [r.getMessage() for r in caplog.records]
    finally:
        await mirror.close()
        await bus.close()
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)


async def test_the_indexes_follow_the_records_and_caught_up_waits_for_other_writers(nats_url: str) -> None:
    """``live`` holds the jobs that have not ended, ``find`` a job by name, both as the records
    change and go; ``caught_up`` returns once another writer's write just made is in the copy."""
    bus = await Bus.connect(nats_url, "test-mirror")
    other = await Bus.connect(nats_url, "test-mirror-other")
    mirror = Mirror(bus.jobs, live=lambda j: not j.terminal, unique=lambda j: j.name)
    try:
        await bus.jobs.put("job-a", job("job-a", name="alpha", state=JobState.RUNNING))
        await bus.jobs.put("job-b", job("job-b", name="beta", state=JobState.SUCCEEDED))
        await mirror.start()
        assert [j.id for j in mirror.live()] == ["job-a"] and [j.id for j in mirror.view()] == ["job-a", "job-b"]
        assert (mirror.find("beta") or job("none")).id == "job-b" and mirror.find("gamma") is None
        for i in range(20):  # another service's writes: each visible once caught_up returns
            await other.jobs.put(f"job-n{i}", job(f"job-n{i}", name=f"n{i}", state=JobState.PENDING))
            assert await mirror.caught_up()
            assert mirror.find(f"n{i}") is not None
        await other.jobs.put("job-a", job("job-a", name="alpha", state=JobState.FAILED))
        assert await mirror.caught_up()
        assert "job-a" not in {j.id for j in mirror.live()}  # it ended
        await other.jobs.delete("job-b")
        assert await mirror.caught_up()
        assert mirror.find("beta") is None and mirror.peek("job-b") is None
        assert len(mirror.live()) == 20
    finally:
        await mirror.close()
        await other.close()
        await bus.close()


async def test_the_token_index_follows_changes_and_deletes(nats_url: str) -> None:
    """``holders`` and ``held``: the scheduler's lookups of job-network addresses, published ports
    and gangs (``ferry.scheduler.state.job_tokens``), kept as records change and go."""
    from ferry.common.jobnet import PortMap
    from ferry.scheduler.state import job_tokens

    bus = await Bus.connect(nats_url, "test-mirror-tokens")
    other = await Bus.connect(nats_url, "test-mirror-tokens-other")
    mirror = Mirror(bus.jobs, tokens=job_tokens)
    web = job("job-w", name="web", state=JobState.RUNNING).model_copy(
        update={"address": "10.88.0.2", "publish": [PortMap(host=8080, job=80)], "gang": "g"})
    try:
        await bus.jobs.put("job-w", web)
        await mirror.start()
        assert mirror.held("address:10.88.0.2") and [j.id for j in mirror.holders("publish:tcp/8080")] == ["job-w"]
        assert [j.id for j in mirror.holders("gang:g")] == ["job-w"] and mirror.holders("gang:h") == []
        await other.jobs.put("job-w", web.model_copy(update={"state": JobState.SUCCEEDED}))
        assert await mirror.caught_up()
        assert mirror.holders("publish:tcp/8080") == []  # an ended job publishes nothing
        assert mirror.held("address:10.88.0.2")  # but keeps its address: it may be restored
        await other.jobs.delete("job-w")
        assert await mirror.caught_up()
        assert not mirror.held("address:10.88.0.2") and mirror.holders("gang:g") == []
    finally:
        await mirror.close()
        await other.close()
        await bus.close()
