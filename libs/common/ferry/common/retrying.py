"""A call tried once as it is, and only after a failure worth retrying under a tenacity policy.

tenacity's machinery (an AsyncRetrying, its call state and actions) costs about 50 us of CPU a
call, more than most calls that succeed at once: a service makes several KV requests, publishes
and reports for every submitted job. The policy is built only when the first try failed, and runs
the tries after it: its caller counts that first try (and its wait) when setting stops and waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

T = TypeVar("T")


async def try_then_retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    retryable: type[BaseException] | tuple[type[BaseException], ...],
    first_wait_s: float,
    policy: Callable[[], tenacity.AsyncRetrying],
    first_failed: Callable[[BaseException], None] | None = None,
) -> T:
    """``attempt()``; if it raises a `retryable` error, `first_failed(error)`, a wait of
    `first_wait_s`, then ``attempt`` again under ``policy()`` (whose last error is raised)."""
    try:
        return await attempt()
    except retryable as exc:
        if first_failed is not None:
            first_failed(exc)
    await asyncio.sleep(first_wait_s)
    return await policy()(attempt)
