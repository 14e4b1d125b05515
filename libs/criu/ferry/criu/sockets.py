"""The Internet sockets a CRIU dump carried, read from its images: what a checkpoint record lists.

Layout (CRIU 4.2, images/fdinfo.proto and images/sk-inet.proto): ``files.img`` (magic
``FILES_MAGIC``) holds one ``file_entry`` per open file, with its type (field 1; 4 is an Internet
socket) and, for a socket, an ``inet_sk_entry`` (field 4). Images of CRIU before 3.x kept those in
``inetsk.img`` (``INETSK_MAGIC``), one ``inet_sk_entry`` per entry; both are read. In an
``inet_sk_entry``: family 3 (AF_INET 2, AF_INET6 10), type 4 (SOCK_STREAM 1, SOCK_DGRAM 2), proto
5, state 6 (the kernel's TCP state numbers), ports 7 and 8, addresses 11 and 12 as 32-bit words
of the address's bytes, little-endian, one word for IPv4 and four for IPv6.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

from pydantic import BaseModel

from ferry.criu.images import read_image
from ferry.criu.protobuf import Message, read_varint

__all__ = ["FILES_MAGIC", "INETSK_MAGIC", "InetSocket", "read_sockets"]

FILES_MAGIC = 0x56303138
INETSK_MAGIC = 0x56443851
_FD_INETSK = 4
_TCP_STATES = {1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait1", 5: "fin-wait2", 6: "time-wait",
               7: "close", 8: "close-wait", 9: "last-ack", 10: "listen", 11: "closing"}
_PROTOS = {6: "tcp", 17: "udp", 136: "udplite"}


class InetSocket(BaseModel):
    proto: str  # tcp, udp, udplite or the protocol number
    state: str  # established, listen, close... (a UDP socket: "close" unless connected)
    local: str  # address:port ([v6]:port)
    remote: str | None = None  # for a connected socket

    def __str__(self) -> str:
        return f"{self.proto} {self.local}" + (f" <-> {self.remote}" if self.remote else "") + f" {self.state}"


def _words(msg: Message, number: int) -> list[int]:
    """A repeated uint32 field, packed (bytes) or not (one int each)."""
    out: list[int] = []
    for value in msg.fields.get(number, []):
        if isinstance(value, int):
            out.append(value)
            continue
        pos = 0
        while pos < len(value):
            word, pos = read_varint(value, pos)
            out.append(word)
    return out


def _endpoint(words: list[int], port: int, family: int) -> str:
    raw = b"".join(struct.pack("<I", w & 0xFFFFFFFF) for w in words)
    if family == 10 and len(raw) == 16:
        return f"[{ipaddress.IPv6Address(raw)}]:{port}"
    if len(raw) >= 4:
        return f"{ipaddress.IPv4Address(raw[:4])}:{port}"
    return f"?:{port}"


def _socket(isk: Message) -> InetSocket:
    family, proto, state = isk.uint(3, 0), isk.uint(5, 0), isk.uint(6, 0)
    dst_port = isk.uint(8, 0)
    local = _endpoint(_words(isk, 11), isk.uint(7, 0), family)
    remote = _endpoint(_words(isk, 12), dst_port, family) if dst_port else None
    return InetSocket(proto=_PROTOS.get(proto, str(proto)), state=_TCP_STATES.get(state, str(state)),
                      local=local, remote=remote)


def read_sockets(images_dir: Path) -> list[InetSocket]:
    """The Internet sockets in the dump at `images_dir` (empty when it has none)."""
    found: list[InetSocket] = []
    files = images_dir / "files.img"
    if files.exists():
        for entry in read_image(files, FILES_MAGIC):
            if entry.uint(1, 0) == _FD_INETSK and (isk := entry.message(4)) is not None:
                found.append(_socket(isk))
    legacy = images_dir / "inetsk.img"
    if legacy.exists():
        found.extend(_socket(entry) for entry in read_image(legacy, INETSK_MAGIC))
    return found
