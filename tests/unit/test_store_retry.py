"""Retries with backoff, and the translation of client errors into store errors."""

from __future__ import annotations

import pytest
import urllib3

from ferry.store.errors import BackendUnavailable, ObjectNotFound, StoreError
from ferry.store.retry import RetryPolicy, call_with_retries
from ferry.store.s3 import S3Backend


def _translate(exc: Exception) -> tuple[StoreError, bool]:
    if isinstance(exc, StoreError):
        return exc, False
    return BackendUnavailable(str(exc)), isinstance(exc, ConnectionError)


def test_transient_failures_are_retried_with_growing_delays() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def op() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("refused")
        return "ok"

    assert call_with_retries(op, _translate, RetryPolicy(attempts=5, base=0.1, cap=10), sleeps.append) == "ok"
    assert len(calls) == 4
    assert len(sleeps) == 3
    for n, delay in enumerate(sleeps):
        assert 0.1 * 2**n / 2 <= delay <= 0.1 * 2**n


def test_retries_give_up_with_a_translated_error() -> None:
    sleeps: list[float] = []

    def op() -> None:
        raise ConnectionError("refused")

    with pytest.raises(BackendUnavailable, match="refused") as info:
        call_with_retries(op, _translate, RetryPolicy(attempts=3, base=1, cap=1.5), sleeps.append)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert len(sleeps) == 2 and max(sleeps) <= 1.5


def test_permanent_errors_are_not_retried() -> None:
    sleeps: list[float] = []

    def op() -> None:
        raise ObjectNotFound("chunks/x")

    with pytest.raises(ObjectNotFound):
        call_with_retries(op, _translate, RetryPolicy(), sleeps.append)
    assert sleeps == []


def test_s3_translation() -> None:
    backend = S3Backend("127.0.0.1:1", "bucket", access_key="a", secret_key="s", secure=False)
    error, transient = backend._translate(urllib3.exceptions.NewConnectionError(None, "refused"))  # type: ignore[arg-type]
    assert isinstance(error, BackendUnavailable) and transient
    assert "s3://bucket/ at 127.0.0.1:1 is unreachable" in str(error)
    error, transient = backend._translate(ValueError("odd"))
    assert type(error) is StoreError and not transient
