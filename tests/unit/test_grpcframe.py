"""gRPC's wire format as the CLI's own client reads and writes it (``ferry.cli.grpcframe``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferry.cli.grpcframe import (
    MessageReader,
    RpcFailure,
    Status,
    encode_timeout,
    frame,
    http_error,
    percent_decode,
    status_of,
)


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_messages_come_out_whole_however_the_bytes_are_cut(messages: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(frame(m) for m in messages)
    reader, out, pos, i = MessageReader(), [], 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        out += list(reader.feed(wire[pos : pos + step]))
        pos, i = pos + step, i + 1
    assert out == messages and reader.pending == 0


def test_a_message_cut_short_is_pending_and_oversized_or_compressed_ones_fail() -> None:
    reader = MessageReader(limit=10)
    assert list(reader.feed(frame(b"12345")[:7])) == [] and reader.pending == 7
    with pytest.raises(RpcFailure) as err:
        list(MessageReader(limit=10).feed(frame(b"x" * 11)))
    assert err.value.code() == Status.RESOURCE_EXHAUSTED
    with pytest.raises(RpcFailure) as err:
        list(MessageReader().feed(b"\x01\x00\x00\x00\x01x"))
    assert err.value.code() == Status.INTERNAL


@pytest.mark.parametrize(("seconds", "header"), [(0.0001, "1m"), (0.3, "300m"), (5, "5000m"), (200_000, "200000S")])
def test_timeouts_fit_in_eight_digits(seconds: float, header: str) -> None:
    assert encode_timeout(seconds) == header


@pytest.mark.parametrize(("raw", "text"), [("plain", "plain"), ("no job 'm%C3%AFssing'", "no job 'mïssing'"),
                                          ("100%25 sure", "100% sure"), ("50% off", "50% off"), ("end %4", "end %4")])
def test_grpc_message_is_percent_decoded_and_stray_percents_stay(raw: str, text: str) -> None:
    assert percent_decode(raw) == text


def test_the_end_of_a_call_is_its_grpc_status_or_its_http_status() -> None:
    assert status_of([(":status", "200"), ("grpc-status", "0")]) is None
    failure = status_of([("grpc-status", "5"), ("grpc-message", "no%20job")])
    assert failure is not None and (failure.code(), failure.details()) == (Status.NOT_FOUND, "no job")
    spaced = status_of([("grpc-status", "14 "), ("grpc-message", "cannot read r3: ")])  # trimmed, as grpcio does
    assert spaced is not None and (spaced.code(), spaced.details()) == (Status.UNAVAILABLE, "cannot read r3:")
    odd = status_of([("grpc-status", "99")])
    assert odd is not None and odd.code() == Status.UNKNOWN
    proxy = status_of([(":status", "503")])
    assert proxy is not None and proxy.code() == Status.UNAVAILABLE
    missing = status_of([(":status", "200")])
    assert missing is not None and missing.code() == Status.INTERNAL
    assert http_error([(":status", "200"), ("content-type", "application/grpc+proto")]) is None
    html = http_error([(":status", "200"), ("content-type", "text/html")])
    assert html is not None and "not gRPC" in html.details()
    denied = http_error([(":status", "403")])
    assert denied is not None and denied.code() == Status.PERMISSION_DENIED
