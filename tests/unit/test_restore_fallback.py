"""The checkpoint a restore falls back to when its own does not verify (pure)."""

from ferry.common.models import CheckpointRecord
from ferry.policy.fallback import older_checkpoint


def rec(id_: str, created: float, state: str = "committed") -> CheckpointRecord:
    return CheckpointRecord.model_validate({"id": id_, "job": "j", "created": created, "state": state})


RECORDS = [rec("ck-1", 10), rec("ck-2", 20), rec("ck-3", 30, "failed"), rec("ck-4", 40)]


def test_the_newest_older_committed_checkpoint() -> None:
    assert older_checkpoint(RECORDS, {"ck-4": 40}).id == "ck-2"  # type: ignore[union-attr]


def test_never_a_newer_one_nor_one_that_failed_already() -> None:
    assert older_checkpoint(RECORDS, {"ck-4": 40, "ck-2": 20}).id == "ck-1"  # type: ignore[union-attr]
    # a fallback never moves forward in time, past what already failed
    assert older_checkpoint(RECORDS, {"ck-2": 20}).id == "ck-1"  # type: ignore[union-attr]


def test_none_left() -> None:
    assert older_checkpoint(RECORDS, {"ck-1": 10}) is None
    assert older_checkpoint([], {"ck-9": 5}) is None
