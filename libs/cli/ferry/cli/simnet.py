"""The simulated nodes' own networks in `ferry up`: each node's bridge for its jobs lives in a
network namespace of the node's, and the nodes reach each other and the host over one bridge.

    host: bridge fb<tag> 10.87.K.1/24  (the "outside" of the cluster)
      node-i netns ferry-<tag>-<node>:  up0 10.87.K.(10+i)/24, default via 10.87.K.1
                                        ferry0 (made by the node's service: its jobs' bridge)

The node services stay on the host's loopback (NATS and the API need no TLS there); only their
jobs' traffic crosses these links. A node's service gets the namespace (FERRY_NODE_NETNS) and its
up0 address (FERRY_NET_IP, where the other nodes route its jobs). Without root or iproute2 there
are no such namespaces: the nodes then say they have no job network (``NO_NETNS``), and bridge
jobs are refused a place.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from ferry.criu import netcmd

__all__ = ["NO_NETNS", "SimNetwork"]

NO_NETNS = "none"  # FERRY_NODE_NETNS of a node that has no network namespace of its own
_NETNS_DIR = Path("/run/netns")


class SimNetwork:
    def __init__(self, data_dir: Path, nodes: list[str]) -> None:
        self.tag = hashlib.sha256(str(data_dir).encode()).hexdigest()[:4]
        self.k = int(self.tag, 16) % 200 + 20
        self.bridge = f"fb{self.tag}"
        self.nodes = list(nodes)
        self.index = {node: i for i, node in enumerate(self.nodes, start=1)}  # a node keeps its number
        self.made: list[str] = []
        self.error: str | None = None

    def netns(self, node: str) -> str:
        return f"ferry-{self.tag}-{node}"[:64]

    def node_ip(self, i: int) -> str:
        return f"10.87.{self.k}.{10 + i}"

    @property
    def host_ip(self) -> str:
        """The host's address on the nodes' link: what a job reaches as "the outside"."""
        return f"10.87.{self.k}.1"

    def env(self, node: str) -> dict[str, str]:
        if self.error is not None or node not in self.made:
            return {"FERRY_NODE_NETNS": NO_NETNS}
        return {"FERRY_NODE_NETNS": str(_NETNS_DIR / self.netns(node)),
                "FERRY_NET_IP": self.node_ip(self.index[node])}

    def _ip(self, *args: str) -> None:
        netcmd.run(["ip", *args])

    def create(self) -> str | None:
        """Makes the namespaces and links; the reason when it cannot (then nodes have no job network)."""
        if os.geteuid() != 0:
            self.error = "bridge networks need root (ferry up runs the nodes' namespaces)"
            return self.error
        try:
            self.remove()  # what a killed run left
            self.k = self._free_subnet()
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for node in self.nodes:
                self._attach(node)
        except OSError as exc:
            self.error = f"the simulated nodes' networks: {exc}"
            self.remove()
            return self.error
        return None

    def _attach(self, node: str) -> None:
        i = self.index[node]
        ns, outer = self.netns(node), self.outer(i)
        self._ip("netns", "add", ns)
        self.made.append(node)
        self._ip("-n", ns, "link", "set", "lo", "up")
        self._ip("link", "add", outer, "type", "veth", "peer", "name", "up0", "netns", ns)
        self._ip("link", "set", outer, "master", self.bridge, "up")
        self._ip("-n", ns, "addr", "add", f"{self.node_ip(i)}/24", "dev", "up0")
        self._ip("-n", ns, "link", "set", "up0", "up")
        self._ip("-n", ns, "route", "add", "default", "via", self.host_ip)

    def add(self, node: str) -> str | None:
        """A node that joins later (the local provider launched it): its namespace and link, under
        a number no other node had; the reason when it cannot have them."""
        self.nodes.append(node)
        self.index[node] = max(self.index.values(), default=0) + 1
        if self.error is not None:
            return self.error
        if self.index[node] > 240:
            return "no address left on the nodes' link"
        try:
            self._attach(node)
        except OSError as exc:
            self._detach(node)
            return f"the network of node {node}: {exc}"
        return None

    def drop(self, node: str) -> None:
        """A node that leaves: its namespace and link go. Never raises."""
        self._detach(node)
        with contextlib.suppress(ValueError):
            self.nodes.remove(node)

    def _detach(self, node: str) -> None:
        with contextlib.suppress(OSError):
            self._ip("netns", "del", self.netns(node))
        with contextlib.suppress(OSError):  # gone with the namespace, unless something still holds it
            self._ip("link", "del", self.outer(self.index[node]))
        with contextlib.suppress(ValueError):
            self.made.remove(node)

    def outer(self, i: int) -> str:
        return f"{self.bridge}n{i}"[:15]

    def _free_subnet(self) -> int:
        """The first 10.87.K.0/24, from the tag's, that no address of the host is in (another
        cluster's, on the same machine)."""
        out = netcmd.run(["ip", "-4", "-o", "addr", "show"], check=False)
        used = {int(word.split(".")[2]) for word in out.split() if word.startswith("10.87.") and word.count(".") == 3}
        for step in range(200):
            k = (self.k - 20 + step) % 200 + 20
            if k not in used:
                return k
        raise OSError("every 10.87.K.0/24 is in use on this machine")

    def remove(self) -> None:
        """Deletes the namespaces (their links and jobs' veths with them) and the bridge. Never raises."""
        for node in self.nodes:
            self._detach(node)
        with contextlib.suppress(OSError):
            self._ip("link", "del", self.bridge)
        self.made.clear()
