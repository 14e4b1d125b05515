"""A node's side of the bridge network (``ferry.common.jobnet``): its bridge, NAT, routes and
published ports, in the node's network namespace (``FERRY_NODE_NETNS``; empty: the service's own).

    ensure()       the bridge (the range's first address, the shared gateway MAC), forwarding, no
                   ICMP redirects (a job would then reach a same-node peer directly, and lose it
                   when the peer moves: so ``net.ipv4.conf.all.send_redirects`` is 0 here), and
                   the nftables table ``ferry_jobs``: masquerade for the range out of the node
                   (not between jobs: a job sees its peers' own addresses, which move with them), and
                   DNAT of published ports through two maps; a reason instead when it cannot (no
                   root, the range overlaps one of the node's addresses)
    apply(state)   the routes to the other nodes' jobs (``proto 77``, Ferry's own) and the maps'
                   elements as ``ferry.policy.netplan.node_net_state`` computed them

Everything survives a restart of the service: jobs keep running and so does their network; the
next ``apply`` reconciles.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import socket
import time
from pathlib import Path

import psutil

from ferry.common.jobnet import BRIDGE, GATEWAY_MAC, check_range, gateway, host_if, overlapping
from ferry.common.models import Job, Network
from ferry.criu import netcmd
from ferry.criu.rtnl import Request, Rtnl, encode_route
from ferry.criu.veth import HostEnd, JobLink, blocked_restore_args, restore_args
from ferry.policy.netplan import NetState

__all__ = ["GANG_LOCK_MARKER", "ROUTE_PROTO", "TABLE", "NodeNetwork", "drop_stale_link", "host_end", "job_link",
           "port_taken", "restore_options"]

log = logging.getLogger(__name__)

TABLE = "ferry_jobs"
NO_NETNS = "none"  # FERRY_NODE_NETNS of a node without a job network (ferry.cli.simnet)
ROUTE_PROTO = "77"  # marks Ferry's routes: the ones it may replace and delete
RESYNC_S = 30.0  # how often a pass reads the routes table rather than trust what it last applied


def job_link(job: Job, job_network: str, node_netns: str) -> JobLink | None:
    """The veth a bridge-network job gets on this node (None for other networks)."""
    if job.network != Network.BRIDGE:
        return None
    if not job.address:
        raise ValueError(f"job {job.id} has no address in the job network")
    return JobLink(job.address, gateway(job_network), host_if(job.id), node_netns or None)


def port_taken(job: Job, node_netns: str) -> str | None:
    """Why a bridge job's published port cannot be had on this node: a process of the node's own
    listens on it (its DNAT would hide that process from the outside). A node whose bridge is in a
    namespace of its own (``ferry up``) has no such processes."""
    if job.network != Network.BRIDGE or not job.publish or node_netns:
        return None
    listening = {(c.type, c.laddr.port) for c in psutil.net_connections(kind="inet")
                 if c.laddr and (c.status == psutil.CONN_LISTEN or c.type == socket.SOCK_DGRAM)}
    for m in job.publish:
        kind = socket.SOCK_STREAM if m.proto == "tcp" else socket.SOCK_DGRAM
        if (kind, m.host) in listening:
            return f"port {m.host}/{m.proto} is taken on this node by a process of its own: publish another"
    return None


def host_end(job: Job, node_netns: str) -> HostEnd | None:
    """The node's end of a bridge-network job's veth here (None for other networks)."""
    return HostEnd(host_if(job.id), node_netns or None) if job.network == Network.BRIDGE else None


def drop_stale_link(job: Job, node_netns: str) -> None:
    """Before a restore here: a veth of the job's name is a leftover (the job does not run here; a
    killed tree's closing sockets can keep its old namespace, and so the link, for minutes)."""
    end = host_end(job, node_netns)
    if end is not None:
        end.delete()


