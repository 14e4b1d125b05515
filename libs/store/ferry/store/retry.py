"""Retries with exponential backoff and jitter for transient backend failures."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

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
    failures = 0
    while True:
        try:
            return op()
        except Exception as exc:
            error, transient = translate(exc)
            failures += 1
            if not transient or failures >= policy.attempts:
                if error is exc:
                    raise
                raise error from exc
            sleep(policy.delay(failures))
