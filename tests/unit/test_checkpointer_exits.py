"""The exit reports' wake-up (``ferry.checkpointer.exits``): a followed monitor's end is seen
at once, through its pidfd; one that ended before it was followed is said to be so."""

from __future__ import annotations

import asyncio

from ferry.checkpointer.exits import MonitorWatch


async def test_a_followed_monitors_end_wakes_the_watch_and_names_its_job() -> None:
    watch = MonitorWatch()
    proc = await asyncio.create_subprocess_exec("sleep", "0.3")
    other = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        assert watch.follow("job-a", proc.pid) and watch.follow("job-b", other.pid)
        assert watch.follows("job-a") and watch.follows("job-a", proc.pid) and not watch.follows("job-a", 1)
        assert watch.follow("job-a", proc.pid)  # again: nothing new
        assert len(watch) == 2 and watch.take() == set()
        await asyncio.wait_for(watch.woken.wait(), 10)
        assert watch.take() == {"job-a"} and not watch.woken.is_set()
        assert not watch.follows("job-a") and watch.follows("job-b")
    finally:
        other.kill()
        await proc.wait()
        await other.wait()
        watch.close()
    assert len(watch) == 0


async def test_a_monitor_that_ended_before_it_was_followed_is_left_to_the_caller() -> None:
    watch = MonitorWatch()
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()  # reaped: its pid names no process
    assert watch.follow("job-c", proc.pid) is False and not watch.follows("job-c")
    watch.ended("job-c")
    assert watch.woken.is_set() and watch.take() == {"job-c"}
