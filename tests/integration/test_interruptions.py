"""Interruption watchers against the local metadata server that plays AWS IMDSv2, GCP and Azure."""

import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable

import pytest

from ferry.common.errors import UsageError
from ferry.node import metahttp
from ferry.node.interruptions import (
    AwsImds,
    AzureScheduledEvents,
    GcpMetadata,
    MetadataError,
    Notice,
    NoticeSource,
    close_client,
    http_request,
    parse_http_date,
    watch,
)
from ferry.sim.metadata_server import MetadataServer, send_clear, send_notice


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def server() -> AsyncIterator[MetadataServer]:
    srv = MetadataServer(port=0, resource_name="node-a")
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


async def eventually(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


# --- each watcher: nothing, then the armed notice ------------------------------------------


async def test_aws_instance_action_and_rebalance(server: MetadataServer) -> None:
    aws = AwsImds(server.url)
    assert await aws.poll() is None
    deadline = time.time() + 120
    server.arm("aws", "rebalance", deadline)
    rebalance = await aws.poll()
    assert rebalance is not None and (rebalance.provider, rebalance.kind) == ("aws", "rebalance")
    assert rebalance.deadline == pytest.approx(deadline, abs=1)
    server.arm("aws", "interruption", deadline, action="stop")
    notice = await aws.poll()
    assert notice is not None and (notice.provider, notice.kind) == ("aws", "interruption")
    assert notice.deadline == pytest.approx(deadline, abs=1)
    assert "stop" in notice.detail
    server.clear()
    assert await aws.poll() is None


async def test_aws_refreshes_a_rejected_token(server: MetadataServer) -> None:
    aws = AwsImds(server.url)
    assert await aws.poll() is None
    server._tokens.clear()  # as if the token expired: the next GET gets a 401
    server.arm("aws")
    notice = await aws.poll()
    assert notice is not None and notice.kind == "interruption"
    assert notice.deadline == pytest.approx(time.time() + 120, abs=2)


async def test_gcp_preempted(server: MetadataServer) -> None:
    clock = FakeClock()
    gcp = GcpMetadata(server.url, clock=clock)
    assert await gcp.poll() is None
    server.arm("gcp")
    first = await gcp.poll()
    assert first == Notice(provider="gcp", kind="interruption", deadline=clock.now + 30,
                           detail="instance/preempted is TRUE", id="gcp:preempted")
    clock.now += 5
    assert await gcp.poll() == first  # the deadline stays where it was first seen
    server.clear()
    assert await gcp.poll() is None


async def test_azure_preempt(server: MetadataServer) -> None:
    clock = FakeClock(time.time())
    azure = AzureScheduledEvents(server.url, resource_name="node-a", clock=clock)
    assert await azure.poll() is None
    deadline = time.time() + 30
    server.arm("azure", deadline=deadline)
    notice = await azure.poll()
    assert notice is not None and (notice.provider, notice.kind) == ("azure", "interruption")
    assert notice.deadline == pytest.approx(deadline, abs=1)
    assert await AzureScheduledEvents(server.url, resource_name="node-b").poll() is None  # not for that VM

    # the VM approves the event: it starts, NotBefore goes blank, the deadline falls back to first-seen + 30 s
    doc = (await http_request("GET", f"{server.url}/metadata/scheduledevents?api-version=2020-07-01",
                              {"Metadata": "true"})).json()
    event_id = doc["Events"][0]["EventId"]
    assert parse_http_date(doc["Events"][0]["NotBefore"]) == pytest.approx(deadline, abs=1)
    reply = await http_request("POST", f"{server.url}/metadata/scheduledevents?api-version=2020-07-01",
                               {"Metadata": "true"}, json.dumps({"StartRequests": [{"EventId": event_id}]}).encode())
    assert reply.status == 200
    clock.now += 10
    started = await azure.poll()
    assert started is not None and started.id == notice.id
    assert started.deadline == pytest.approx(clock.now - 10 + 30)
    after = (await http_request("GET", f"{server.url}/metadata/scheduledevents?api-version=2020-07-01",
                                {"Metadata": "true"})).json()
    assert after["DocumentIncarnation"] > doc["DocumentIncarnation"]
    assert after["Events"][0]["EventStatus"] == "Started"
    server.clear()
    assert await azure.poll() is None


# --- the server refuses requests without the providers' headers ----------------------------


async def test_headers_are_enforced(server: MetadataServer) -> None:
    url = server.url
    token_url = f"{url}/latest/api/token"
    assert (await http_request("PUT", token_url)).status == 400
    assert (await http_request("PUT", token_url, {"X-aws-ec2-metadata-token-ttl-seconds": "0"})).status == 400
    assert (await http_request("PUT", token_url, {"X-aws-ec2-metadata-token-ttl-seconds": "21601"})).status == 400
    good = await http_request("PUT", token_url, {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    assert good.status == 200 and good.text()
    action = f"{url}/latest/meta-data/spot/instance-action"
    assert (await http_request("GET", action)).status == 401
    assert (await http_request("GET", action, {"X-aws-ec2-metadata-token": "forged"})).status == 401
    assert (await http_request("GET", action, {"X-aws-ec2-metadata-token": good.text()})).status == 404

    preempted = f"{url}/computeMetadata/v1/instance/preempted"
    assert (await http_request("GET", preempted)).status == 403
    assert (await http_request("GET", preempted, {"Metadata-Flavor": "Amazon"})).status == 403
    answer = await http_request("GET", preempted, {"Metadata-Flavor": "Google"})
    assert (answer.status, answer.text(), answer.headers["metadata-flavor"]) == (200, "FALSE", "Google")

    events = f"{url}/metadata/scheduledevents"
    assert (await http_request("GET", f"{events}?api-version=2020-07-01")).status == 400
    assert (await http_request("GET", events, {"Metadata": "true"})).status == 400
    empty = await http_request("GET", f"{events}?api-version=2020-07-01", {"Metadata": "true"})
    assert empty.status == 200 and empty.json()["Events"] == []


async def test_requests_share_one_connection_until_the_service_closes_it(server: MetadataServer) -> None:
    preempted, google = f"{server.url}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"}
    assert (await http_request("GET", preempted, google)).status == 200
    [first] = metahttp.pool().conns.values()
    assert (await http_request("GET", preempted, google)).status == 200
    assert list(metahttp.pool().conns.values()) == [first]  # kept: the same connection
    open_before = not first.writer.is_closing()
    await close_client()
    assert open_before and first.writer.is_closing()
    await close_client()  # nothing left to close: no error
    assert (await http_request("GET", preempted, google)).status == 200  # a new one after a close
    assert list(metahttp.pool().conns.values()) != [first]
    await close_client()


async def test_a_source_reports_an_unreachable_endpoint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MetadataError, match=f"127.0.0.1:{port}"):
        await GcpMetadata(f"http://127.0.0.1:{port}", timeout_s=1).poll()


# --- control API ---------------------------------------------------------------------------


async def test_control_api(server: MetadataServer) -> None:
    before = time.time()
    armed = await send_notice(server.url)
    assert set(armed) == {"aws", "gcp", "azure"}
    assert armed["aws"] == pytest.approx(before + 120, abs=2)
    assert armed["gcp"] == pytest.approx(before + 30, abs=2)
    state = (await http_request("GET", f"{server.url}/_ferry/state")).json()
    assert state["aws"]["instance_action"]["action"] == "terminate"
    assert state["gcp"]["preempted"] is True and len(state["azure"]["Events"]) == 1
    for source in (AwsImds(server.url), GcpMetadata(server.url), AzureScheduledEvents(server.url)):
        assert await source.poll() is not None

    await send_clear(server.url)
    for source in (AwsImds(server.url), GcpMetadata(server.url), AzureScheduledEvents(server.url)):
        assert await source.poll() is None

    armed = await send_notice(server.url, "aws", "rebalance", in_s=300)
    assert armed["aws"] == pytest.approx(time.time() + 300, abs=2)
    rebalance = await AwsImds(server.url).poll()
    assert rebalance is not None and rebalance.kind == "rebalance"
    with pytest.raises(UsageError, match="AWS only"):
        await send_notice(server.url, "all", "rebalance")
    with pytest.raises(UsageError, match="in_s"):
        await send_notice(server.url, "gcp", in_s=-1)
    bad = await http_request("POST", f"{server.url}/_ferry/notice", body=b'{"provider": "ibm"}')
    assert bad.status == 400 and "provider" in bad.json()["error"]
    assert (await http_request("POST", f"{server.url}/_ferry/notice", body=b"not json")).status == 400
    assert (await http_request("GET", f"{server.url}/_ferry/notice")).status == 405


async def test_entry_point_serves_and_stops() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ferry.sim.metadata_server", "--port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
        assert url == f"http://127.0.0.1:{port}"
        await send_notice(url, "gcp")
        notice = await GcpMetadata(url).poll()
        assert notice is not None and notice.provider == "gcp"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


# --- watch() ---------------------------------------------------------------------------------


async def test_watch_reports_each_notice_once(server: MetadataServer) -> None:
    seen: list[Notice] = []
    stop = asyncio.Event()
    sources: list[NoticeSource] = [AwsImds(server.url), GcpMetadata(server.url), AzureScheduledEvents(server.url)]

    async def consume() -> None:
        async for notice in watch(sources, 0.01, stop=stop):
            seen.append(notice)

    task = asyncio.create_task(consume())
    try:
        await asyncio.sleep(0.05)
        assert seen == []
        deadline = time.time() + 120
        server.arm("aws", "rebalance", deadline)
        await eventually(lambda: len(seen) == 1)
        server.arm("aws", "interruption", deadline)
        server.arm("gcp")
        await eventually(lambda: len(seen) == 3)
        await asyncio.sleep(0.1)  # ten more polls: nothing repeats
        assert sorted((n.provider, n.kind) for n in seen) == [
            ("aws", "interruption"), ("aws", "rebalance"), ("gcp", "interruption")]

        server.clear()  # gone, then back: reported again
        await asyncio.sleep(0.05)
        server.arm("aws", "interruption", deadline)
        await eventually(lambda: len(seen) == 4)
        assert seen[-1].kind == "interruption" and seen[-1].deadline == pytest.approx(deadline, abs=1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


class Flaky:
    """Fails every other poll; otherwise shows the same notice."""

    def __init__(self) -> None:
        self.calls = 0

    async def poll(self) -> Notice | None:
        self.calls += 1
        if self.calls % 2 == 0:
            raise MetadataError("endpoint hiccup")
        return Notice(provider="aws", kind="interruption", deadline=123.0, id="aws:x")


async def test_watch_survives_failing_sources_without_repeating() -> None:
    flaky = Flaky()
    stop = asyncio.Event()
    seen: list[Notice] = []

    async def consume() -> None:
        async for notice in watch([flaky], 0.005, stop=stop):
            seen.append(notice)

    task = asyncio.create_task(consume())
    await eventually(lambda: flaky.calls >= 8)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [n.id for n in seen] == ["aws:x"]
