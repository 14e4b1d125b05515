"""`ferry mcp --http`: MCP's streamable HTTP on loopback, what an agent sees when the API is not
there (one sentence, not a crash), and the refusal of an address beyond loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

from mcp import Client

from ferry.common.ports import free_port
from tests.conftest import BIN, wait_until


def test_http_transport_lists_the_tools_and_an_unreachable_api_is_one_sentence() -> None:
    port, api = free_port(), free_port()  # nothing listens on `api`
    env = {**os.environ, "FERRY_ADDR": f"127.0.0.1:{api}", "FERRY_TOKEN": "t"}
    proc = subprocess.Popen([str(BIN / "ferry"), "mcp", "--http", f"127.0.0.1:{port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        async def session() -> tuple[Any, Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return (await client.list_tools()).tools, await client.call_tool("cluster_health", {})

        def up() -> tuple[Any, Any] | None:
            try:
                return asyncio.run(session())
            except Exception:
                if proc.poll() is not None:
                    raise AssertionError(f"ferry mcp exited: {proc.stderr.read() if proc.stderr else ''}") from None
                return None

        tools, health = wait_until(up, 60, "ferry mcp --http answering")
        assert len(tools) == 14
        assert health.is_error
        text = " ".join(getattr(part, "text", "") for part in health.content)
        assert f"cannot reach the Ferry API at 127.0.0.1:{api}" in text and "\n" not in text.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_http_beyond_loopback_is_refused() -> None:
    out = subprocess.run([str(BIN / "ferry"), "mcp", "--http", "0.0.0.0:8765"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("ferry: bad --http '0.0.0.0:8765'")
    assert out.stderr.count("\n") == 1
