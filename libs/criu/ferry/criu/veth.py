"""A bridge-network job's link (``ferry.common.jobnet``): made at launch, rebuilt by CRIU at restore.

At launch the shim's workload unshares its network namespace and waits; the monitor then makes the
veth pair (``attach``): the job's end, ``eth0``, with the job's address and a route through the
gateway, and the node's end on the node's bridge, in the node's network namespace (``node_netns``;
None: the monitor's own). CRIU dumps the job's namespace with its veth, addresses and routes; a
restore rebuilds the pair with ``--veth-pair eth0=HOST_IF@BRIDGE`` (``restore_args``), run in the
node's namespace (``enter``), so the node's end lands on that node's bridge.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ferry.common.jobnet import BRIDGE, JOB_IF
from ferry.criu.linux import CLONE_NEWNET, setns

__all__ = ["HostEnd", "JobLink", "attach", "enter", "restore_args"]



@dataclass(frozen=True)
class JobLink:
    address: str
    gateway: str
    host_if: str
    node_netns: str | None = None  # the namespace holding the node's bridge (a path); None: ours


def _ip() -> str:
    found = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if found is None:
        raise OSError("the ip command (iproute2) is missing: run ./setup.sh")
    return found


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:6])} ... failed: {done.stderr.strip() or done.returncode}")


def _in(netns: str | None, argv: list[str]) -> list[str]:
    if netns is None:
        return argv
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    return [nsenter, f"--net={netns}", "--", *argv]


def attach(pid: int, link: JobLink) -> None:
    """The veth of the job whose network namespace is ``pid``'s: its end configured, the node's
    end up on the node's bridge. Raises OSError. The caller's children must be in the PID
    namespace where ``pid`` is ``pid`` (the kernel reads ``netns PID`` there)."""
    ip = _ip()
    _run(_in(link.node_netns, [ip, "link", "add", link.host_if, "type", "veth", "peer", "name", JOB_IF,
                                "netns", str(pid)]))
    _run(_in(link.node_netns, [ip, "link", "set", link.host_if, "master", BRIDGE, "up"]))
    script = (f"link set lo up\n"
              f"addr add {link.address}/32 dev {JOB_IF}\n"
              f"link set {JOB_IF} up\n"
              f"route add {link.gateway} dev {JOB_IF} scope link\n"
              f"route add default via {link.gateway} dev {JOB_IF}\n")
    _run(_in(f"/proc/{pid}/ns/net", [ip, "-batch", "-"]), stdin=script)
    # no ICMP redirects: a peer that was on the same node must stay reachable through the gateway
    # once it moves away (a redirect would make its address look directly reachable, for good)
    conf = "/proc/sys/net/ipv4/conf"
    _run(_in(f"/proc/{pid}/ns/net", ["sh", "-c", f"echo 0 > {conf}/all/accept_redirects; "
                                                  f"echo 0 > {conf}/{JOB_IF}/accept_redirects"]))


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
        _run(_in(self.node_netns, [_ip(), "link", "set", self.host_if, "up" if up else "down"]))

    def delete(self) -> None:
        """Removes it (and the job's end with it); nothing when it is gone already."""
        done = subprocess.run(_in(self.node_netns, [_ip(), "link", "del", self.host_if]), capture_output=True,
                              text=True, timeout=30, check=False)
        if done.returncode != 0 and "Cannot find device" not in done.stderr:
            raise OSError(f"ip link del {self.host_if}: {done.stderr.strip()}")


def restore_args(host_if: str) -> tuple[str, ...]:
    """CRIU's option that rebuilds the job's veth with the node's end on the bridge."""
    return ("--veth-pair", f"{JOB_IF}={host_if}@{BRIDGE}")


def enter(netns: str) -> None:
    """Moves the calling thread (for a single-threaded monitor: the process) into ``netns``."""
    setns(netns, CLONE_NEWNET)
