"""``python -m ferry.controller``: the Kubernetes controller (one per cluster), and
``python -m ferry.controller.podagent --node NODE``: the node agent (a DaemonSet).

Both are Ferry services (start, ready, bounded drain on SIGTERM, close; a beat on the bus for
``--check``) that talk to Kubernetes through ``KubeApi``: the controller runs a reconcile pass
(``ferry.controller.controller``) whenever a watch sees a change and at least every 30 s (for
time-based decisions); the agent carries out its node's pending FerryCheckpoint requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ferry.common import wire
from ferry.common.config import Settings
from ferry.common.models import Event
from ferry.common.service import Service, service_main
from ferry.controller import agent, controller
from ferry.controller.api import KubeApi
from ferry.kube.cri import CriClient
from ferry.store.store import CheckpointStore
from ferry.store.url import open_store

log = logging.getLogger(__name__)


class _KubeService(Service):
    interval_s = 30.0  # a pass at least this often (time-based decisions); a watch wakes it sooner

    def __init__(self, settings: Settings, api: KubeApi | None = None, store: CheckpointStore | None = None) -> None:
        super().__init__(settings)
        self.api = api
        self.store = store
        self.wake = asyncio.Event()
        self.following: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.connect()
        if self.api is None:
            from ferry.controller.kubeclient import KubeClient

            self.api = await KubeClient.connect(self.settings.kubeconfig)
        if self.store is None:
            self.store = open_store(self.settings.resolved_store_url(), self.settings.resolved_store_key_file())
        self.following = self.spawn(self._follow())

    async def drain(self) -> None:
        if self.following is not None:  # the watches end with the service: nothing to finish there
            self.following.cancel()

    async def _follow(self) -> None:
        assert self.api is not None
        with contextlib.suppress(asyncio.CancelledError):
            async for _ in self.api.changes():
                self.wake.set()
                if self.stopping.is_set():
                    return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._either(), seconds)
        self.wake.clear()

    async def _either(self) -> None:
        waits = [asyncio.create_task(self.wake.wait()), asyncio.create_task(self.stopping.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


class ControllerService(_KubeService):
    """Ferry's Kubernetes controller: checkpoints, events and replacement pods for opted-in pods."""

    name = "controller"

    async def run(self) -> None:
        assert self.api is not None
        noted: set[tuple[str, str, str, int, str]] = set()
        while not self.stopping.is_set():
            try:
                now = time.time()
                actions = await controller.decide(self.api, now)
                for action in await controller.carry_out(self.api, self.store, actions, now, noted):
                    if self.bus is not None:
                        with contextlib.suppress(Exception):
                            await self.bus.publish(wire.cluster_event_subject("kube", action.kind),
                                                   Event(kind=f"kube_{action.kind}", message=action.model_dump_json()))
            except Exception:
                log.exception("reconcile pass failed; next pass soon")
            await self._sleep(self.interval_s)


class PodAgentService(_KubeService):
    """Ferry's node agent under Kubernetes: its node's FerryCheckpoint requests, through containerd."""

    name = "podagent"

    async def run(self) -> None:
        assert self.api is not None and self.store is not None
        node = self.settings.node_id
        work = Path(tempfile.mkdtemp(prefix="ferry-podagent-", dir=self.settings.data_dir
                                     if self.settings.data_dir.is_dir() else None))
        async with CriClient(self.settings.cri_endpoint) as cri:
            while not self.stopping.is_set():
                try:
                    for request in agent.pending_for(await self.api.list("ferrycheckpoints"), node):
                        await agent.carry_out(self.api, cri, self.store, request, work)
                except Exception:
                    log.exception("agent pass failed; next pass soon")
                await self._sleep(self.interval_s)


def main(argv: Sequence[str] | None = None) -> None:
    service_main(ControllerService, argv)


def agent_main(argv: Sequence[str] | None = None) -> None:
    service_main(PodAgentService, argv, node=True)
