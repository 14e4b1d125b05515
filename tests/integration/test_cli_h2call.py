"""The CLI's own gRPC client (``ferry.cli.h2call``) against a real grpcio server: answers larger
than HTTP/2's first window, requests larger than a frame, streams read whole or left early,
errors with their status and message, deadlines, threads, and a server that went away."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ferry.cli.client import Client
from ferry.common.errors import FerryError, NotFoundError, UsageError
from ferry.common.ports import free_port
from ferry.v1 import ferry_pb2 as pb

SERVICE = "ferry.v1.FerryAdmin"


def list_nodes(request: pb.ListNodesRequest, context: grpc.ServicerContext) -> pb.ListNodesResponse:
    meta = dict(context.invocation_metadata())
    if meta.get("authorization") != "Bearer t0ken":
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "no token")
    # 3,000 nodes: about 200 KiB, more than HTTP/2's default 64 KiB window
    why = {"why": str(meta.get("x-ferry-reason", ""))}
    return pb.ListNodesResponse(nodes=[pb.Node(id=f"node-{i}", state="ready", labels=why) for i in range(3000)])


def submit(request: pb.SubmitJobRequest, context: grpc.ServicerContext) -> pb.Job:
    if request.name == "slow":
        time.sleep(2)
    if request.name == "missing":
        context.abort(grpc.StatusCode.NOT_FOUND, "no job 'mïssing' (µ)")
    if request.name == "bad":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad 100% input")
    if request.name == "spaced":  # a message ending in a space, as a text-less exception once gave
        context.abort(grpc.StatusCode.UNAVAILABLE, "cannot read r3 in ferry_jobs: ")
    return pb.Job(id="j-1", name=request.name, argv=list(request.argv))


def read_logs(request: pb.ReadLogsRequest, context: grpc.ServicerContext) -> Iterator[pb.LogChunk]:
    for i in range(request.offset or 50):
        yield pb.LogChunk(data=(f"{i}\n" * 1000).encode())
    if request.job == "fails":
        context.abort(grpc.StatusCode.NOT_FOUND, "the job went")


def submit_only() -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    return {"SubmitJob": grpc.unary_unary_rpc_method_handler(submit, pb.SubmitJobRequest.FromString,
                                                              pb.Job.SerializeToString)}


@pytest.fixture
def server() -> Iterator[str]:
    addr = f"127.0.0.1:{free_port()}"
    srv = grpc.server(futures.ThreadPoolExecutor(8))
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "ListNodes": grpc.unary_unary_rpc_method_handler(list_nodes, pb.ListNodesRequest.FromString,
                                                         pb.ListNodesResponse.SerializeToString),
        "SubmitJob": grpc.unary_unary_rpc_method_handler(submit, pb.SubmitJobRequest.FromString,
                                                         pb.Job.SerializeToString),
        "ReadLogs": grpc.unary_stream_rpc_method_handler(read_logs, pb.ReadLogsRequest.FromString,
                                                         pb.LogChunk.SerializeToString),
    }
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    srv.add_insecure_port(addr)
    srv.start()
    try:
        yield addr
    finally:
        srv.stop(None)


def test_calls_streams_and_errors_over_one_connection(server: str) -> None:
    c = Client(server, token="t0ken", reason="checking the client")
    nodes = c.call(c.stub.ListNodes, pb.ListNodesRequest()).nodes
    assert len(nodes) == 3000 and nodes[-1].id == "node-2999" and nodes[0].labels["why"] == "checking the client"
    big = ["x" * 100] * 1000  # about 100 KiB: several frames and more than the first window
    job = c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="big", argv=big))
    assert list(job.argv) == big
    with pytest.raises(NotFoundError, match="no job 'mïssing' \\(µ\\)"):
        c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="missing"))
    with pytest.raises(UsageError, match="bad 100% input"):
        c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="bad"))
    with pytest.raises(FerryError, match=r"cannot read r3 in ferry_jobs:$") as spaced:
        c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="spaced"))  # h2 refused the header: a protocol error
    assert "HTTP/2" not in str(spaced.value)
    chunks = list(c.stream(c.stub.ReadLogs, pb.ReadLogsRequest(job="j")))
    assert len(chunks) == 50 and chunks[49].data.startswith(b"49\n")
    with pytest.raises(NotFoundError, match="the job went"):
        list(c.stream(c.stub.ReadLogs, pb.ReadLogsRequest(job="fails", offset=3)))
    # a stream left early: its connection is not reused mid-call, the next call works
    for chunk in c.stream(c.stub.ReadLogs, pb.ReadLogsRequest(job="j")):
        assert chunk.data.startswith(b"0\n")
        break
    assert c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="after")).name == "after"
    assert len(c.channel._idle) == 1  # the calls took turns on the pool's connections


def test_a_missing_token_and_a_deadline_are_errors(server: str) -> None:
    c = Client(server, token="")
    with pytest.raises(FerryError, match="no token"):
        c.call(c.stub.ListNodes, pb.ListNodesRequest())
    started = time.monotonic()
    with pytest.raises(FerryError, match="Deadline Exceeded"):
        c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="slow"), timeout=0.3)
    assert time.monotonic() - started < 1.5
    assert c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="next")).name == "next"


def test_threads_each_get_a_connection(server: str) -> None:
    c = Client(server, token="t0ken")
    got: list[int] = []

    def work() -> None:
        for _ in range(5):
            got.append(len(c.call(c.stub.ListNodes, pb.ListNodesRequest()).nodes))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [3000] * 20


def test_an_api_that_is_not_there_or_went_away() -> None:
    with pytest.raises(FerryError, match=r"cannot reach the Ferry API at 127\.0\.0\.1:1: is `ferry up` running"):
        Client("127.0.0.1:1")
    with pytest.raises(UsageError, match="not on this machine"):
        Client("192.0.2.1:7070")
    addr = f"127.0.0.1:{free_port()}"
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, submit_only()),))
    srv.add_insecure_port(addr)
    srv.start()
    c = Client(addr)
    assert c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="one")).name == "one"
    srv.stop(None).wait()
    with pytest.raises(FerryError, match="unavailable"):
        c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="two"))
    again = grpc.server(futures.ThreadPoolExecutor(2))
    again.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, submit_only()),))
    again.add_insecure_port(addr)
    again.start()
    try:  # the same client reconnects once the API is back
        assert c.call(c.stub.SubmitJob, pb.SubmitJobRequest(name="three")).name == "three"
    finally:
        again.stop(None)
