"""The full-disk guard of `ferry up`: when to release and take back the reserve, which NATS health
answers call for a restart, and the reserve file itself."""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from ferry.cli.nats_guard import (
    FULL_BYTES,
    HEADROOM_BYTES,
    RESERVE_BYTES,
    DiskReserve,
    ReserveAction,
    has_write_error,
    reserve_action,
    server_health,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    ("held", "free", "expected"),
    [
        (True, FULL_BYTES - 1, ReserveAction.RELEASE),
        (True, 0, ReserveAction.RELEASE),
        (True, FULL_BYTES, ReserveAction.KEEP),
        (False, RESERVE_BYTES + HEADROOM_BYTES - 1, ReserveAction.KEEP),  # taking it would nearly fill the disk
        (False, RESERVE_BYTES + HEADROOM_BYTES, ReserveAction.TAKE),
        (False, 0, ReserveAction.KEEP),
        (True, 10 << 30, ReserveAction.KEEP),
    ],
)
def test_reserve_action(held: bool, free: int, expected: ReserveAction) -> None:
    assert reserve_action(held, free) is expected


def test_release_and_take_do_not_oscillate() -> None:
    """Freed at FULL_BYTES, taken back only with the reserve plus headroom free: after a release the
    free space is about the reserve, which is less than what taking it back needs."""
    free_after_release = FULL_BYTES - 1 + RESERVE_BYTES
    assert reserve_action(False, free_after_release) is ReserveAction.KEEP


# what nats-server 2.15 answers, as seen on a full tmpfs
BROKEN = {"status": "unavailable",
          "error": "JetStream stream '$G > S' write error: write /x/1.blk: no space left on device"}
BROKEN_DETAILS = {"status": "error", "errors": [
    {"type": "STREAM", "account": "$G", "stream": "S",
     "error": "JetStream stream '$G > S' write error: write /x/1.blk: no space left on device"}]}
CATCHING_UP = {"status": "unavailable", "error": "JetStream stream '$G > S' is not current"}


@pytest.mark.parametrize(("health", "broken"), [
    ({"status": "ok"}, False), (BROKEN, True), (BROKEN_DETAILS, True), (CATCHING_UP, False),
    ({"status": "unavailable", "error": "JetStream not enabled"}, False), ({}, False),
    ({"status": "error", "errors": ["not a dict"]}, False),
])
def test_has_write_error(health: dict[str, object], broken: bool) -> None:
    assert has_write_error(health) is broken


@pytest.fixture
def health_server() -> Iterator[tuple[int, dict[str, object]]]:
    answer: dict[str, object] = {"code": 200, "body": {"status": "ok"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer["body"] if isinstance(answer["body"], bytes) else json.dumps(answer["body"]).encode()
            self.send_response(int(str(answer["code"])))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], answer
    finally:
        server.shutdown()
        server.server_close()


def test_server_health_reads_ok_and_503_answers(health_server: tuple[int, dict[str, object]]) -> None:
    port, answer = health_server
    assert server_health(port) == {"status": "ok"}
    answer.update(code=503, body=BROKEN)
    assert server_health(port) == BROKEN
    answer.update(code=200, body=b"not json")
    assert server_health(port) is None


def test_server_health_of_nothing_is_none() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert server_health(port, timeout=0.5) is None


def test_the_reserve_holds_real_blocks_and_is_released(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "nats-reserve", size=4 * MiB)
    assert not reserve.path.exists()
    assert reserve.take()
    assert reserve.held and reserve.path.stat().st_blocks * 512 >= 4 * MiB
    assert not list(tmp_path.glob("*.tmp"))
    reserve.release()
    assert not reserve.path.exists()
    reserve.release()  # twice is fine
    assert not reserve.held


def test_step_takes_the_reserve_on_a_roomy_disk(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "nats-reserve", size=MiB)
    assert reserve.step() is ReserveAction.TAKE and reserve.held
    assert reserve.step() is ReserveAction.KEEP and reserve.held


def test_a_reserve_that_cannot_be_taken_is_not_held(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path / "missing" / "nats-reserve", size=MiB)
    assert reserve.take() is False and not reserve.held
