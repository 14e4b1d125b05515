"""Retries with exponential backoff and jitter for transient backend failures."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from ferry.store.errors import StoreError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all; before try n+1 sleep about ``base * 2**n`` seconds, at most ``cap``."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0

    def delay(self, failures: int) -> float:
        full = min(self.cap, self.base * 2.0 ** (failures - 1))
        return full / 2 + random.uniform(0, full / 2)


def call_with_retries(
    op: Callable[[], T],
    translate: Callable[[Exception], tuple[StoreError, bool]],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``op``; ``translate`` maps a failure to (the error to raise, whether to try again)."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=lambda state: policy.delay(state.attempt_number),
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, Exception) and translate(exc)[1]),
        sleep=sleep, reraise=True)
    try:
        return retrying(op)
    except Exception as exc:
        error, _ = translate(exc)
        if error is exc:
            raise
        raise error from exc
