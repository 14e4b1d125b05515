"""The MCP tools' side of the admin API: the CLI's client, called from a worker thread (the gRPC
client blocks), with every Ferry error turned into the one sentence an agent sees (ToolError)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError

from ferry.cli.client import Client
from ferry.common.errors import FerryError
from ferry.v1 import ferry_pb2 as pb

T = TypeVar("T")


class Api:
    """One connection to the API (FERRY_ADDR, FERRY_TOKEN: the agent's own token)."""

    def __init__(self, addr: str | None = None, token: str | None = None) -> None:
        self._addr, self._token = addr, token
        self._client: Client | None = None

    def client(self, reason: str = "") -> Client:
        if self._client is None:
            self._client = Client(self._addr, self._token)
        return self._client.with_reason(reason) if reason else self._client

    async def run(self, fn: Callable[[], T]) -> T:
        try:
            return await anyio.to_thread.run_sync(fn)
        except FerryError as exc:
            raise ToolError(str(exc)) from exc

    async def signal(self, name: str, job: str = "") -> Any:
        def call() -> Any:
            c = self.client()
            return json.loads(c.call(c.stub.GetSignal, pb.SignalRequest(name=name, job=job)).json)

        return await self.run(call)

    async def plan(self, request: pb.PlanRequest) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            c = self.client()
            reply = c.call(c.stub.Plan, request)
            return dict(json.loads(reply.json))

        return await self.run(call)

    async def op(self, method: str, request: Any, reason: str) -> pb.OpUpdate:
        """A streamed operation to its end; its failure is the agent's ToolError."""
        def call() -> pb.OpUpdate:
            c = self.client(reason)
            final = pb.OpUpdate()
            for update in c.stream(getattr(c.stub, method), request):
                final = update
            if final.error:
                raise FerryError(final.error)
            return final

        return await self.run(call)

    async def unary(self, method: str, request: Any, reason: str = "", timeout: float | None = None) -> Any:
        def call() -> Any:
            c = self.client(reason)
            return c.call(getattr(c.stub, method), request, timeout=timeout)

        return await self.run(call)
