"""Watchers for the clouds' spot interruption notices, read from each instance's metadata service.

    MetadataError(FerryError)       a metadata endpoint cannot be reached or answered something
                                    this module does not understand (the watcher logs it and polls on)

Sources (each a `NoticeSource`: ``await source.poll()`` gives a `Notice` or None):

- `AwsImds`: IMDSv2. ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``
  (1 to 21600) returns a token, sent back as ``X-aws-ec2-metadata-token`` on every GET; a 401 means
  the token is stale (we fetch a new one and retry once). ``GET /latest/meta-data/spot/instance-action``
  is 404 until the instance is marked, then ``{"action": "stop"|"terminate"|"hibernate",
  "time": "2017-09-18T08:22:00Z"}`` about two minutes ahead. ``GET
  /latest/meta-data/events/recommendations/rebalance`` is 404 until EC2 flags an elevated risk,
  then ``{"noticeTime": "2020-10-27T08:22:00Z"}`` (the time the signal was emitted). A rebalance
  has no deadline of its own; we report noticeTime + 120 s, the earliest an interruption could
  follow had its two-minute notice come at once.
  Docs: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
  (instance-action), https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html
  (rebalance), https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
  (the token flow; 400 for a bad token PUT, 401 for a GET with an invalid token, 404 for an absent item).
- `GcpMetadata`: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``
  answers ``TRUE`` once Compute Engine has begun preempting the VM (preemptible and Spot VMs), else
  ``FALSE``; the VM then has about 30 s. The endpoint gives no time, so the deadline is the moment
  we first saw TRUE plus 30 s.
  Docs: https://cloud.google.com/compute/docs/instances/create-use-preemptible (detecting
  preemption), https://cloud.google.com/compute/docs/instances/preemptible (the 30 s preemption
  process), https://cloud.google.com/compute/docs/metadata/querying-metadata (the header).
- `AzureScheduledEvents`: ``GET /metadata/scheduledevents?api-version=2020-07-01`` with
  ``Metadata: true`` answers ``{"DocumentIncarnation": n, "Events": [{"EventId", "EventType":
  "Preempt", "ResourceType": "VirtualMachine", "Resources": [...], "EventStatus":
  "Scheduled"|"Started", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description",
  "EventSource", "DurationInSeconds"}]}``. A Spot VM's eviction is a ``Preempt`` event with at
  least 30 s notice. The deadline is NotBefore; NotBefore is empty once the event has started, and
  then it is the moment we first saw the event plus 30 s. With `resource_name`, only events that
  list that VM count (events go to every VM of an availability set or scale-set placement group).
  Docs: https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events

`watch(sources, interval_s)` polls them all and yields each notice once while it stays up; one that
goes away and comes back is reported again.
"""

import asyncio
import contextlib
import email.utils
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ferry.node import metahttp
from ferry.node.metahttp import MetadataError as MetadataError  # raised by every source

log = logging.getLogger(__name__)

Clock = Callable[[], float]

AWS_DEFAULT_URL = "http://169.254.169.254"
GCP_DEFAULT_URL = "http://metadata.google.internal"
AZURE_DEFAULT_URL = "http://169.254.169.254"
AWS_TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"
AWS_NOTICE_S = 120.0
GCP_NOTICE_S = 30.0
AZURE_NOTICE_S = 30.0
AZURE_API_VERSION = "2020-07-01"


