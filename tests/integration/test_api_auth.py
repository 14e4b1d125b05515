"""With FERRY_TOKEN set, the admin API refuses every call that does not carry it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import grpc.aio
import pytest

from ferry.api.service import Api
from ferry.common.config import Settings
from ferry.common.ports import free_port
from ferry.v1 import ferry_pb2 as pb
from tests.conftest import BIN, async_stub, make_secrets


async def ferry_cli(addr: str, token: str | None, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "FERRY_ADDR": addr}
    env.pop("FERRY_TOKEN", None)
    if token is not None:
        env["FERRY_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(str(BIN / "ferry"), *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_token_is_required(nats_url: str, tmp_path: Path) -> None:
    make_secrets(tmp_path)
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", token="s3cret")
    api = Api(settings)
    task = asyncio.create_task(api.serve())
    try:
        await asyncio.wait_for(api.ready.wait(), 30)
        async with grpc.aio.insecure_channel(settings.addr) as channel:
            stub = async_stub(channel)
            for metadata in ((), (("authorization", "Bearer wrong"),)):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ListNodes(pb.ListNodesRequest(), metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in stub.WatchEvents(pb.WatchEventsRequest(), metadata=metadata):
                        pass
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await stub.ListNodes(pb.ListNodesRequest(), metadata=(("authorization", "Bearer s3cret"),))
            assert list(ok.nodes) == []
        code, _, err_text = await ferry_cli(settings.addr, None, "nodes")
        assert code == 1 and "FERRY_TOKEN" in err_text and len(err_text.strip().splitlines()) == 1
        code, out, _ = await ferry_cli(settings.addr, "s3cret", "nodes", "-o", "json")
        assert code == 0 and out.strip() == "[]"
    finally:
        api.stopping.set()
        await task
