"""``try_then_retry``: a call that works is made once, with no tenacity policy built; one that fails
with a retryable error is tried again under the policy, after the first wait; other errors, and the
policy's last one, reach the caller."""

import asyncio

import pytest
import tenacity

from ferry.common.retrying import try_then_retry


class Flaky:
    def __init__(self, fails: int, error: type[Exception] = TimeoutError) -> None:
        self.fails, self.error, self.calls = fails, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.error("not yet")
        return "done"


def policy_of(built: list[int], attempts: int) -> tenacity.AsyncRetrying:
    built.append(attempts)
    return tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(attempts), wait=tenacity.wait_fixed(0.001),
                                  retry=tenacity.retry_if_exception_type(TimeoutError), reraise=True)


def run(call: Flaky, built: list[int], failed: list[BaseException] | None = None) -> str:
    return asyncio.run(try_then_retry(call, retryable=TimeoutError, first_wait_s=0.001,
                                      policy=lambda: policy_of(built, 3),
                                      first_failed=None if failed is None else failed.append))


def test_a_call_that_works_is_made_once_and_builds_no_policy() -> None:
    call, built = Flaky(0), list[int]()
    assert run(call, built) == "done" and call.calls == 1 and built == []


def test_a_retryable_failure_is_tried_again_under_the_policy() -> None:
    call, built, failed = Flaky(3), list[int](), list[BaseException]()  # the first try, then the policy's three
    assert run(call, built, failed) == "done" and call.calls == 4 and built == [3]
    assert len(failed) == 1 and isinstance(failed[0], TimeoutError)


def test_the_policys_last_error_reaches_the_caller() -> None:
    call, built = Flaky(10), list[int]()
    with pytest.raises(TimeoutError):
        run(call, built)
    assert call.calls == 4


def test_an_error_not_worth_a_retry_reaches_the_caller_at_once() -> None:
    call, built = Flaky(1, ValueError), list[int]()
    with pytest.raises(ValueError):
        run(call, built)
    assert call.calls == 1 and built == []
