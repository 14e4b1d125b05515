"""A bridge-network job's link (``ferry.common.jobnet``): made at launch, rebuilt by CRIU at restore.

At launch the shim's workload unshares its network namespace and waits; the monitor then makes the
veth pair (``attach``): the job's end, ``eth0``, with the job's address and a route through the
gateway, and the node's end on the node's bridge, in the node's network namespace (``node_netns``;
None: the monitor's own). CRIU dumps the job's namespace with its veth, addresses and routes; a
restore rebuilds the pair with ``--veth-pair eth0=HOST_IF@BRIDGE`` (``restore_args``), run in the
node's namespace (``enter``), so the node's end lands on that node's bridge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ferry.common.jobnet import BRIDGE, JOB_IF
from ferry.criu import netcmd
from ferry.criu.linux import CLONE_NEWNET, setns
from ferry.criu.rtnl import (
    RT_SCOPE_LINK,
    Rtnl,
    encode_addr,
    encode_link_by_name,
    encode_route,
    encode_veth,
    in_netns_write,
)

__all__ = ["HostEnd", "JobLink", "attach", "enter", "restore_args"]



@dataclass(frozen=True)
class JobLink:
    address: str
    gateway: str
    host_if: str
    node_netns: str | None = None  # the namespace holding the node's bridge (a path); None: ours


def attach(pid: int, link: JobLink) -> None:
    """The veth of the job whose network namespace is ``pid``'s: its end configured, the node's
    end up on the node's bridge. Raises OSError. Sent as rtnetlink requests from this process
    (``ferry.criu.rtnl``): ``ip`` and ``nsenter`` processes were the largest share of a short
    bridge job's CPU."""
    job_ns = f"/proc/{pid}/ns/net"
    fd = os.open(job_ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with Rtnl(link.node_netns) as node:
            node.call([encode_veth(link.host_if, JOB_IF, fd, master=node.index(BRIDGE))])
    finally:
        os.close(fd)
    with Rtnl(job_ns) as job:
        job.call([encode_link_by_name("lo", up=True), encode_link_by_name(JOB_IF, up=True)])
        index = job.index(JOB_IF)
        job.call([encode_addr(link.address, index),
                  encode_route(link.gateway, oif=index, scope=RT_SCOPE_LINK),
                  encode_route(None, via=link.gateway, oif=index)])
    # no ICMP redirects: a peer that was on the same node must stay reachable through the gateway
    # once it moves away (a redirect would make its address look directly reachable, for good)
    conf = "/proc/sys/net/ipv4/conf"
    for name in ("all", JOB_IF):
        in_netns_write(job_ns, f"{conf}/{name}/accept_redirects", "0")


@dataclass(frozen=True)
class HostEnd:
    """The node's end of a job's veth. A live move's source takes it down once the tree is frozen
    (else, once CRIU's dump ends and unlocks the network, the stopped tree's kernel sockets would
    acknowledge what peers send, and that would never reach the target), up again if the move is
    undone, and deletes it before the tree is killed: no reset reaches a peer, and the name is free
    for a later restore on this node."""

    host_if: str
    node_netns: str | None = None

    def set_up(self, up: bool) -> None:
        netcmd.run(["ip", "link", "set", self.host_if, "up" if up else "down"], netns=self.node_netns)

    def block(self, blocked: bool) -> None:
        """Blocks (or unblocks) the job's traffic at the node's bridge, the link staying up: a gang's
        network lock while its members dump. Not ``set_up(False)``: CRIU would dump the job's
        routes marked LINKDOWN, which the kernel refuses to restore."""
        netcmd.run(["ip", "link", "set", "dev", self.host_if, "type", "bridge_slave", "state",
                    "0" if blocked else "3"], netns=self.node_netns)

    def delete(self) -> None:
        """Removes it (and the job's end with it); nothing when it is gone already."""
        try:
            netcmd.run(["ip", "link", "del", self.host_if], netns=self.node_netns)
        except OSError as exc:
            if "Cannot find device" not in str(exc):
                raise


def blocked_restore_args(host_if: str, script: Path) -> tuple[str, ...]:
    """CRIU options that leave the restored job's bridge port blocked (``HostEnd.block``) when its
    tasks resume: a gang's member stays cut off until every member is back. The block is set by an
    action script at ``post-restore``, which CRIU runs (in the node's namespace, where it made the
    node's end) before it lets the tasks run."""
    script.write_text("#!/bin/sh\n"
                      "[ \"$CRTOOLS_SCRIPT_ACTION\" = post-restore ] || exit 0\n"
                      f"exec ip link set dev {host_if} type bridge_slave state 0\n")
    script.chmod(0o700)
    return ("--action-script", str(script))


def restore_args(host_if: str) -> tuple[str, ...]:
    """CRIU's option that rebuilds the job's veth with the node's end on the bridge."""
    return ("--veth-pair", f"{JOB_IF}={host_if}@{BRIDGE}")


def enter(netns: str) -> None:
    """Moves the calling thread (for a single-threaded monitor: the process) into ``netns``."""
    setns(netns, CLONE_NEWNET)