GANG_LOCK_MARKER = "gang-lock"
"""In a job's folder while a gang op keeps the job's bridge port blocked: names the op, so that a
restarted checkpointer unblocks a port whose op has ended."""


def restore_options(job: Job, node_netns: str, *, blocked_in: Path | None = None) -> tuple[tuple[str, ...], str | None]:
    """CRIU's extra restore options and the namespace it runs in, for ``job`` on this node.
    `blocked_in`: the job's folder, where a gang member restored with its port blocked keeps the
    action script that blocks it."""
    if job.network != Network.BRIDGE:
        return (), None
    args = restore_args(host_if(job.id))
    if blocked_in is not None:
        args = (*args, *blocked_restore_args(host_if(job.id), blocked_in / "block-port.sh"))
    return args, node_netns or None


class CommandFailed(OSError):
    pass


class NodeNetwork:
    def __init__(self, job_network: str, netns: str = "", resync_s: float = RESYNC_S) -> None:
        self.range = check_range(job_network)
        self.cidr = str(self.range)
        self.netns = netns or None
        self.applied: NetState | None = None
        self.resync_s = resync_s
        self._known: dict[str, str] | None = None  # Ferry's routes as the last apply left them
        self._known_at = 0.0  # when they were last read from the table (time.monotonic)

    # ---- commands ------------------------------------------------------------------------------

    def _run(self, *argv: str, stdin: str | None = None, check: bool = True) -> str:
        try:
            return netcmd.run(list(argv), netns=self.netns, stdin=stdin, check=check)
        except OSError as exc:
            raise CommandFailed(str(exc)) from None

    def _in_range(self, address: str) -> bool:
        return ipaddress.ip_address(address) in self.range

    def _routes(self, replace: list[Request], gone: list[Request]) -> None:
        """Makes and removes routes (one already gone is no failure). Raises CommandFailed."""
        try:
            with Rtnl(self.netns) as rtnl:
                rtnl.call(replace)
                rtnl.call(gone, tolerate=frozenset({errno.ESRCH, errno.ENOENT}))
        except OSError as exc:
            raise CommandFailed(f"the job network's routes: {exc}") from None

    def _sysctl(self, key: str, value: str) -> None:
        self._run("sh", "-c", f"echo {value} > /proc/sys/{key.replace('.', '/')}")

    # ---- the bridge and the table --------------------------------------------------------------

    def addresses(self) -> list[tuple[str, str]]:
        """(interface, ADDR/PREFIX) of every IPv4 address in the node's namespace."""
        out = json.loads(self._run("ip", "-j", "-4", "addr", "show") or "[]")
        return [(link.get("ifname", "?"), f"{a['local']}/{a['prefixlen']}")
                for link in out for a in link.get("addr_info", []) if "local" in a]

    def ensure(self) -> str | None:
        """Sets up the bridge and the table; the reason when it cannot (None: ready)."""
        if self.netns == NO_NETNS:
            return "this simulated node has no network namespace of its own (see `ferry up`'s output)"
        try:
            problem = overlapping(self.cidr, self.addresses())
            if problem:
                return problem
            gw = f"{gateway(self.cidr)}/{self.range.prefixlen}"
            if self._run("ip", "link", "show", BRIDGE, check=False).strip() == "":
                try:
                    self._run("ip", "link", "add", BRIDGE, "type", "bridge")
                except CommandFailed as exc:  # another node's service in this namespace made it meanwhile
                    if "File exists" not in str(exc):
                        raise
            self._run("ip", "link", "set", BRIDGE, "address", GATEWAY_MAC)
            self._run("ip", "addr", "replace", gw, "dev", BRIDGE)
            self._run("ip", "link", "set", BRIDGE, "up")
            self._sysctl("net.ipv4.ip_forward", "1")
            for conf in ("all", BRIDGE):  # the kernel sends redirects if either says so
                self._sysctl(f"net.ipv4.conf.{conf}.send_redirects", "0")
            # made afresh in one transaction (its maps are filled again by the next apply)
            self._run("nft", "-f", "-", stdin=f"table ip {TABLE} {{}}\ndelete table ip {TABLE}\n" + self._table())
            self.applied, self._known = None, None
        except (CommandFailed, OSError, ValueError) as exc:
            return f"the job network cannot be set up here: {exc}"
        return None

    def _table(self) -> str:
        return (f"table ip {TABLE} {{\n"
                "  map fwd_tcp { type inet_service : ipv4_addr . inet_service; }\n"
                "  map fwd_udp { type inet_service : ipv4_addr . inet_service; }\n"
                "  chain pre {\n"
                "    type nat hook prerouting priority dstnat; policy accept;\n"
                f'    iifname != "{BRIDGE}" fib daddr type local dnat ip to tcp dport map @fwd_tcp\n'
                f'    iifname != "{BRIDGE}" fib daddr type local dnat ip to udp dport map @fwd_udp\n'
                "  }\n"
                "  chain out {\n"
                "    type nat hook output priority -100; policy accept;\n"
                "    fib daddr type local ip daddr != 127.0.0.0/8 dnat ip to tcp dport map @fwd_tcp\n"
                "    fib daddr type local ip daddr != 127.0.0.0/8 dnat ip to udp dport map @fwd_udp\n"
                "  }\n"
                "  chain post {\n"
                "    type nat hook postrouting priority srcnat; policy accept;\n"
                f'    ip saddr {self.cidr} ip daddr != {self.cidr} oifname != "{BRIDGE}" masquerade\n'
                "  }\n"
                "}\n")

    # ---- reconciling ---------------------------------------------------------------------------

    def routes(self) -> dict[str, str]:
        """Ferry's routes in the node's namespace: job address -> next hop."""
        out = json.loads(self._run("ip", "-j", "-4", "route", "show", "proto", ROUTE_PROTO) or "[]")
        return {r["dst"].removesuffix("/32"): r.get("gateway", "") for r in out if "dst" in r}

    def apply(self, state: NetState) -> None:
        """Makes the routes and the forwards those of ``state``. Raises CommandFailed.

        The table is read once per ``resync_s`` (and after a failure or ``ensure``); in between,
        the routes the last apply left are taken as the table's: a pass is then the rtnetlink
        requests for what changed, sent from this process, not a read and a write (an ``ip``
        process each, per job start and end on every node). A route removed behind Ferry's back
        is made again at the first pass after a read."""
        try:
            self._apply(state)
        except BaseException:
            self._known = None
            raise

    def _apply(self, state: NetState) -> None:
        if self._known is None or time.monotonic() - self._known_at >= self.resync_s:
            self._known, self._known_at = self.routes(), time.monotonic()
        current = self._known
        # the changes as rtnetlink requests from this process (a process per pass was the largest
        # share of a short job's cost on the nodes it did not run on)
        # only what changed is parsed (every route's address, each pass, was most of a pass)
        made = {address: via for address, via in state.routes.items()
                if current.get(address) != via and self._in_range(address)}
        replace = [encode_route(address, via=via, proto=int(ROUTE_PROTO), replace=True)
                   for address, via in sorted(made.items())]
        gone = [encode_route(address, proto=int(ROUTE_PROTO), delete=True)
                for address in sorted(set(current) - set(state.routes))]
        if replace or gone:
            self._routes(replace, gone)
        if self.applied is None or self.applied.forwards != state.forwards:
            lines = [f"flush map ip {TABLE} fwd_tcp", f"flush map ip {TABLE} fwd_udp"]
            for (proto, port), (address, job_port) in sorted(state.forwards.items()):
                lines.append(f"add element ip {TABLE} fwd_{proto} {{ {port} : {address} . {job_port} }}")
            self._run("nft", "-f", "-", stdin="\n".join(lines) + "\n")
        self._known = {a: via for a, via in state.routes.items() if current.get(a) == via or a in made}
        self.applied = state
