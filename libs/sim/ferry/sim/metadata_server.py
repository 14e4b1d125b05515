"""A local stand-in for the AWS, GCP and Azure metadata services of ONE simulated node.

It serves, on one base URL, the paths and payloads that `ferry.node.interruptions` reads (see
that module's docstring for the provider documentation), and it enforces their headers the way
the real services do:

    PUT  /latest/api/token                               IMDSv2 token; 400 without a valid
                                                         X-aws-ec2-metadata-token-ttl-seconds (1-21600)
    GET  /latest/meta-data/spot/instance-action          401 without a valid X-aws-ec2-metadata-token;
    GET  /latest/meta-data/spot/termination-time         404 until armed
    GET  /latest/meta-data/events/recommendations/rebalance
    GET  /computeMetadata/v1/instance/preempted          403 without Metadata-Flavor: Google; TRUE/FALSE
    GET  /metadata/scheduledevents?api-version=...       400 without Metadata: true or api-version
    POST /metadata/scheduledevents?api-version=...       {"StartRequests": [{"EventId": ...}]} starts events

and a control API to drive it (used by tests and by `ferry chaos spot-notice` in all-in-one mode):

    POST /_ferry/notice   {"provider": "aws"|"gcp"|"azure"|"all", "kind": "interruption"|"rebalance",
                           "in_s": 120, "action": "terminate"|"stop"|"hibernate"}
                          arms a notice for `in_s` seconds from now (default: 120 on AWS, 30 on GCP
                          and Azure, as the clouds give); a rebalance exists on AWS only, and its
                          noticeTime is set so that a watcher reports the same deadline.
    POST /_ferry/clear    withdraws every notice
    GET  /_ferry/state    what is armed, as JSON

Notices show at once (the real services show them about `in_s` ahead). HTTP is aiohttp's; every
connection serves one request and closes. Run it alone with ``python -m ferry.sim.metadata_server --port N``: it prints
its base URL on stdout and serves until SIGTERM or SIGINT.
"""

import argparse
import asyncio
import email.utils
import json
import logging
import secrets
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ferry.common.errors import UsageError
from ferry.node.interruptions import (
    AWS_NOTICE_S,
    AWS_TOKEN_HEADER,
    AWS_TOKEN_TTL_HEADER,
    AZURE_NOTICE_S,
    GCP_NOTICE_S,
    Clock,
    MetadataError,
    http_request,
)

log = logging.getLogger(__name__)

Provider = Literal["aws", "gcp", "azure"]
Kind = Literal["interruption", "rebalance"]
Action = Literal["terminate", "stop", "hibernate"]
PROVIDERS: tuple[Provider, ...] = ("aws", "gcp", "azure")
DEFAULT_NOTICE_S: dict[Provider, float] = {"aws": AWS_NOTICE_S, "gcp": GCP_NOTICE_S, "azure": AZURE_NOTICE_S}
_MAX_BODY = 1 << 20


