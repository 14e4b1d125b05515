"""The few rtnetlink requests the job network makes per job, sent from this process: a veth pair,
an address, routes. Each was an ``ip`` process (and, in another namespace, an ``nsenter``): about
1.5 ms of CPU per exec, a dozen per short job across the nodes, the largest share of a bridge
job's cost beyond the kernel's own (``bench/scale.py``). pyroute2 was measured for this and cost
4 ms of CPU for a veth and its configuration, against 5 ms for the ``ip`` processes: the encoding
here is a few ``struct.pack`` calls.

    encode_*(...)      a request's bytes: pure functions (``tests/unit/test_rtnl.py`` checks them)
    Rtnl(netns)        a NETLINK_ROUTE socket in the network namespace at path ``netns`` (None: the
                       caller's), made by the calling thread entering it for the ``socket()`` call
                       only; ``call`` sends requests and waits for each one's acknowledgement
    RtnlError          a refused request (an OSError with the kernel's errno)

Layouts: ``linux/netlink.h`` (nlmsghdr, nlmsgerr, nlattr), ``linux/rtnetlink.h`` (rtmsg,
ifinfomsg, ifaddrmsg), ``linux/if_link.h`` (IFLA_*), ``linux/veth.h`` (VETH_INFO_PEER).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ferry.criu.linux import CLONE_NEWNET, setns

__all__ = ["Request", "Rtnl", "RtnlError", "encode_addr", "encode_link_by_name", "encode_route", "encode_veth",
           "in_netns_write"]

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR = 20
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 10, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
RT_TABLE_MAIN, RTPROT_BOOT = 254, 3
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255
RTN_UNICAST = 1
IFF_UP = 0x1
NLA_F_NESTED = 0x8000

_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBi")  # ifaddrmsg: family, prefix length, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst len, src len, tos, table, protocol, scope, type, flags
_ATTR = struct.Struct("=HH")
_BATCH = 128  # requests per send: their acknowledgements fit the socket's default buffer


class RtnlError(OSError):
    """The kernel refused a request (``errno`` is its answer)."""


@dataclass(frozen=True)
class Request:
    """One rtnetlink request: its type, flags (beyond REQUEST and ACK) and body; ``what`` names it
    in an error."""

    type: int
    flags: int
    body: bytes
    what: str


def _attr(kind: int, payload: bytes) -> bytes:
    size = _ATTR.size + len(payload)
    return _ATTR.pack(size, kind) + payload + b"\0" * (-size % 4)


def _name(name: str) -> bytes:
    return name.encode() + b"\0"


def _ip(address: str) -> bytes:
    return ipaddress.IPv4Address(address).packed


def encode_veth(host_if: str, peer: str, peer_netns_fd: int, *, master: int, up: bool = True) -> Request:
    """``ip link add HOST_IF [up] master MASTER type veth peer name PEER netns FD``."""
    peer_info = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, _name(peer)) \
        + _attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
    data = _attr(VETH_INFO_PEER | NLA_F_NESTED, peer_info)
    linkinfo = _attr(IFLA_INFO_KIND, _name("veth")) + _attr(IFLA_INFO_DATA | NLA_F_NESTED, data)
    flags = IFF_UP if up else 0
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, flags, IFF_UP) + _attr(IFLA_IFNAME, _name(host_if)) \
        + _attr(IFLA_MASTER, struct.pack("=I", master)) + _attr(IFLA_LINKINFO | NLA_F_NESTED, linkinfo)
    return Request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, f"link add {host_if} type veth peer name {peer}")


def encode_link_by_name(name: str, *, up: bool | None = None, delete: bool = False, get: bool = False) -> Request:
    """``ip link set NAME up|down``, ``ip link del NAME`` or a lookup of NAME (its index comes back)."""
    kind = RTM_DELLINK if delete else RTM_GETLINK if get else RTM_NEWLINK
    flags, change = (0, 0) if up is None else (IFF_UP if up else 0, IFF_UP)
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, flags, change) + _attr(IFLA_IFNAME, _name(name))
    what = f"link del {name}" if delete else f"link show {name}" if get else f"link set {name} {'up' if up else 'down'}"
    return Request(kind, 0, body, what)


def encode_addr(address: str, index: int, prefix: int = 32) -> Request:
    """``ip addr add ADDRESS/PREFIX dev INDEX``."""
    body = _IFADDR.pack(socket.AF_INET, prefix, 0, RT_SCOPE_UNIVERSE, index) \
        + _attr(IFA_LOCAL, _ip(address)) + _attr(IFA_ADDRESS, _ip(address))
    return Request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"addr add {address}/{prefix}")


def encode_route(dst: str | None, *, via: str | None = None, oif: int | None = None, proto: int = RTPROT_BOOT,
                 scope: int = RT_SCOPE_UNIVERSE, replace: bool = False, delete: bool = False) -> Request:
    """``ip route add|replace|del DST/32 [via VIA] [dev OIF] [proto P] [scope S]`` in the main
    table; DST None: the default route."""
    prefix = 0 if dst is None else 32
    if delete:  # matched by destination and protocol, whatever its scope and type (as `ip route del`)
        header = _RTMSG.pack(socket.AF_INET, prefix, 0, 0, RT_TABLE_MAIN, proto, RT_SCOPE_NOWHERE, 0, 0)
    else:
        header = _RTMSG.pack(socket.AF_INET, prefix, 0, 0, RT_TABLE_MAIN, proto, scope, RTN_UNICAST, 0)
    attrs = b""
    if dst is not None:
        attrs += _attr(RTA_DST, _ip(dst))
    if via is not None:
        attrs += _attr(RTA_GATEWAY, _ip(via))
    if oif is not None:
        attrs += _attr(RTA_OIF, struct.pack("=i", oif))
    if delete:
        kind, flags = RTM_DELROUTE, 0
    else:
        kind, flags = RTM_NEWROUTE, NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
    verb = "del" if delete else "replace" if replace else "add"
    what = f"route {verb} {dst or 'default'}/{prefix}" + (f" via {via}" if via else "")
    return Request(kind, flags, header + attrs, what)


def encode(requests: Sequence[Request], first_seq: int) -> bytes:
    """The requests as one buffer, numbered from ``first_seq``, each asking for an acknowledgement."""
    out = []
    for seq, req in enumerate(requests, first_seq):
        out.append(_HDR.pack(_HDR.size + len(req.body), req.type, NLM_F_REQUEST | NLM_F_ACK | req.flags, seq, 0))
        out.append(req.body)
    return b"".join(out)


def decode_answers(data: bytes) -> Iterable[tuple[int, int, int, bytes]]:
    """(type, sequence, errno or 0, body) of each message in ``data``; errno only for NLMSG_ERROR."""
    at = 0
    while at + _HDR.size <= len(data):
        length, kind, _, seq, _ = _HDR.unpack_from(data, at)
        if length < _HDR.size:
            return
        body = data[at + _HDR.size : at + length]
        code = -struct.unpack_from("=i", body)[0] if kind == NLMSG_ERROR else 0
        yield kind, seq, code, body
        at += (length + 3) & ~3


class Rtnl:
    """A NETLINK_ROUTE socket in one network namespace (see the module's doc)."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        self._seq = 1  # the next request's sequence number on this socket
        with _entered(netns):  # the socket stays in that namespace
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.bind((0, 0))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, requests: Sequence[Request], *, tolerate: frozenset[int] = frozenset()) -> list[bytes]:
        """Sends ``requests`` in order; returns each one's answer (a lookup's link message, else
        empty). Raises RtnlError for the first refused one whose errno is not in ``tolerate``;
        the ones after it were still sent (as ``ip -batch`` does not)."""
        answers: list[bytes] = []
        failure: RtnlError | None = None
        for start in range(0, len(requests), _BATCH):
            batch = requests[start : start + _BATCH]
            first, self._seq = self._seq, self._seq + len(batch)
            self.sock.sendall(encode(batch, first))
            got: dict[int, bytes] = {}
            done = 0
            while done < len(batch):
                for kind, seq, code, body in decode_answers(self.sock.recv(1 << 16)):
                    index = seq - first
                    if not 0 <= index < len(batch):
                        continue  # an answer to an earlier, abandoned call
                    if kind != NLMSG_ERROR:
                        got[index] = body
                        continue
                    done += 1
                    if code and code not in tolerate and failure is None:
                        what = batch[index].what
                        failure = RtnlError(code, f"{what}: {os.strerror(code)}")
            answers.extend(got.get(i, b"") for i in range(len(batch)))
        if failure is not None:
            raise failure
        return answers

    def index(self, name: str) -> int:
        """The index of link ``name`` here (RtnlError ENODEV when there is none)."""
        (answer,) = self.call([encode_link_by_name(name, get=True)])
        if len(answer) < _IFINFO.size:
            raise RtnlError(errno.ENODEV, f"link show {name}: no answer")
        return int(_IFINFO.unpack_from(answer)[2])


@contextlib.contextmanager
def _entered(netns: str | None) -> Iterator[None]:
    """The calling thread in network namespace ``netns`` (None: where it is) for the block, then
    back where it was."""
    if not netns:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(netns, CLONE_NEWNET)  # this thread only
        try:
            yield
        finally:
            setns(f"/proc/self/fd/{own}", CLONE_NEWNET)
    finally:
        os.close(own)


def in_netns_write(netns: str, path: str, value: str) -> None:
    """Writes ``value`` to ``path`` as seen from network namespace ``netns`` (a /proc/sys/net
    setting is the namespace's of the thread that opens it)."""
    with _entered(netns):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
