"""The lifecycle every Ferry service shares: start, ready, drain on SIGTERM, close.

A service subclasses `Service`, implements `start` (connect, load state) and `run` (its loops, which
return once `self.stopping` is set), and optionally `drain` and `close`. `service_main` gives it a
command line with `--config` and `--check` (exit 0 when the service is alive and ready, else 1).
"""

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from ferry.common.bus import Bus
from ferry.common.config import Settings, load_settings
from ferry.common.errors import FerryError
from ferry.common.models import ServiceBeat
from ferry.common.tracing import setup_tracing

log = logging.getLogger(__name__)


class Service(ABC):
    name: str = "service"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.bus: Bus | None = None

    @property
    def instance(self) -> str:
        return self.settings.node_id or socket.gethostname()

    @property
    def beat_key(self) -> str:
        return f"{self.name}.{self.instance}"

    async def connect(self) -> Bus:
        self.bus = await Bus.connect(self.settings.nats_url, f"ferry-{self.name}-{self.instance}",
                                     replicas=self.settings.nats_replicas)
        return self.bus

    @abstractmethod
    async def start(self) -> None:
        """Connects and loads state; returns when the service can take work."""

    @abstractmethod
    async def run(self) -> None:
        """Serves until `self.stopping` is set, then returns."""

    async def drain(self) -> None:
        """Finishes or hands back in-flight work (called after `stopping` is set)."""

    async def close(self) -> None:
        if self.bus is not None:
            with contextlib.suppress(Exception):
                await self.bus.services.delete(self.beat_key)
            await self.bus.close()

    async def _beat(self) -> None:
        assert self.bus is not None
        while not self.stopping.is_set():
            beat = ServiceBeat(service=self.name, instance=self.instance, pid=os.getpid(), ready=True)
            with contextlib.suppress(Exception):
                await self.bus.services.put(self.beat_key, beat)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_interval_s)

    async def serve(self) -> None:
        """The whole lifecycle; SIGTERM or SIGINT starts the drain."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.start()
        self.ready.set()
        beat = asyncio.create_task(self._beat())
        log.info("%s %s ready", self.name, self.instance)
        try:
            await self.run()
        finally:
            self.stopping.set()
            try:
                await asyncio.wait_for(self.drain(), self.settings.drain_timeout_s)
            except TimeoutError:
                log.warning("%s: drain timed out after %ss", self.name, self.settings.drain_timeout_s)
            beat.cancel()
            await self.close()
            log.info("%s %s stopped", self.name, self.instance)


async def check(settings: Settings, service: str) -> bool:
    """True when `service` on this instance has beaten recently."""
    bus = await Bus.connect(settings.nats_url, f"ferry-check-{service}", connect_timeout=3,
                            replicas=settings.nats_replicas)
    try:
        instance = settings.node_id or socket.gethostname()
        beat = await bus.services.get(f"{service}.{instance}")
        return bool(beat and beat.ready and time.time() - beat.time < 3 * settings.heartbeat_interval_s + 2)
    finally:
        await bus.close()


def service_main(cls: type[Service], argv: Sequence[str] | None = None, *, node: bool = False) -> None:
    parser = argparse.ArgumentParser(prog=f"ferry-{cls.name}", description=(cls.__doc__ or "").strip())
    parser.add_argument("--config", help="YAML settings file (else FERRY_CONFIG); FERRY_* variables win")
    parser.add_argument("--check", action="store_true", help="exit 0 if the service is alive and ready")
    parser.add_argument("--nats", dest="nats_url", help="NATS URL (FERRY_NATS_URL)")
    parser.add_argument("--data-dir", help="data directory (FERRY_DATA_DIR)")
    parser.add_argument("--store", dest="store_url", help="checkpoint store URL (FERRY_STORE_URL)")
    if node:
        parser.add_argument("--node", dest="node_id", help="this node's id (FERRY_NODE_ID)")
        parser.add_argument("--work-dir", help="node work directory (FERRY_WORK_DIR)")
    if cls.name == "api":
        parser.add_argument("--grpc", dest="addr", help="HOST:PORT to serve the admin API on (FERRY_ADDR)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "check")}
    try:
        settings = load_settings(args.config, **overrides)
    except FerryError as exc:
        print(f"ferry-{cls.name}: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from exc
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s {cls.name}[{settings.node_id or '-'}] %(levelname)s %(name)s: %(message)s",
    )
    if args.check:
        try:
            ok = asyncio.run(check(settings, cls.name))
        except FerryError as exc:
            print(f"ferry-{cls.name}: {exc}", file=sys.stderr)
            ok = False
        raise SystemExit(0 if ok else 1)
    setup_tracing(cls.name, settings)
    try:
        asyncio.run(cls(settings).serve())
    except FerryError as exc:
        print(f"ferry-{cls.name}: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from exc
