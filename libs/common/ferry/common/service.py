"""The lifecycle every Ferry service shares: start, ready, drain on SIGTERM, close.

A service subclasses `Service`, implements `start` (connect, load state) and `run` (its loops, which
return once `self.stopping` is set), and optionally `drain` and `close`. Work it runs in the
background goes through `spawn`: on SIGTERM, `drain` and those tasks together get
`drain_timeout_s`, then what is left is cancelled (a node command not acked by then goes to the
successor). A loop step that may wait on something slow (a cloud provider's API) runs through
`step_bounded`, which a SIGTERM cuts short after the same timeout. `service_main` gives it a
command line with `--config` and `--check` (exit 0 when the service is alive and ready, else 1); a
service adds its own flags in `add_arguments`.
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
from collections.abc import Coroutine, Sequence
from typing import Any

from ferry.common.bus import Bus
from ferry.common.config import Settings, load_settings
from ferry.common.errors import FerryError
from ferry.common.models import ServiceBeat
from ferry.common.natsauth import read_creds
from ferry.common.tls import nats_tls
from ferry.common.tracing import setup_tracing

log = logging.getLogger(__name__)


class Service(ABC):
    name: str = "service"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        self.bus: Bus | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Flags of this service beyond the common ones (each overrides the setting of its name)."""

    def spawn(self, work: Coroutine[Any, Any, None]) -> "asyncio.Task[None]":
        """Runs `work` in the background, awaited (within the drain timeout) or cancelled on drain."""
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def step_bounded(self, work: Coroutine[Any, Any, None]) -> None:
        """Awaits one step of `run`'s loop; once `stopping` is set the step has `drain_timeout_s`
        left, then it is cancelled, so that a call that hangs never holds a SIGTERM up unbounded."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=self.settings.drain_timeout_s)
            if not task.done():
                log.warning("%s: a step still under way at the drain timeout is cancelled", self.name)
        finally:
            stop.cancel()
            if not task.done():  # timed out, or this wait was cancelled from outside: it stops too
                task.cancel()
                await asyncio.wait({task})
        if not task.cancelled():
            task.result()  # its exception, if any, is the caller's

    async def _finish_tasks(self, deadline: float) -> None:
        pending = set(self.tasks)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%s: cancelled %d background task(s) at the drain timeout", self.name, len(pending))
            await asyncio.gather(*pending, return_exceptions=True)

    @property
    def instance(self) -> str:
        return self.settings.node_id or socket.gethostname()

    @property
    def beat_key(self) -> str:
        return f"{self.name}.{self.instance}"

    async def connect(self) -> Bus:
        creds = read_creds(self.settings.nats_creds) if self.settings.nats_creds else None
        self.bus = await Bus.connect(self.settings.nats_url, f"ferry-{self.name}-{self.instance}",
                                     replicas=self.settings.nats_replicas, creds=creds,
                                     tls=nats_tls(self.settings), create=creds is None or creds.user == "scheduler")
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
            deadline = time.monotonic() + self.settings.drain_timeout_s
            try:
                await asyncio.wait_for(self.drain(), self.settings.drain_timeout_s)
            except TimeoutError:
                log.warning("%s: drain timed out after %ss", self.name, self.settings.drain_timeout_s)
            await self._finish_tasks(deadline)
            beat.cancel()
            await self.close()
            log.info("%s %s stopped", self.name, self.instance)


async def check(settings: Settings, service: str) -> bool:
    """True when `service` on this instance has beaten recently."""
    creds = read_creds(settings.nats_creds) if settings.nats_creds else None
    bus = await Bus.connect(settings.nats_url, f"ferry-check-{service}", connect_timeout=3,
                            replicas=settings.nats_replicas, creds=creds, tls=nats_tls(settings), create=False)
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
    cls.add_arguments(parser)
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
    for chatty in ("httpx", "httpcore"):  # one INFO line per metadata poll, several a second
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
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
