"""What the CRIU integration tests share besides their fixtures (in conftest.py): small waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from ferry.criu.jobdir import ExitInfo, JobDir

ENV = {"PATH": "/usr/bin:/bin"}
COUNTER = "i=0; while true; do echo $i; i=$((i+1)); sleep 0.01; done"


async def wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_exit(job: JobDir, timeout_s: float = 10.0) -> ExitInfo:
    await wait_for(str(job.exit_file), lambda: job.read_exit() is not None, timeout_s)
    info = job.read_exit()
    assert info is not None
    return info
