"""Errors at the API's edge: every FerryError an RPC raises ends the call with its gRPC status.

    QuotaExceeded       RESOURCE_EXHAUSTED  (the CLI exits 2)
    UsageError          INVALID_ARGUMENT    (the CLI exits 2)
    PermissionDenied    PERMISSION_DENIED   (the CLI exits 2)
    NotFoundError       NOT_FOUND           (the CLI exits 2)
    AlreadyExistsError  ALREADY_EXISTS      (the CLI exits 2)
    ConflictError       FAILED_PRECONDITION
    BusError            UNAVAILABLE         (NATS down or a server of its cluster lost: retry)
    any other           UNKNOWN
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from ferry.common.bus import BusError
from ferry.common.errors import (
    AlreadyExistsError,
    ConflictError,
    FerryError,
    NotFoundError,
    PermissionDenied,
    QuotaExceeded,
    UsageError,
)

_STATUS = {  # the first class that matches decides: subclasses before their parents
    QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UsageError: grpc.StatusCode.INVALID_ARGUMENT,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    ConflictError: grpc.StatusCode.FAILED_PRECONDITION,
    BusError: grpc.StatusCode.UNAVAILABLE,
}


def status_of(exc: FerryError) -> grpc.StatusCode:
    for cls, code in _STATUS.items():
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.UNKNOWN


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Catches what a handler did not: a FerryError never reaches the client as "Unexpected"."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.unary_unary is not None:
            inner: Any = handler.unary_unary  # an asyncio server's: a coroutine function

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    return await inner(request, context)
                except FerryError as exc:
                    await context.abort(status_of(exc), str(exc))

            return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                       response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream: Any = handler.unary_stream  # an asyncio server's: an async generator

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                try:
                    async for item in inner_stream(request, context):
                        yield item
                except FerryError as exc:
                    await context.abort(status_of(exc), str(exc))

            return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)
        return handler
