"""Table.watching against a real nats-server: a write to the key wakes the watcher, other keys do
not, and the watch ends with its block (what the API waits on for ops and jobs)."""

import asyncio

from ferry.common.bus import Bus
from ferry.common.models import Op, OpKind


async def test_a_write_to_the_key_wakes_the_watcher_and_others_do_not(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "test")
    try:
        await bus.ops.put("op-1", Op(id="op-1", kind=OpKind.CHECKPOINT, job="j"))
        async with bus.ops.watching("op-1") as changed:
            assert not changed.is_set()  # a write before the watch is not signalled
            await bus.ops.put("op-2", Op(id="op-2", kind=OpKind.CHECKPOINT, job="j"))
            await asyncio.sleep(0.3)
            assert not changed.is_set(), "another key's write woke the watcher"
            await bus.ops.put("op-1", Op(id="op-1", kind=OpKind.CHECKPOINT, job="j", phase="checkpoint"))
            await asyncio.wait_for(changed.wait(), 5)
            changed.clear()
            await bus.ops.delete("op-1")
            await asyncio.wait_for(changed.wait(), 5)
        changed.clear()
        await bus.ops.put("op-1", Op(id="op-1", kind=OpKind.CHECKPOINT, job="j"))
        await asyncio.sleep(0.3)
        assert not changed.is_set(), "the watch outlived its block"
    finally:
        await bus.close()


async def test_the_watcher_keeps_the_record_each_write_carries_and_a_delete_removes_it(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, "test")
    try:
        latest: dict[str, Op] = {}
        async with bus.ops.watching("op-3", latest=latest) as changed:
            for phase in ("dump", "upload"):  # the newest of two writes is what stays
                await bus.ops.put("op-3", Op(id="op-3", kind=OpKind.CHECKPOINT, job="j", phase=phase))
            await asyncio.wait_for(changed.wait(), 5)
            for _ in range(50):
                if latest.get("op-3") is not None and latest["op-3"].phase == "upload":
                    break
                await asyncio.sleep(0.05)
            assert latest["op-3"].phase == "upload", latest
            changed.clear()
            await bus.ops.delete("op-3")
            await asyncio.wait_for(changed.wait(), 5)
            assert "op-3" not in latest, latest
    finally:
        await bus.close()
