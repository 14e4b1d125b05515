"""The pricing service reads real feed files, keeps the latest prices in KV, publishes an event per
change, refuses a malformed feed with the file and line named, and keeps the last good prices."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc.aio

from ferry.api.service import Api
from ferry.common import wire
from ferry.common.bus import Bus
from ferry.common.config import Settings
from ferry.common.models import Event
from ferry.common.ports import free_port
from ferry.pricing.service import Pricing
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as pb_grpc
from tests.conftest import async_stub, make_secrets

HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"


async def prices(stub: pb_grpc.FerryAdminAsyncStub) -> dict[tuple[str, str], float]:
    reply = await stub.ListPrices(pb.ListPricesRequest())
    return {(p.zone, p.market): p.price_per_hour for p in reply.prices}


async def wait_for(check: object, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_feeds_become_prices_and_events(nats_url: str, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.csv"
    catalog.write_text(HEADER + "p3.2xlarge,V100,1,8,61,3.06,0.92,us-east-1,us-east-1a\n")
    make_secrets(tmp_path)
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}",
                        price_feeds=str(catalog), price_poll_s=0.1)
    services = [Pricing(settings), Api(settings)]
    tasks = [asyncio.create_task(s.serve()) for s in services]
    bus = await Bus.connect(nats_url, "test")
    events: list[Event] = []

    async def on_event(msg: object) -> None:
        events.append(wire.decode(Event, msg.data))  # type: ignore[attr-defined]

    await bus.subscribe("ferry.evt.cluster.>", on_event)
    try:
        await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in services)), 30)
        async with grpc.aio.insecure_channel(settings.addr) as channel:
            stub = async_stub(channel)

            async def first_prices() -> bool:
                return await prices(stub) == {("us-east-1a", "on-demand"): 3.06, ("us-east-1a", "spot"): 0.92}

            await wait_for(first_prices)
            catalog.write_text(HEADER + "p3.2xlarge,V100,1,8,61,3.06,0.71,us-east-1,us-east-1a\n")
            os.utime(catalog, (1, 1))  # a new mtime even within the same clock tick

            async def spot_changed() -> bool:
                return (await prices(stub)).get(("us-east-1a", "spot")) == 0.71

            await wait_for(spot_changed)
            assert any(e.kind == "price" and "0.7100" in e.message for e in events)
            market = json.loads((await stub.GetSignal(pb.SignalRequest(name="spot_market"))).json)
            assert [(m["spot_price"], m["on_demand_price"], m["trend"]) for m in market] == [
                (0.71, 3.06, round(0.71 / 0.92 - 1, 4))]  # the trend: the spot price's last change
            catalog.write_text(HEADER + "p3.2xlarge,V100,1,8,61,lots,0.5,us-east-1,us-east-1a\n")
            os.utime(catalog, (2, 2))

            async def refused() -> bool:
                return any(e.kind == "price_feed_error" for e in events)

            await wait_for(refused)
            error = next(e for e in events if e.kind == "price_feed_error")
            assert "catalog.csv" in error.message and "line 2" in error.message
            assert (await prices(stub))[("us-east-1a", "spot")] == 0.71  # the last good prices stay
    finally:
        await bus.close()
        for s in services:
            s.stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
