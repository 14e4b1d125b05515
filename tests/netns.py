"""Two "nodes" on one machine for the live-move network tests: network namespaces joined by veths.

    host (the client)                               the service address VIP (10.77.K.1/32) is on
      hs<tag> 10.78.K.1/30 ---- up0 10.78.K.2  [src]  lo in both nodes; the host routes it to the
      hd<tag> 10.78.K.5/30 ---- up0 10.78.K.6  [dst]  node that serves it (``route_vip_to``)
                         [src] peer0 10.79.K.1 ---- peer0 10.79.K.2 [dst]   the nodes' own link

The nodes reach each other over ``peer0`` (CRIU's page server: no forwarding on the host) and the
host reaches the source's end of it through ``hs<tag>`` (to abort a page server nobody took). A
command runs in a node through a wrapper script (``nsenter --net``, which enters the network
namespace only: ``ip netns exec`` would also give it a mount namespace of its own, which CRIU
would then have to dump).

Everything is named after a random tag, and ``Nodes.remove()`` kills whatever still runs in the
two namespaces, deletes them (and with them their veths and the host's routes through them).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ferry.criu import netcmd

__all__ = ["IP", "NSENTER", "Node", "Nodes", "missing_tools"]

IP = "ip"
NSENTER = "nsenter"
_NETNS_DIR = Path("/run/netns")


def missing_tools() -> list[str]:
    """The commands these tests need that are not on PATH (or in sbin)."""
    return [name for name in (IP, NSENTER)
            if shutil.which(name) is None and shutil.which(name, path=netcmd.SBIN_PATH) is None]


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """`ip [-n NETNS] ARGS` (ferry.criu.netcmd: OSError when it fails and `check`); what it printed."""
    return netcmd.run([IP, *(["-n", netns] if netns else []), *args], check=check)


@dataclass(frozen=True)
class Node:
    """One node: its network namespace, its link to the host, its address on the nodes' link."""

    netns: str
    host_if: str
    host_ip: str
    """The host's end of the link to this node."""
    ip: str
    """This node's end of the link to the host."""
    peer_ip: str
    """This node's address on the link between the two nodes."""

    @property
    def path(self) -> Path:
        return _NETNS_DIR / self.netns

    def inode(self) -> int:
        """The namespace's identity: compare with ``os.stat(f"/proc/{pid}/ns/net").st_ino``."""
        return os.stat(self.path).st_ino

    def wrapper(self, directory: Path, exe: str, env: Mapping[str, str] | None = None) -> Path:
        """A script that runs ``exe`` with the caller's arguments inside this node's namespace
        (with ``env`` added to the environment)."""
        script = directory / f"{Path(exe).name}-in-{self.netns}"
        assign = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
        command = f"exec {shlex.quote(netcmd.tool(NSENTER))} --net={shlex.quote(str(self.path))} -- {shlex.quote(exe)}"
        script.write_text(f'#!/bin/sh\n{assign}{command} "$@"\n')
        script.chmod(0o755)
        return script

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.netns, check=False)
        return [int(word) for word in out.split() if word.isdigit()]


class Nodes:
    """Two nodes, ``src`` and ``dst``, that both carry the service address ``vip``."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or secrets.token_hex(3)
        k = int(self.tag, 16) % 250 + 1
        self.vip = f"10.77.{k}.1"
        self.src = Node(f"ferry-src-{self.tag}", f"hs{self.tag}", f"10.78.{k}.1", f"10.78.{k}.2", f"10.79.{k}.1")
        self.dst = Node(f"ferry-dst-{self.tag}", f"hd{self.tag}", f"10.78.{k}.5", f"10.78.{k}.6", f"10.79.{k}.2")
        self._created: list[Node] = []

    @property
    def client_ip(self) -> str:
        """The host's address that a client of the service uses (it stays when the service moves)."""
        return self.src.host_ip

    def create(self) -> Nodes:
        try:
            for node in (self.src, self.dst):
                ip("netns", "add", node.netns)
                self._created.append(node)
                ip("link", "set", "lo", "up", netns=node.netns)
                ip("link", "add", node.host_if, "type", "veth", "peer", "name", "up0", "netns", node.netns)
                ip("addr", "add", f"{node.host_ip}/30", "dev", node.host_if)
                ip("link", "set", node.host_if, "up")
                ip("addr", "add", f"{node.ip}/30", "dev", "up0", netns=node.netns)
                ip("link", "set", "up0", "up", netns=node.netns)
                ip("route", "add", "default", "via", node.host_ip, netns=node.netns)
                ip("addr", "add", f"{self.vip}/32", "dev", "lo", netns=node.netns)
            ip("link", "add", "peer0", "netns", self.src.netns, "type", "veth", "peer", "name", "peer0", "netns",
               self.dst.netns)
            for node in (self.src, self.dst):
                ip("addr", "add", f"{node.peer_ip}/30", "dev", "peer0", netns=node.netns)
                ip("link", "set", "peer0", "up", netns=node.netns)
            ip("route", "add", f"{self.src.peer_ip}/32", "via", self.src.ip, "dev", self.src.host_if)
            self.route_vip_to(self.src)
        except BaseException:
            self.remove()
            raise
        return self

    def route_vip_to(self, node: Node) -> None:
        """The host sends the service's traffic to ``node`` (the service address moves)."""
        ip("route", "replace", f"{self.vip}/32", "via", node.ip, "dev", node.host_if)

    def drop_vip(self, node: Node) -> None:
        """``node`` no longer has the service address: what comes for it there is dropped (no RST),
        and a socket bound to it there can send nothing (no route from a source that is not local)."""
        ip("addr", "del", f"{self.vip}/32", "dev", "lo", netns=node.netns)

    def add_vip(self, node: Node) -> None:
        ip("addr", "add", f"{self.vip}/32", "dev", "lo", netns=node.netns)

    def remove(self) -> None:
        """Kill what runs in the namespaces, delete them with their links. Never raises."""
        for node in self._created:
            for _ in range(50):
                pids = node.pids()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
        for node in self._created:
            with contextlib.suppress(Exception):
                ip("netns", "del", node.netns, check=False)
            with contextlib.suppress(Exception):
                ip("link", "del", node.host_if, check=False)  # gone with the namespace; just in case
        with contextlib.suppress(Exception):
            ip("route", "del", f"{self.vip}/32", check=False)
        with contextlib.suppress(Exception):
            ip("route", "del", f"{self.src.peer_ip}/32", check=False)
        self._created.clear()

    def __enter__(self) -> Nodes:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()
