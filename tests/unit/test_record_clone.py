"""Record.clone: the same record as ``model_copy(deep=True)``, sharing nothing mutable."""

from typing import Any

from ferry.common.jobnet import PortMap
from ferry.common.models import Job, JobState, Network, Op, OpKind
from ferry.common.record import Record, clone


def busy_job() -> Job:
    return Job(id="job-1", name="train", argv=["python", "train.py"], node="node-1", state=JobState.RUNNING,
               labels={"team": "ml", "tier": "a"}, gpu_uuids=["GPU-1", "GPU-2"], network=Network.BRIDGE,
               publish=[PortMap(host=8080, job=80)], address="10.88.0.2")


def test_a_clone_equals_the_deep_copy_and_writes_the_same_json() -> None:
    job = busy_job()
    op = Op(id="op-1", kind=OpKind.CHECKPOINT, job=job.id, result={"lost_s": [1.5, {"a": [1, 2]}]}, job_record=job)
    for record in (job, op):
        copied, cloned = record.model_copy(deep=True), record.clone()
        assert cloned == copied == record and type(cloned) is type(record)
        assert cloned.model_dump_json() == record.model_dump_json()
        assert cloned.model_fields_set == record.model_fields_set


def test_a_clone_shares_nothing_mutable_with_the_original() -> None:
    job = busy_job()
    op = Op(id="op-1", kind=OpKind.CHECKPOINT, job=job.id, result={"nested": {"list": [1]}}, job_record=job)
    before = op.model_dump_json()
    twin = op.clone()
    assert twin.job_record is not None and twin.job_record is not op.job_record
    twin.job_record.labels["team"] = "other"
    twin.job_record.gpu_uuids.append("GPU-3")
    twin.job_record.publish.append(PortMap(host=9090, job=90))
    twin.job_record.state = JobState.FAILED
    twin.result["nested"]["list"].append(2)
    assert op.model_dump_json() == before
    assert twin.model_dump_json() != before


class Odd(Record):
    pairs: tuple[list[int], ...] = ()
    seen: set[int] = set()
    anything: Any = None


def test_containers_of_every_kind_are_copied_and_other_values_deep_copied() -> None:
    class Box:
        def __init__(self) -> None:
            self.items = [1]

    odd = Odd(pairs=([1], [2]), seen={1, 2}, anything=Box())
    twin = clone(odd)
    twin.pairs[0].append(9)
    twin.seen.add(3)
    twin.anything.items.append(2)
    assert odd.pairs == ([1], [2]) and odd.seen == {1, 2} and odd.anything.items == [1]
