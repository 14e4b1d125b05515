"""Token check for the admin API: with FERRY_TOKEN set, every call must carry it."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

METADATA_KEY = "authorization"

if TYPE_CHECKING:  # grpc's classes are generic only in their stubs (types-grpcio)
    Handler = grpc.RpcMethodHandler[Any, Any]
    Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = str(metadata.get(METADATA_KEY, "")).encode()
        handler = await continuation(handler_call_details)
        if hmac.compare_digest(given, self._expected) or handler is None:
            return handler
        return _deny(handler)


def _deny(handler: Handler) -> Handler:
    message = "missing or wrong API token: set FERRY_TOKEN to the cluster's token"

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # type: ignore[unreachable]  # abort() raises; the yield makes this a stream handler

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
