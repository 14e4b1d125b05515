"""The scheduler reads back the ops it wrote from its own copy (``OpsWritten``), not from KV; an op
it did not write, or whose write failed, it reads from KV. A copy in, a copy out: what a caller
changes is not what the next reader gets."""

import asyncio
from typing import Any, cast

import pytest

from ferry.common.bus import BusError
from ferry.common.models import Op, OpKind, OpState
from ferry.scheduler.state import ClusterState, OpsWritten


class Ops:
    def __init__(self) -> None:
        self.records: dict[str, Op] = {}
        self.reads = 0
        self.fail = False

    async def get(self, key: str) -> Op | None:
        self.reads += 1
        found = self.records.get(key)
        return found.model_copy(deep=True) if found else None

    async def put(self, key: str, value: Op) -> int:
        self.records[key] = value.model_copy(deep=True)
        if self.fail:  # written, but the answer was lost
            raise BusError("nats: timeout")
        return 1


class FakeBus:
    def __init__(self) -> None:
        self.ops = Ops()
        self.jobs = self.nodes = self.prices = None  # followed only once started: not here


def state() -> tuple[ClusterState, Ops]:
    bus = FakeBus()
    return ClusterState(cast(Any, bus)), bus.ops


def test_an_op_the_scheduler_wrote_is_read_back_without_asking_kv() -> None:
    st, kv = state()
    kv.records["op-1"] = Op(id="op-1", kind=OpKind.SUBMIT, job="j")  # the API created it

    async def go() -> None:
        op = await st.op("op-1")
        assert op is not None and kv.reads == 1
        op.state = OpState.RUNNING
        await st.save_op(op)
        op.state = OpState.FAILED  # the caller's object is not the copy kept
        again = await st.op("op-1")
        assert again is not None and again.state == OpState.RUNNING and kv.reads == 1
        again.phase = "changed by a reader"
        third = await st.op("op-1")
        assert third is not None and third.phase != "changed by a reader"
        await st.finish_op("op-1", job=None)
        assert kv.records["op-1"].state == OpState.DONE and kv.reads == 1

    asyncio.run(go())


def test_an_op_whose_write_failed_is_read_from_kv_again() -> None:
    st, kv = state()

    async def go() -> None:
        await st.save_op(Op(id="op-2", kind=OpKind.CHECKPOINT, job="j"))
        kv.fail = True
        with pytest.raises(BusError):
            await st.save_op(Op(id="op-2", kind=OpKind.CHECKPOINT, job="j", phase="dump"))
        op = await st.op("op-2")
        assert op is not None and op.phase == "dump" and kv.reads == 1

    asyncio.run(go())


def test_the_oldest_written_ops_are_forgotten_first() -> None:
    kept = OpsWritten(most=2)
    for i in range(3):
        kept.wrote(Op(id=f"op-{i}", kind=OpKind.SUBMIT, job="j"))
    assert kept.get("op-0") is None and kept.get("op-1") is not None and kept.get("op-2") is not None
