"""Who calls, and what they did: the admin API's authentication and audit, as one interceptor.

Each call's bearer token is mapped to a Principal (ferry.api.tenants); a call without a known
token is refused (UNAUTHENTICATED) before any handler runs. The handler runs with its caller in
``CALLER``. Every mutating call, allowed or not, is written to the audit stream afterwards (who,
what, when, outcome), by the ``audit`` callback.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from ferry.common.models import AuditEntry
from ferry.common.tenancy import OPEN, Principal, Tenants

METADATA_KEY = "authorization"
REASON_KEY = "x-ferry-reason"
REASON_MAX = 500
MUTATING = frozenset({"SubmitJob", "KillJob", "Checkpoint", "Restore", "Migrate", "DrainNode", "Chaos",
                      "SetAutoscale"})
CALLER: contextvars.ContextVar[Principal] = contextvars.ContextVar("ferry_caller", default=OPEN)
# what a handler learnt that the audit entry should carry (the cost the call committed)
NOTES: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("ferry_call_notes")

if TYPE_CHECKING:  # grpc's classes are generic only in their stubs (types-grpcio)
    Handler = grpc.RpcMethodHandler[Any, Any]
    Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]
    Context = grpc.aio.ServicerContext[Any, Any]

Audit = Callable[[AuditEntry], Awaitable[None]]


def caller() -> Principal:
    return CALLER.get()


def notes() -> dict[str, Any]:
    """This call's notes (empty outside a call)."""
    return NOTES.get({})


def note(key: str, value: Any) -> None:
    """Adds ``key`` to this call's audit entry (outside a call, nothing)."""
    with contextlib.suppress(LookupError):
        NOTES.get()[key] = value


def target_of(request: Any) -> str:
    """What a request is about: its job, node or name, the first one it has."""
    for field in ("job", "node", "name"):
        value = getattr(request, field, "")
        if value:
            return str(value)
    return ""


def _outcome(context: Any, exc: BaseException | None, last: Any = None) -> tuple[str, str]:
    """How a call ended: its gRPC status, or, for an operation streamed to its end, the error its
    last update carries (an op that failed on a node ends its stream with one, not with a status)."""
    code = context.code() if hasattr(context, "code") else None
    if isinstance(exc, grpc.aio.AbortError) or (code is not None and code != grpc.StatusCode.OK):
        name = code.name if isinstance(code, grpc.StatusCode) else "ABORTED"
        details = context.details() if hasattr(context, "details") else ""
        return name, str(details or "")
    if exc is not None:
        return "UNKNOWN", str(exc)
    if last is not None and getattr(last, "done", False) and getattr(last, "error", ""):
        return "FAILED", str(last.error)
    return "ok", ""


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tenants: Tenants, audit: Audit) -> None:
        self._tenants = tenants
        self._audit = audit

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> Handler | None:
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = str(metadata.get(METADATA_KEY, ""))
        token = given[len("Bearer "):] if given.startswith("Bearer ") else ""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        principal = self._tenants.principal(token)
        if principal is None:
            return _deny(handler)
        method = str(handler_call_details.method).rpartition("/")[2]
        reason = " ".join(str(metadata.get(REASON_KEY, "")).split())[:REASON_MAX]
        return self._wrap(handler, principal, method, reason)

    async def _record(self, principal: Principal, method: str, request: Any, context: Any,
                      exc: BaseException | None, last: Any = None, reason: str = "",
                      notes: dict[str, Any] | None = None) -> None:
        if method not in MUTATING:
            return
        outcome, error = _outcome(context, exc, last)
        notes = notes or {}
        await self._audit(AuditEntry(time=time.time(), tenant=principal.tenant, who=principal.who,
                                     role=principal.role.value, method=method, target=target_of(request),
                                     outcome=outcome, error=error[:500], reason=reason,
                                     cost_per_hour=float(notes.get("cost_per_hour", 0.0)),
                                     undo=bool(getattr(request, "undo", False))))

    @contextlib.asynccontextmanager
    async def _call(self, principal: Principal, method: str, reason: str, request: Any,
                    context: Any) -> AsyncIterator[list[Any]]:
        """One call as ``principal``, recorded in the audit trail however it ends (a stream puts
        each update it sends in the yielded list: the last one may tell a failed operation). An
        agent's mutating call without a reason ends here, refused."""
        CALLER.set(principal)
        notes: dict[str, Any] = {}
        NOTES.set(notes)
        failure: BaseException | None = None
        sent: list[Any] = []
        try:
            if principal.agent and method in MUTATING and not reason:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                    f"an agent must say why it calls {method}: give a reason (--reason, the tools' reason "
                    f"argument, or the {REASON_KEY} metadata)"))
            yield sent
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._record(principal, method, request, context, failure, sent[-1] if sent else None, reason,
                               notes)

    def _wrap(self, handler: Handler, principal: Principal, method: str, reason: str) -> Handler:
        def call(request: Any, context: Any) -> contextlib.AbstractAsyncContextManager[list[Any]]:
            return self._call(principal, method, reason, request, context)

        if handler.response_streaming:
            inner_stream: Any = handler.unary_stream  # an async generator function under grpc.aio

            async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
                async with call(request, context) as sent:
                    async for item in inner_stream(request, context):
                        sent[:] = [item]
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        inner: Any = handler.unary_unary  # a coroutine function under grpc.aio

        async def unary(request: Any, context: Context) -> Any:
            async with call(request, context):
                return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def _deny(handler: Handler) -> Handler:
    message = "missing or wrong API token: set FERRY_TOKEN to a token of this cluster (`ferry keys token` makes one)"

    async def unary(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # type: ignore[unreachable]  # abort() raises; the yield makes this a stream handler

    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