class NoticeRequest(BaseModel):
    """The body of POST /_ferry/notice."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["aws", "gcp", "azure", "all"] = "all"
    kind: Kind = "interruption"
    in_s: float | None = Field(default=None, ge=0, le=86400)
    action: Action = "terminate"


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass
class _Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


def _json(status: int, value: Any, headers: tuple[tuple[str, str], ...] = ()) -> _Response:
    return _Response(status, json.dumps(value).encode(), "application/json", headers)


def _text(status: int, value: str, headers: tuple[tuple[str, str], ...] = ()) -> _Response:
    return _Response(status, value.encode(), "text/plain", headers)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _http_date(epoch: float) -> str:
    return email.utils.format_datetime(datetime.fromtimestamp(epoch, UTC), usegmt=True)


class MetadataServer:
    """Serves the three clouds' interruption endpoints for one simulated node."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, resource_name: str = "ferry-node",
                 clock: Clock = time.time) -> None:
        self.host = host
        self.port = port
        self.resource_name = resource_name
        self.clock = clock
        self._runner: web.AppRunner | None = None
        self._tokens: dict[str, float] = {}
        self._aws_action: tuple[Action, float] | None = None
        self._aws_rebalance: float | None = None  # noticeTime
        self._gcp_deadline: float | None = None
        self._azure_events: dict[str, dict[str, Any]] = {}
        self._azure_incarnation = 1

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        """Starts listening; returns the base URL (http://host:port)."""
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        log.info("metadata server listening on %s", self.url)
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- arming ------------------------------------------------------------------------------

    def arm(self, provider: Provider | Literal["all"], kind: Kind = "interruption",
            deadline: float | None = None, *, action: Action = "terminate") -> dict[str, float]:
        """Shows a notice whose interruption falls at `deadline` (epoch s; default: each cloud's
        usual notice from now). Returns the deadline armed per provider. A rebalance is AWS-only."""
        targets = PROVIDERS if provider == "all" else (provider,)
        if kind == "rebalance" and targets != ("aws",):
            raise ValueError("a rebalance recommendation exists on AWS only: use provider 'aws'")
        now = self.clock()
        armed: dict[str, float] = {}
        for target in targets:
            when = deadline if deadline is not None else now + DEFAULT_NOTICE_S[target]
            armed[target] = when
            if target == "aws" and kind == "rebalance":
                self._aws_rebalance = when - AWS_NOTICE_S
            elif target == "aws":
                self._aws_action = (action, when)
            elif target == "gcp":
                self._gcp_deadline = when
            else:
                self._azure_events = {}
                event_id = str(uuid.uuid4()).upper()
                self._azure_events[event_id] = {
                    "EventId": event_id,
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [self.resource_name],
                    "EventStatus": "Scheduled",
                    "NotBefore": _http_date(when),
                    "Description": "Spot virtual machine is being evicted (simulated by ferry).",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
                self._azure_incarnation += 1
        log.info("armed %s %s: %s", provider, kind, armed)
        return armed

    def clear(self) -> None:
        """Withdraws every notice."""
        self._aws_action = None
        self._aws_rebalance = None
        self._gcp_deadline = None
        if self._azure_events:
            self._azure_events = {}
            self._azure_incarnation += 1

    def state(self) -> dict[str, Any]:
        return {
            "aws": {
                "instance_action": {"action": self._aws_action[0], "time": _iso(self._aws_action[1])}
                if self._aws_action else None,
                "rebalance": {"noticeTime": _iso(self._aws_rebalance)} if self._aws_rebalance is not None else None,
            },
            "gcp": {"preempted": self._gcp_deadline is not None, "deadline": self._gcp_deadline},
            "azure": self._azure_document(),
        }

    # --- HTTP --------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """aiohttp's request as the routes see it, and their answer back."""
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=400, text="bad request\n")
        req = _Request(request.method.upper(), request.path, parse_qs(request.query_string),
                       {k.lower(): v for k, v in request.headers.items()}, body)
        try:
            response = self._route(req)
        except Exception:
            log.exception("%s %s failed", req.method, req.path)
            response = _text(500, "internal error\n")
        log.debug("%s %s -> %s", req.method, req.path, response.status)
        # kept alive, as the clouds' endpoints are: a watcher polls every second over one connection
        headers = {"Server": "ferry-metadata", **dict(response.headers)}
        return web.Response(status=response.status, body=response.body, content_type=response.content_type,
                            headers=headers)

    def _route(self, req: _Request) -> _Response:
        path = req.path
        if path.startswith("/_ferry/"):
            return self._control(req)
        if path.startswith("/latest/"):
            return self._aws(req)
        if path.startswith("/computeMetadata/"):
            return self._gcp(req)
        if path.rstrip("/") == "/metadata/scheduledevents":
            return self._azure(req)
        return _text(404, "not found\n")

    # AWS IMDSv2
    def _aws(self, req: _Request) -> _Response:
        now = self.clock()
        if req.path == "/latest/api/token":
            if req.method != "PUT":
                return _text(405, "use PUT to get a token\n", (("Allow", "PUT"),))
            ttl = req.headers.get(AWS_TOKEN_TTL_HEADER.lower(), "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return _text(400, f"missing or invalid {AWS_TOKEN_TTL_HEADER} (1 to 21600)\n")
            self._tokens = {t: exp for t, exp in self._tokens.items() if exp > now}
            token = secrets.token_urlsafe(32)
            self._tokens[token] = now + int(ttl)
            return _text(200, token, ((AWS_TOKEN_TTL_HEADER, ttl),))
        if req.method != "GET":
            return _text(405, "method not allowed\n", (("Allow", "GET"),))
        token = req.headers.get(AWS_TOKEN_HEADER.lower(), "")
        if self._tokens.get(token, 0.0) <= now:
            return _text(401, "missing, invalid or expired IMDSv2 token\n")
        if self._aws_action is not None:
            action, when = self._aws_action
            if req.path == "/latest/meta-data/spot/instance-action":
                return _text(200, json.dumps({"action": action, "time": _iso(when)}))
            if req.path == "/latest/meta-data/spot/termination-time" and action == "terminate":
                return _text(200, _iso(when))
        if req.path == "/latest/meta-data/events/recommendations/rebalance" and self._aws_rebalance is not None:
            return _text(200, json.dumps({"noticeTime": _iso(self._aws_rebalance)}))
        return _text(404, "not found\n")

    # GCP Compute Engine
    def _gcp(self, req: _Request) -> _Response:
        flavor = (("Metadata-Flavor", "Google"),)
        if req.headers.get("metadata-flavor") != "Google":
            return _text(403, "missing Metadata-Flavor: Google header\n")
        if req.method != "GET":
            return _text(405, "method not allowed\n", flavor)
        if req.path == "/computeMetadata/v1/instance/preempted":
            return _Response(200, b"TRUE" if self._gcp_deadline is not None else b"FALSE", "application/text", flavor)
        return _text(404, "not found\n", flavor)

    # Azure Scheduled Events
    def _azure_document(self) -> dict[str, Any]:
        return {"DocumentIncarnation": self._azure_incarnation, "Events": list(self._azure_events.values())}

    def _azure(self, req: _Request) -> _Response:
        if req.headers.get("metadata", "").lower() != "true":
            return _json(400, {"error": "Bad request. Required metadata header not specified"})
        if not req.query.get("api-version"):
            return _json(400, {"error": "Bad request. api-version was not specified"})
        if req.method == "GET":
            return _json(200, self._azure_document())
        if req.method != "POST":
            return _json(405, {"error": "method not allowed"})
        try:
            starts = json.loads(req.body)["StartRequests"]
            ids = [str(s["EventId"]) for s in starts]
        except (ValueError, KeyError, TypeError):
            return _json(400, {"error": "Bad request. Expected {\"StartRequests\": [{\"EventId\": ...}]}"})
        changed = False
        for event_id in ids:
            event = self._azure_events.get(event_id)
            if event is not None and event["EventStatus"] != "Started":
                event.update(EventStatus="Started", NotBefore="")
                changed = True
        if changed:
            self._azure_incarnation += 1
        return _Response(200)

    # control API
    def _control(self, req: _Request) -> _Response:
        if req.path == "/_ferry/state" and req.method == "GET":
            return _json(200, self.state())
        if req.method != "POST":
            return _json(405, {"error": "use POST"})
        if req.path == "/_ferry/clear":
            self.clear()
            return _json(200, {"cleared": True})
        if req.path != "/_ferry/notice":
            return _json(404, {"error": f"no control endpoint {req.path}"})
        try:
            ask = NoticeRequest.model_validate_json(req.body or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return _json(400, {"error": f"{where}: {first['msg']}"})
        deadline = None if ask.in_s is None else self.clock() + ask.in_s
        try:
            armed = self.arm(ask.provider, ask.kind, deadline, action=ask.action)
        except ValueError as exc:
            return _json(400, {"error": str(exc)})
        return _json(200, {"armed": armed, "kind": ask.kind})


# --- a client for the control API ------------------------------------------------------------


async def _control_call(base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await http_request("POST", base_url.rstrip("/") + path, {"Content-Type": "application/json"},
                               json.dumps(body).encode(), timeout=5.0)
    try:
        doc = reply.json()
    except MetadataError:
        doc = {}
    if reply.status == 400:
        raise UsageError(f"metadata server refused the request: {doc.get('error', reply.text())}")
    if reply.status != 200 or not isinstance(doc, dict):
        raise MetadataError(f"{base_url}{path}: HTTP {reply.status} {reply.text()[:120]!r}")
    return doc


async def send_notice(base_url: str, provider: Provider | Literal["all"] = "all", kind: Kind = "interruption",
                      in_s: float | None = None, action: Action = "terminate") -> dict[str, float]:
    """Arms a notice on a running server (POST /_ferry/notice); returns the deadline per provider."""
    body: dict[str, Any] = {"provider": provider, "kind": kind, "action": action}
    if in_s is not None:
        body["in_s"] = in_s
    doc = await _control_call(base_url, "/_ferry/notice", body)
    return {str(k): float(v) for k, v in doc.get("armed", {}).items()}


async def send_clear(base_url: str) -> None:
    """Withdraws every notice on a running server (POST /_ferry/clear)."""
    await _control_call(base_url, "/_ferry/clear", {})


# --- entry point -----------------------------------------------------------------------------


async def _serve(host: str, port: int, resource_name: str) -> None:
    server = MetadataServer(host, port, resource_name=resource_name)
    url = await server.start()
    print(url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ferry.sim.metadata_server",
        description="Serve simulated AWS/GCP/Azure interruption notices for one node; prints its base URL.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    parser.add_argument("--resource-name", default="ferry-node", help="the VM name Azure events list")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s metadata-server %(levelname)s: %(message)s")
    try:
        asyncio.run(_serve(args.host, args.port, args.resource_name))
    except OSError as exc:
        print(f"ferry-metadata-server: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