class Notice(BaseModel):
    """One interruption (or rebalance) notice for this node."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    provider: Literal["aws", "gcp", "azure"]
    kind: Literal["interruption", "rebalance"]
    deadline: float  # epoch seconds by which the node may be gone
    detail: str = ""
    id: str = ""  # stable across polls while the provider shows the same notice


class NoticeSource(Protocol):
    async def poll(self) -> Notice | None:
        """The notice now shown, or None; raises MetadataError when the endpoint fails."""
        ...


# --- HTTP (ferry.node.metahttp) -----------------------------------------------------------------

HttpResponse = metahttp.Response


async def http_request(
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    timeout: float = 2.0,
) -> HttpResponse:
    """One HTTP request to a metadata endpoint (plain http only, no proxy: the endpoints are
    link-local), on the running loop's kept connection to it; MetadataError on failure or on a
    body over 1 MiB."""
    return await metahttp.request(method, url, headers, body, timeout)


async def close_client() -> None:
    """Closes the running loop's connections to the endpoints, if any (a service's close)."""
    await metahttp.close_all()


# --- time formats ----------------------------------------------------------------------------


def parse_iso_time(value: Any) -> float:
    """`2026-11-30T12:00:00Z` (AWS) to epoch seconds; MetadataError if it is not such a time."""
    if not isinstance(value, str):
        raise MetadataError(f"expected an ISO 8601 time, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise MetadataError(f"expected an ISO 8601 time, got {value!r}") from exc
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def parse_http_date(value: str) -> float:
    """`Mon, 19 Sep 2016 18:29:47 GMT` (Azure NotBefore) to epoch seconds."""
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"expected an HTTP date, got {value!r}") from exc


def _base(url: str) -> str:
    return url.rstrip("/")


# --- the sources -----------------------------------------------------------------------------


class AwsImds:
    """EC2 instance metadata (IMDSv2): spot instance-action, then the rebalance recommendation."""

    def __init__(self, base_url: str = AWS_DEFAULT_URL, *, token_ttl_s: int = 21600,
                 timeout_s: float = 2.0, clock: Clock = time.time) -> None:
        if not 1 <= token_ttl_s <= 21600:
            raise ValueError("token_ttl_s must be between 1 and 21600")
        self.base_url = _base(base_url)
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._token: str | None = None
        self._token_expires = 0.0

    async def _fetch_token(self) -> str:
        url = f"{self.base_url}/latest/api/token"
        reply = await http_request("PUT", url, {AWS_TOKEN_TTL_HEADER: str(self.token_ttl_s)}, timeout=self.timeout_s)
        if reply.status != 200 or not reply.body.strip():
            raise MetadataError(f"PUT {url}: HTTP {reply.status} {reply.text()[:80]!r}")
        self._token = reply.text().strip()
        self._token_expires = self.clock() + self.token_ttl_s * 0.9
        return self._token

    async def _get(self, path: str) -> HttpResponse:
        token = self._token if self._token and self.clock() < self._token_expires else await self._fetch_token()
        url = f"{self.base_url}{path}"
        reply = await http_request("GET", url, {AWS_TOKEN_HEADER: token}, timeout=self.timeout_s)
        if reply.status == 401:  # the token expired or the service restarted: one retry with a new one
            token = await self._fetch_token()
            reply = await http_request("GET", url, {AWS_TOKEN_HEADER: token}, timeout=self.timeout_s)
        if reply.status not in (200, 404):
            raise MetadataError(f"GET {url}: HTTP {reply.status} {reply.text()[:80]!r}")
        return reply

    async def poll(self) -> Notice | None:
        reply = await self._get("/latest/meta-data/spot/instance-action")
        if reply.status == 200:
            doc = reply.json()
            if not isinstance(doc, dict) or not isinstance(doc.get("action"), str):
                raise MetadataError(f"spot/instance-action: unexpected payload {reply.text()[:120]!r}")
            deadline = parse_iso_time(doc.get("time"))
            return Notice(provider="aws", kind="interruption", deadline=deadline,
                          detail=f"spot instance-action {doc['action']} at {doc['time']}",
                          id=f"aws:instance-action:{doc['action']}:{doc['time']}")
        reply = await self._get("/latest/meta-data/events/recommendations/rebalance")
        if reply.status == 200:
            doc = reply.json()
            if not isinstance(doc, dict) or "noticeTime" not in doc:
                raise MetadataError(f"events/recommendations/rebalance: unexpected payload {reply.text()[:120]!r}")
            issued = parse_iso_time(doc["noticeTime"])
            return Notice(provider="aws", kind="rebalance", deadline=issued + AWS_NOTICE_S,
                          detail=f"rebalance recommendation at {doc['noticeTime']}",
                          id=f"aws:rebalance:{doc['noticeTime']}")
        return None


class GcpMetadata:
    """Compute Engine metadata: `instance/preempted` (TRUE once preemption has begun)."""

    def __init__(self, base_url: str = GCP_DEFAULT_URL, *, timeout_s: float = 2.0, clock: Clock = time.time) -> None:
        self.base_url = _base(base_url)
        self.timeout_s = timeout_s
        self.clock = clock
        self._first_seen: float | None = None

    async def poll(self) -> Notice | None:
        url = f"{self.base_url}/computeMetadata/v1/instance/preempted"
        reply = await http_request("GET", url, {"Metadata-Flavor": "Google"}, timeout=self.timeout_s)
        if reply.status != 200:
            raise MetadataError(f"GET {url}: HTTP {reply.status} {reply.text()[:80]!r}")
        value = reply.text().strip().upper()
        if value == "FALSE":
            self._first_seen = None
            return None
        if value != "TRUE":
            raise MetadataError(f"GET {url}: expected TRUE or FALSE, got {reply.text()[:40]!r}")
        if self._first_seen is None:
            self._first_seen = self.clock()
        return Notice(provider="gcp", kind="interruption", deadline=self._first_seen + GCP_NOTICE_S,
                      detail="instance/preempted is TRUE", id="gcp:preempted")


class AzureScheduledEvents:
    """Azure Scheduled Events: a `Preempt` event (for this VM when `resource_name` is given)."""

    def __init__(self, base_url: str = AZURE_DEFAULT_URL, *, resource_name: str | None = None,
                 timeout_s: float = 2.0, clock: Clock = time.time) -> None:
        self.base_url = _base(base_url)
        self.resource_name = resource_name
        self.timeout_s = timeout_s
        self.clock = clock
        self._first_seen: dict[str, float] = {}

    async def poll(self) -> Notice | None:
        url = f"{self.base_url}/metadata/scheduledevents?api-version={AZURE_API_VERSION}"
        reply = await http_request("GET", url, {"Metadata": "true"}, timeout=self.timeout_s)
        if reply.status != 200:
            raise MetadataError(f"GET {url}: HTTP {reply.status} {reply.text()[:80]!r}")
        doc = reply.json()
        events = doc.get("Events") if isinstance(doc, dict) else None
        if not isinstance(events, list):
            raise MetadataError(f"GET {url}: no Events list in {reply.text()[:120]!r}")
        found: list[Notice] = []
        now = self.clock()
        for event in events:
            if not isinstance(event, dict) or event.get("EventType") != "Preempt":
                continue
            resources = event.get("Resources")
            resources = [str(r) for r in resources] if isinstance(resources, list) else []
            if self.resource_name is not None and self.resource_name not in resources:
                continue
            event_id = str(event.get("EventId", ""))
            first = self._first_seen.setdefault(event_id, now)
            not_before = event.get("NotBefore") or ""
            deadline = parse_http_date(not_before) if not_before else first + AZURE_NOTICE_S
            found.append(Notice(
                provider="azure", kind="interruption", deadline=deadline,
                detail=f"Preempt {event.get('EventStatus', '')} {event_id} for {', '.join(resources)}",
                id=f"azure:{event_id}",
            ))
        live = {n.id.removeprefix("azure:") for n in found}
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in live}
        return min(found, key=lambda n: n.deadline) if found else None


# --- watching --------------------------------------------------------------------------------


async def watch(
    sources: Sequence[NoticeSource],
    interval_s: float,
    *,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[Notice]:
    """Polls every source each `interval_s` and yields each notice once while it stays up.

    A source that fails is logged (a warning the first time in a row, then at debug level) and
    keeps its last state, so a flaky endpoint does not make a notice repeat. Ends when `stop` is set.
    """
    shown: list[str | None] = [None] * len(sources)
    failing = [False] * len(sources)
    while stop is None or not stop.is_set():
        results = await asyncio.gather(*(s.poll() for s in sources), return_exceptions=True)
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                log.log(logging.DEBUG if failing[i] else logging.WARNING,
                        "%s: poll failed: %s", type(sources[i]).__name__, result)
                failing[i] = True
                continue
            failing[i] = False
            if result is None:
                shown[i] = None
            else:
                key = result.id or f"{result.provider}:{result.kind}:{result.deadline}"
                if key != shown[i]:
                    shown[i] = key
                    yield result
        if stop is None:
            await asyncio.sleep(interval_s)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
