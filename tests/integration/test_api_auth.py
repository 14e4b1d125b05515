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


async def ferry_tls(addr: str, env_extra: dict[str, str], *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "FERRY_ADDR": addr, **env_extra}
    for name in ("FERRY_TOKEN", "FERRY_TLS_CA", "FERRY_TLS_CERT", "FERRY_TLS_KEY"):
        if name not in env_extra:
            env.pop(name, None)
    proc = await asyncio.create_subprocess_exec(str(BIN / "ferry"), *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
async def test_the_api_serves_tls_and_mutual_tls(nats_url: str, tmp_path: Path, mutual: bool) -> None:
    from ferry.common.certs import make_tls

    make_secrets(tmp_path)
    tls = make_tls(tmp_path / "secrets" / "tls", ["127.0.0.1", "localhost"])
    settings = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", tls_cert=tls.cert,
                        tls_key=tls.key, tls_ca=tls.ca if mutual else None)
    api = Api(settings)
    task = asyncio.create_task(api.serve())
    try:
        await asyncio.wait_for(api.ready.wait(), 30)
        trusting = {"FERRY_TLS_CA": str(tls.ca)}
        client = {**trusting, "FERRY_TLS_CERT": str(tls.client_cert), "FERRY_TLS_KEY": str(tls.client_key)}
        code, _, err = await ferry_tls(settings.addr, {}, "nodes")  # plain text to a TLS port
        assert code == 1 and "set FERRY_TLS_CA" in err
        code, out, err = await ferry_tls(settings.addr, trusting, "nodes", "-o", "json")
        if mutual:  # no client certificate: the handshake fails
            assert code == 1, out
            code, out, err = await ferry_tls(settings.addr, client, "nodes", "-o", "json")
        assert code == 0 and out.strip() == "[]", err
        other = make_tls(tmp_path / "other", ["127.0.0.1"])  # a server certificate of another CA is not trusted
        code, _, err = await ferry_tls(settings.addr, {"FERRY_TLS_CA": str(other.ca)}, "nodes")
        assert code == 1
    finally:
        api.stopping.set()
        await task
