"""A bridge-network job's link (``ferry.common.jobnet``): made at launch, rebuilt by CRIU at restore.

At launch the shim's workload unshares its network namespace and waits; the monitor then makes the
veth pair (``attach``): the job's end, ``eth0``, with the job's address and a route through the
gateway, and the node's end on the node's bridge, in the node's network namespace (``node_netns``;
None: the monitor's own). CRIU dumps the job's namespace with its veth, addresses and routes; a
restore rebuilds the pair with ``--veth-pair eth0=HOST_IF@BRIDGE`` (``restore_args``), run in the
node's namespace (``enter``), so the node's end lands on that node's bridge.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ferry.common.jobnet import BRIDGE, JOB_IF
from ferry.criu import netcmd
from ferry.criu.linux import CLONE_NEWNET, setns

__all__ = ["HostEnd", "JobLink", "attach", "enter", "restore_args"]



@dataclass(frozen=True)
class JobLink:
    address: str
    gateway: str
    host_if: str
    node_netns: str | None = None  # the namespace holding the node's bridge (a path); None: ours


def attach(pid: int, link: JobLink) -> None:
    """The veth of the job whose network namespace is ``pid``'s: its end configured, the node's
    end up on the node's bridge. Raises OSError. The caller's children must be in the PID
    namespace where ``pid`` is ``pid`` (the kernel reads ``netns PID`` there)."""
    # two processes for the node's end (one `ip -batch`), three for the job's (nsenter, sh, ip):
    # a launch's share of the node's CPU when many short jobs start
    netcmd.run(["ip", "-batch", "-"], netns=link.node_netns,
               stdin=(f"link add {link.host_if} type veth peer name {JOB_IF} netns {pid}\n"
                      f"link set {link.host_if} master {BRIDGE} up\n"))
    script = (f"link set lo up\n"
              f"addr add {link.address}/32 dev {JOB_IF}\n"
              f"link set {JOB_IF} up\n"
              f"route add {link.gateway} dev {JOB_IF} scope link\n"
              f"route add default via {link.gateway} dev {JOB_IF}\n")
    # no ICMP redirects: a peer that was on the same node must stay reachable through the gateway
    # once it moves away (a redirect would make its address look directly reachable, for good)
    conf = "/proc/sys/net/ipv4/conf"
    netcmd.run(["sh", "-c", f"{netcmd.tool('ip')} -batch - && echo 0 > {conf}/all/accept_redirects && "
                            f"echo 0 > {conf}/{JOB_IF}/accept_redirects"],
               netns=f"/proc/{pid}/ns/net", stdin=script)


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
