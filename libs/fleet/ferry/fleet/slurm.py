"""The ``slurm`` provider: SLURM's power saving, driven by Ferry.

A SLURM cluster with power saving (``SuspendProgram``, ``ResumeProgram`` and nodes that may be
powered down, such as ``State=CLOUD`` ones) already knows how to start and stop its machines; Ferry
decides when. Each instance type of the configuration names its SLURM nodes (``group``: a host
list, ``gpu-[1-8]``).

- A launch picks one of the type's nodes that is powered down (SLURM names its nodes: the node
  joins Ferry under that name, which ``launch`` returns), runs ``scontrol update
  nodename=N state=power_up`` (slurmctld runs ResumeProgram) and waits until slurmd has registered
  (the node is no longer powering up). None powered down: ``LaunchRefused``, as a cloud out of
  capacity. A node SLURM marks DOWN while it powers up (ResumeTimeout) is refused too.
- A termination is ``state=power_down``: SLURM powers the node down once it is idle (Ferry has
  moved its own jobs away already), through SuspendProgram.
- ``nodes()`` reads ``scontrol show node``: powered down (or powering down) nodes are terminated
  (terminating), powering up ones launching, the others running (DOWN ones failed).
"""

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from ferry.common.scontrol import Scontrol, SlurmError, SlurmNode
from ferry.fleet.cloud import CloudConfig
from ferry.fleet.provider import InstanceType, LaunchRefused, NodeState, ProvidedNode, ProviderError

T = TypeVar("T")


def node_state(node: SlurmNode) -> NodeState:
    flags = node.flags
    if "POWERED_DOWN" in flags:
        return "terminated"
    if "POWERING_DOWN" in flags or "POWER_DOWN" in flags:
        return "terminating"
    if "POWERING_UP" in flags:
        return "launching"
    if node.state in ("DOWN", "FAIL", "FUTURE") or "NOT_RESPONDING" in flags:
        return "failed"
    return "running"


class SlurmProvider:
    name = "slurm"

    def __init__(self, config: CloudConfig, scontrol: Scontrol | None = None) -> None:
        self.config = config
        self.scontrol = scontrol or Scontrol()
        self.hosts: dict[str, list[str]] = {}  # a type's group -> its node names
        self.reserved: set[str] = set()  # being powered up by this process

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except SlurmError as exc:
            raise ProviderError(f"SLURM: {exc}") from exc

    async def _group(self, group: str) -> list[str]:
        if group not in self.hosts:
            self.hosts[group] = await self._run(self.scontrol.hostnames, group)
        return self.hosts[group]

    async def instance_types(self) -> list[InstanceType]:
        return self.config.offers()

    async def _states(self) -> dict[str, SlurmNode]:
        nodes: list[SlurmNode] = await self._run(self.scontrol.nodes)
        return {n.name: n for n in nodes}

    async def _types_of(self) -> dict[str, InstanceType]:
        """node name -> the offer it is a node of."""
        out = {}
        for spec, offer in zip(self.config.types, self.config.offers(), strict=True):
            for host in await self._group(spec.group) if spec.group else []:
                out[host] = offer
        return out

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        spec = self.config.spec(offer)
        if not spec.group:
            raise ProviderError(f"instance type {offer.key} names no SLURM nodes: set its group (a host list)")
        hosts = await self._group(spec.group)
        states = await self._states()
        free = [h for h in hosts if h in states and node_state(states[h]) == "terminated" and h not in self.reserved]
        if not free:
            raise LaunchRefused(f"SLURM: none of the {len(hosts)} nodes of {spec.group} is powered down")
        host = free[0]
        self.reserved.add(host)
        try:
            await self._run(self.scontrol.power, host, True)
            deadline = time.monotonic() + self.config.timeout_s
            while time.monotonic() < deadline:
                await asyncio.sleep(self.config.poll_s)
                node = (await self._states()).get(host)
                state = node_state(node) if node is not None else "failed"
                if state == "running":
                    return ProvidedNode(id=host, instance_type=offer.name, zone=offer.zone, spot=offer.spot,
                                        state="running")
                if state == "failed":
                    raise LaunchRefused(f"SLURM: {host} did not come up: {node.reason if node else 'gone'}")
            raise LaunchRefused(f"SLURM: {host} did not come up within {self.config.timeout_s:.0f}s")
        finally:
            self.reserved.discard(host)

    async def terminate(self, node_id: str) -> None:
        await self._run(self.scontrol.power, node_id, False)
        deadline = time.monotonic() + self.config.timeout_s
        while time.monotonic() < deadline:
            node = (await self._states()).get(node_id)
            if node is None or node_state(node) == "terminated":
                return
            await asyncio.sleep(self.config.poll_s)
        raise ProviderError(f"SLURM: {node_id} was not powered down within {self.config.timeout_s:.0f}s")

    async def nodes(self) -> list[ProvidedNode]:
        types, states = await self._types_of(), await self._states()
        return [ProvidedNode(id=host, instance_type=offer.name, zone=offer.zone, spot=offer.spot,
                             state=node_state(states[host]), reason=states[host].reason)
                for host, offer in types.items() if host in states]
