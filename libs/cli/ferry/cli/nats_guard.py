"""What `ferry up` does so that its NATS servers keep answering when the disk fills up.

Two facts about nats-server (2.10 to 2.15, reproduced here): a stream whose write fails with
ENOSPC stays broken ("critical write error") after space is freed, until the server restarts, and
its `/healthz` then reports the stream's write error while `/healthz?js-enabled-only=true` still
says ok. So `ferry up` keeps a reserve file beside the NATS stores (`nats-reserve`, 64 MiB of
allocated blocks); when the disk's free space drops below FULL_BYTES it deletes the reserve, which
gives JetStream room to go on and a restarted server room to recover its streams. A server whose
health names a write error is restarted once there is room again; the servers' health is asked
only from the moment the disk is nearly full or the reserve missing until two minutes after: a
full `/healthz` checks every stream and consumer of the server, work not worth doing every second
when no write can have failed. The reserve is taken back when
there is room for it and HEADROOM_BYTES more. Where JetStream has a volume of its own (the
Kubernetes and Nomad manifests), none of this is needed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import urllib.error
import urllib.request
from enum import Enum
from pathlib import Path

from ferry.node.space import free_bytes

log = logging.getLogger(__name__)

RESERVE_BYTES = 64 << 20
FULL_BYTES = 16 << 20
HEADROOM_BYTES = 64 << 20


class ReserveAction(Enum):
    KEEP = "keep"
    RELEASE = "release"
    TAKE = "take"


def reserve_action(held: bool, free: int, *, size: int = RESERVE_BYTES, full: int = FULL_BYTES,
                   headroom: int = HEADROOM_BYTES) -> ReserveAction:
    """Release the held reserve when the disk is (nearly) full; take it again when it fits with room
    to spare, so that taking it cannot fill the disk itself."""
    if held and free < full:
        return ReserveAction.RELEASE
    if not held and free >= size + headroom:
        return ReserveAction.TAKE
    return ReserveAction.KEEP


def has_write_error(health: dict[str, object]) -> bool:
    """True when a NATS `/healthz` answer says a stream or the store cannot write: the state only a
    restart ends. Other failures (starting, catching up with the cluster) end by themselves."""
    if health.get("status") == "ok":
        return False
    texts = [str(health.get("error", ""))]
    errors = health.get("errors")
    if isinstance(errors, list):
        texts += [str(e.get("error", "")) for e in errors if isinstance(e, dict)]
    return any("write error" in t or "no space left" in t for t in texts)


def server_health(monitor_port: int, timeout: float = 1.0) -> dict[str, object] | None:
    """The server's `/healthz?details=true`, or None when it does not answer."""
    url = f"http://127.0.0.1:{monitor_port}/healthz?details=true"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as e:  # 503 carries the same JSON
        body = e.read()
    except (OSError, ValueError):
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


class DiskReserve:
    """The reserve file: real blocks (posix_fallocate), so deleting it really frees space."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    @property
    def held(self) -> bool:
        return self.path.exists()

    def free(self) -> int:
        return free_bytes(self.path.parent)

    def take(self) -> bool:
        tmp = self.path.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            tmp.replace(self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("could not take the disk reserve %s: %s", self.path, e)
            return False
        return True

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def step(self) -> ReserveAction:
        """Does what reserve_action says for the disk's free space now; returns it."""
        try:
            action = reserve_action(self.held, self.free(), size=self.size)
        except OSError:
            return ReserveAction.KEEP
        if action is ReserveAction.RELEASE:
            self.release()
        elif action is ReserveAction.TAKE and not self.take():
            return ReserveAction.KEEP
        return action
