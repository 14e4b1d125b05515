"""The health service: watches node heartbeats and marks a silent node `lost`.

It only reads heartbeats and writes node states; what to do about a lost node (failover) is the
scheduler's decision.
"""

import asyncio
import contextlib
import logging

from ferry.common.models import Event, NodeState, now
from ferry.common.service import Service, service_main

log = logging.getLogger(__name__)


class Health(Service):
    """Detects lost nodes from their heartbeats."""

    name = "health"

    async def start(self) -> None:
        await self.connect()

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.sweep()
            except Exception:
                log.exception("health sweep failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_interval_s)

    async def sweep(self) -> None:
        assert self.bus is not None
        for key in await self.bus.nodes.keys():
            found = await self.bus.nodes.get_rev(key)
            if found is None:
                continue
            node, rev = found
            silent = now() - node.heartbeat
            if node.state != NodeState.LOST and silent > self.settings.heartbeat_timeout_s:
                node.state = NodeState.LOST
                node.preemptions += 1  # a loss counts against the node's reliability, like a notice
                with contextlib.suppress(Exception):  # the node beat meanwhile: it is alive after all
                    await self.bus.nodes.update(key, node, rev)
                    log.warning("node %s lost: no heartbeat for %.1fs", node.id, silent)
                    await self.bus.publish(f"ferry.evt.cluster.node_lost.{node.id}",
                                           Event(kind="node_lost", node=node.id,
                                                 message=f"no heartbeat for {silent:.1f}s"))


def main() -> None:
    service_main(Health)


if __name__ == "__main__":
    main()
