"""Fuzzing every request message of the admin API (hypothesis) against a real API and scheduler
on a real nats-server: whatever a client sends, the answer is a result or a deliberate status
(bad input, not found, refused...), never UNKNOWN or INTERNAL (an error nobody handled), and the
API keeps answering. Messages are built from the proto's own descriptors, so a new field or RPC is
fuzzed without touching this file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.common.ports import free_port
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as pb_grpc
from tests.conftest import make_secrets

DELIBERATE = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
              grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS,
              grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OUT_OF_RANGE}
SERVICE = pb.DESCRIPTOR.services_by_name["FerryAdmin"]
T = FieldDescriptor

words = st.sampled_from(["", "t1", "node-1", "job-x", "ck-1", "..", "a.b", "*", ">", "-", "x" * 300, "\0", "é",
                         "stdout", "kill-node", "spot-notice", "fail-live-round", "/tmp", "1h"])
texts = words | st.text(max_size=40)
SCALARS: dict[int, Any] = {
    T.TYPE_STRING: texts,
    T.TYPE_BOOL: st.booleans(),
    T.TYPE_DOUBLE: st.floats() | st.sampled_from([0.0, -1.0, 1e308, 0.001]),
    T.TYPE_FLOAT: st.floats(width=32),
    T.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    T.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    T.TYPE_UINT32: st.integers(0, 2**32 - 1),
    T.TYPE_UINT64: st.integers(0, 2**64 - 1),
    T.TYPE_BYTES: st.binary(max_size=32),
}


def message_of(cls: type[Message], depth: int = 0) -> st.SearchStrategy[Message]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in cls.DESCRIPTOR.fields:
        if field.type == T.TYPE_MESSAGE:
            assert field.message_type is not None
            if field.message_type.GetOptions().map_entry:
                fields[field.name] = st.dictionaries(texts, texts, max_size=3)
            elif depth < 2:
                sub = getattr(pb, field.message_type.name)
                inner = message_of(sub, depth + 1)
                fields[field.name] = st.lists(inner, max_size=2) if field.is_repeated else inner
            continue
        if field.type == T.TYPE_ENUM:
            continue
        value = SCALARS[field.type]
        fields[field.name] = st.lists(value, max_size=4) if field.is_repeated else value

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, value in values.items():
            target = getattr(msg, name)
            if isinstance(value, dict):
                target.update(value)
            elif isinstance(value, list):
                if value and isinstance(value[0], Message):
                    for item in value:
                        target.add().CopyFrom(item)
                else:
                    target.extend(value)
            elif isinstance(value, Message):
                target.CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries({}, optional=fields).map(build)


@pytest.fixture(scope="module")
def api_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The scheduler and the API as their own processes, as `ferry up` runs them (no node: a
    submitted job stays pending, so nothing a fuzzed request asks for ever runs)."""
    from tests.conftest import start_nats

    tmp = tmp_path_factory.mktemp("fuzz")
    proc, url = start_nats(tmp / "nats")
    make_secrets(tmp)
    addr = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "FERRY_NATS_URL": url, "FERRY_DATA_DIR": str(tmp), "FERRY_ADDR": addr,
           "FERRY_API_TIMEOUT_S": "3", "FERRY_HEARTBEAT_INTERVAL_S": "0.3"}
    env.pop("FERRY_TOKEN", None)
    logs = [(tmp / f"{name}.log").open("wb") for name in ("scheduler", "api")]
    children = [subprocess.Popen([sys.executable, "-m", f"ferry.{name}"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=log) for name, log in zip(("scheduler", "api"), logs, strict=True)]
    try:
        with grpc.insecure_channel(addr) as channel:
            grpc.channel_ready_future(channel).result(timeout=40)
        yield addr
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=30)
        proc.terminate()
        proc.wait(timeout=10)
        for log in logs:
            log.close()


def call(channel: grpc.Channel, method: MethodDescriptor, request: Message) -> grpc.StatusCode:
    path = f"/{SERVICE.full_name}/{method.name}"
    response_cls = getattr(pb, method.output_type.name)
    try:
        if method.server_streaming:
            stream: Any = channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                          response_deserializer=response_cls.FromString)
            for _ in stream(request, timeout=2):
                pass
        else:
            unary: Any = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_cls.FromString)
            unary(request, timeout=4)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", list(SERVICE.methods), ids=lambda m: m.name)
def test_every_request_gets_a_deliberate_answer(api_addr: str, method: MethodDescriptor) -> None:
    request_cls = getattr(pb, method.input_type.name)
    with grpc.insecure_channel(api_addr) as channel:

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(message_of(request_cls))
        def fuzz(request: Message) -> None:
            code = call(channel, method, request)
            assert code == grpc.StatusCode.OK or code in DELIBERATE, (method.name, request, code)

        fuzz()
        assert call(channel, SERVICE.methods_by_name["ListNodes"], pb.ListNodesRequest()) == grpc.StatusCode.OK


def test_the_stub_covers_every_rpc() -> None:
    assert {m.name for m in SERVICE.methods} <= set(dir(pb_grpc.FerryAdminServicer))
