"""TCP ports: one that is free now, and the one a nats-server picked itself.

Where a server can pick its own port, let it (``nats-server -p -1 --ports_file_dir D``, then
``nats_url``): nothing can take the port between the pick and the listen. ``free_port`` is for
what must be named before it starts (CRIU's page server refuses ``--port 0``; a NATS cluster's
routes and a restarted server keep their ports so that clients reconnect to the same address).
"""

import json
import socket
import time
from pathlib import Path

from ferry.common.errors import FerryError


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` now."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def nats_url(ports_dir: Path, pid: int, timeout_s: float = 15.0) -> str:
    """The client URL of the nats-server `pid` started with ``-p -1 --ports_file_dir ports_dir``,
    once it listens (it writes the ports file then)."""
    deadline = time.monotonic() + timeout_s
    path = ports_dir / f"nats-server_{pid}.ports"
    while True:
        try:
            urls = json.loads(path.read_text()).get("nats") or []
            if urls:
                return str(urls[0])
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise FerryError(f"nats-server (pid {pid}) wrote no ports file in {ports_dir} within {timeout_s:.0f}s")
        time.sleep(0.05)
