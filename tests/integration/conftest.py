"""Fixtures of the CRIU integration tests: a CRIU that must work (fail, never skip when it is
missing) and cleanup of the workload trees a test started."""

from collections.abc import AsyncIterator

import pytest

from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree


@pytest.fixture(scope="module")
def criu_ok() -> CriuRunner:
    """Every test here needs a working CRIU: fail (never skip) when it is missing."""
    runner = CriuRunner()
    status = runner.check()
    assert status.ok, status.error
    return runner


@pytest.fixture
async def pids() -> AsyncIterator[list[int]]:
    """Workload PIDs to kill when the test ends, whatever happened."""
    started: list[int] = []
    yield started
    for pid in started:
        await kill_tree(pid, grace_s=0)
