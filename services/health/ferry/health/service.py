"""The health service: watches node heartbeats and marks a silent node `lost`.

It only reads heartbeats and writes node states; what to do about a lost node (failover) is the
scheduler's decision. It tells a dead node from a dead bus: while NATS is down, paused or
restarting, no node can beat, so silence counts only from the moment this service last saw the
bus work again (its start, a reconnect, the end of a sweep that failed or stalled, or a sweep in
which every node, two or more, was silent at once: writes stall while reads answer when a
cluster's stream leader is lost). Nodes thus get a whole heartbeat timeout after an outage to
beat again before anyone is declared lost.

It follows the nodes bucket with a watch (``ferry.common.mirror``) instead of listing it every
sweep: listing makes a consumer each time, which on a loaded machine after a NATS server died
took longer than half a timeout again and again, so that every sweep counted as a stall and a
dead node was never declared lost. A verdict of `lost` is confirmed by one direct read of that
node's record before it is written.
"""

import asyncio
import contextlib
import logging

from ferry.common import wire
from ferry.common.errors import describe
from ferry.common.mirror import Mirror
from ferry.common.models import Event, Node, NodeState, now
from ferry.common.service import Service, service_main

log = logging.getLogger(__name__)


class Health(Service):
    """Detects lost nodes from their heartbeats."""

    name = "health"

    async def start(self) -> None:
        bus = await self.connect()
        self.nodes: Mirror[Node] = Mirror(bus.nodes)
        await self.nodes.start()
        self.bus_back_at = now()  # silence before this is the bus's, not the nodes'
        self.reconnects = self.reconnect_count()

    def reconnect_count(self) -> int:
        assert self.bus is not None
        return int(self.bus.nc.stats.get("reconnects", 0))

    def bus_trouble(self, why: str) -> None:
        log.warning("%s: nodes get %.1fs from now to beat before any is declared lost", why,
                    self.settings.heartbeat_timeout_s)
        self.bus_back_at = now()

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.sweep()
            except Exception as exc:
                self.bus_trouble(f"health sweep failed ({describe(exc)})")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_interval_s)

    async def sweep(self) -> None:
        assert self.bus is not None
        if (count := self.reconnect_count()) != self.reconnects:
            self.reconnects = count
            self.bus_trouble("reconnected to NATS")
        beating = [n for n in self.nodes.values() if n.state != NodeState.LOST]
        if len(beating) >= 2 and all(now() - n.heartbeat > self.settings.heartbeat_timeout_s for n in beating):
            # every node silent at once: their writes stall (a stream leader lost with a NATS
            # server, say), or this service's watch does; the bus, not the nodes
            self.bus_trouble(f"all {len(beating)} nodes went silent at once")
            return
        for seen in beating:
            if now() - max(seen.heartbeat, self.bus_back_at) > self.settings.heartbeat_timeout_s:
                await self.confirm_lost(seen.id)

    async def confirm_lost(self, key: str) -> None:
        """Reads `key` afresh (the watch may lag) and marks it lost if it is still silent."""
        assert self.bus is not None
        started = now()
        found = await self.bus.nodes.get_rev(key)
        if now() - started > self.settings.heartbeat_timeout_s / 2:  # NATS stalled (paused, a full disk)
            self.bus_trouble(f"reading node {key} took {now() - started:.1f}s")
            return
        if found is None:
            return
        node, rev = found
        silent = now() - max(node.heartbeat, self.bus_back_at)
        if node.state == NodeState.LOST or silent <= self.settings.heartbeat_timeout_s:
            return
        node.state = NodeState.LOST
        node.preemptions += 1  # a loss counts against the node's reliability, like a notice
        with contextlib.suppress(Exception):  # the node beat meanwhile: it is alive after all
            await self.bus.nodes.update(key, node, rev)
            log.warning("node %s lost: no heartbeat for %.1fs", node.id, silent)
            await self.bus.publish(wire.cluster_event_subject("node_lost", node.id),
                                   Event(kind="node_lost", node=node.id, message=f"no heartbeat for {silent:.1f}s"))

    async def close(self) -> None:
        if hasattr(self, "nodes"):
            await self.nodes.close()
        await super().close()

def main() -> None:
    service_main(Health)


if __name__ == "__main__":
    main()
