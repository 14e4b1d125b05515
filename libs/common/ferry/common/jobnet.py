"""A bridge-network job's address, published ports and link names (``ferry run --network bridge``).

Pure functions over the records: the scheduler allocates a job's address once, from the cluster's
range (``FERRY_JOB_NETWORK``), and the job keeps it wherever it runs. Every node's bridge
(``BRIDGE``) carries the range's first address with the same MAC (``GATEWAY_MAC``), so a job that
was restored on another node finds its gateway under the address and the MAC it knew.

    job netns: eth0 ADDR/32, "GW dev eth0", "default via GW"  --veth--  HOST_IF on the node's BRIDGE
    node:      BRIDGE GW/prefix; ADDR/32 via <the node it runs on> for the other nodes' jobs;
               masquerade out of the node for the range; published ports DNAT'ed to their job
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import itertools
import re
from collections.abc import Container, Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ferry.common.errors import UsageError

__all__ = ["BRIDGE", "DEFAULT_RANGE", "GATEWAY_MAC", "JOB_IF", "PortMap", "allocate", "check_range", "gateway",
           "host_if", "overlapping", "parse_publish"]

BRIDGE = "ferry0"
JOB_IF = "eth0"
GATEWAY_MAC = "02:fe:77:00:00:01"  # locally administered; the same on every node (an anycast gateway)
DEFAULT_RANGE = "10.88.0.0/16"
_PUBLISH = re.compile(r"^(\d{1,5}):(\d{1,5})(?:/(tcp|udp))?$")


class PortMap(BaseModel):
    """``--publish HOST:JOB[/tcp|udp]``: the node's port HOST reaches the job's port JOB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: int = Field(ge=1, le=65535)
    job: int = Field(ge=1, le=65535)
    proto: Literal["tcp", "udp"] = "tcp"

    def __str__(self) -> str:
        return f"{self.host}:{self.job}/{self.proto}"


def parse_publish(text: str) -> PortMap:
    match = _PUBLISH.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"--publish {text!r}: use HOST_PORT:JOB_PORT[/tcp|udp], e.g. 8080:80")
    host, job = int(match[1]), int(match[2])
    for port in (host, job):
        if not 1 <= port <= 65535:
            raise UsageError(f"--publish {text!r}: ports are 1 to 65535")
    proto: Literal["tcp", "udp"] = "udp" if match[3] == "udp" else "tcp"
    return PortMap(host=host, job=job, proto=proto)


def check_range(cidr: str) -> ipaddress.IPv4Network:
    """The cluster's job range as a network, or a one-line UsageError."""
    try:
        net = ipaddress.ip_network(cidr.strip(), strict=True)
    except ValueError as exc:
        raise UsageError(f"job network {cidr!r}: {exc} (use an IPv4 range such as {DEFAULT_RANGE})") from None
    if not isinstance(net, ipaddress.IPv4Network) or net.prefixlen > 28:
        raise UsageError(f"job network {cidr!r}: use an IPv4 range of at least /28, such as {DEFAULT_RANGE}")
    if not net.is_private:
        raise UsageError(f"job network {cidr!r} is not a private range: use one such as {DEFAULT_RANGE}")
    return net


def gateway(cidr: str) -> str:
    """The range's first address: every node's bridge carries it."""
    return str(next(check_range(cidr).hosts()))


def allocate(cidr: str, used: Container[str], after: str | None = None) -> str:
    """The first address of the range that no job holds (not the gateway nor the broadcast),
    from the one after ``after`` on (round the range), else from the lowest: a scheduler that
    passes the address it gave last finds a free one at once, however many jobs hold one."""
    net = check_range(cidr)
    gw = gateway(cidr)
    first, last = int(net.network_address) + 1, int(net.broadcast_address) - 1
    start = first
    if after is not None:
        with contextlib.suppress(ValueError):
            following = int(ipaddress.IPv4Address(after)) + 1
            start = following if first <= following <= last else first
    for i in itertools.chain(range(start, last + 1), range(first, start)):
        address = str(ipaddress.IPv4Address(i))
        if address != gw and address not in used:
            return address
    raise UsageError(f"the job network {cidr} has no free address: remove finished jobs or use a bigger range")


def host_if(job_id: str) -> str:
    """The node's end of the job's veth: the same name on every node (15 characters at most)."""
    return "fj" + hashlib.sha256(job_id.encode()).hexdigest()[:11]


def overlapping(cidr: str, addresses: Iterable[tuple[str, str]]) -> str | None:
    """The first of (interface, ADDR/PREFIX) whose network overlaps the range, as a reason (the
    node's bridge itself excluded); None when none does."""
    net = check_range(cidr)
    for name, text in addresses:
        if name == BRIDGE:
            continue
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError:
            continue
        if isinstance(iface, ipaddress.IPv4Interface) and not iface.ip.is_loopback and iface.network.overlaps(net):
            return f"the job network {cidr} overlaps {text} on {name}: set FERRY_JOB_NETWORK to a free range"
    return None
