"""The rtnetlink requests' bytes (``ferry.criu.rtnl``): headers, attributes and their padding as
linux/netlink.h and linux/rtnetlink.h lay them out."""

from __future__ import annotations

import socket
import struct

from ferry.criu import rtnl


def attrs(data: bytes) -> dict[int, bytes]:
    out, at = {}, 0
    while at + 4 <= len(data):
        size, kind = struct.unpack_from("=HH", data, at)
        assert size >= 4
        out[kind & ~rtnl.NLA_F_NESTED] = data[at + 4 : at + size]
        at += (size + 3) & ~3
    assert at == len(data), "attributes end on a 4-byte boundary"
    return out


def test_a_veth_names_both_ends_its_master_and_the_peers_namespace() -> None:
    req = rtnl.encode_veth("fj1234", "eth0", 7, master=3)
    assert (req.type, req.flags) == (rtnl.RTM_NEWLINK, rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL)
    family, _, index, flags, change = struct.unpack_from("=BxHiII", req.body)
    assert (family, index, flags, change) == (socket.AF_UNSPEC, 0, rtnl.IFF_UP, rtnl.IFF_UP)
    top = attrs(req.body[16:])
    assert top[rtnl.IFLA_IFNAME] == b"fj1234\0"
    assert struct.unpack("=I", top[rtnl.IFLA_MASTER]) == (3,)
    info = attrs(top[rtnl.IFLA_LINKINFO])
    assert info[rtnl.IFLA_INFO_KIND] == b"veth\0"
    peer = attrs(info[rtnl.IFLA_INFO_DATA])[rtnl.VETH_INFO_PEER]
    peer_attrs = attrs(peer[16:])
    assert peer_attrs[rtnl.IFLA_IFNAME] == b"eth0\0"
    assert struct.unpack("=I", peer_attrs[rtnl.IFLA_NET_NS_FD]) == (7,)
    assert "fj1234" in req.what and "eth0" in req.what


def test_routes_add_replace_and_delete() -> None:
    via = rtnl.encode_route("10.1.2.3", via="192.168.0.2", proto=77, replace=True)
    assert (via.type, via.flags) == (rtnl.RTM_NEWROUTE, rtnl.NLM_F_CREATE | rtnl.NLM_F_REPLACE)
    family, dst_len, _, _, table, proto, scope, kind, _ = struct.unpack_from("=BBBBBBBBI", via.body)
    assert (family, dst_len, table, proto, scope, kind) == (socket.AF_INET, 32, 254, 77, 0, rtnl.RTN_UNICAST)
    assert attrs(via.body[12:]) == {rtnl.RTA_DST: bytes([10, 1, 2, 3]), rtnl.RTA_GATEWAY: bytes([192, 168, 0, 2])}
    default = rtnl.encode_route(None, via="10.0.0.1", oif=2)
    assert default.flags == rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL
    assert default.body[1] == 0  # dst_len: the default route
    assert attrs(default.body[12:]) == {rtnl.RTA_GATEWAY: bytes([10, 0, 0, 1]), rtnl.RTA_OIF: struct.pack("=i", 2)}
    link = rtnl.encode_route("10.0.0.1", oif=2, scope=rtnl.RT_SCOPE_LINK)
    assert link.body[6] == rtnl.RT_SCOPE_LINK
    gone = rtnl.encode_route("10.1.2.3", proto=77, delete=True)
    assert (gone.type, gone.flags) == (rtnl.RTM_DELROUTE, 0)
    assert gone.body[5:8] == bytes([77, rtnl.RT_SCOPE_NOWHERE, 0])  # any scope and type, this protocol


def test_an_address_and_links_by_name() -> None:
    addr = rtnl.encode_addr("10.9.8.7", 5)
    assert struct.unpack_from("=BBBBi", addr.body) == (socket.AF_INET, 32, 0, 0, 5)
    assert attrs(addr.body[8:]) == {rtnl.IFA_LOCAL: bytes([10, 9, 8, 7]), rtnl.IFA_ADDRESS: bytes([10, 9, 8, 7])}
    up = rtnl.encode_link_by_name("lo", up=True)
    assert up.type == rtnl.RTM_NEWLINK and struct.unpack_from("=BxHiII", up.body)[3:] == (rtnl.IFF_UP, rtnl.IFF_UP)
    down = rtnl.encode_link_by_name("eth0", up=False)
    assert struct.unpack_from("=BxHiII", down.body)[3:] == (0, rtnl.IFF_UP)
    assert rtnl.encode_link_by_name("eth0", delete=True).type == rtnl.RTM_DELLINK
    assert rtnl.encode_link_by_name("eth0", get=True).type == rtnl.RTM_GETLINK


def test_requests_are_numbered_and_answers_read_back() -> None:
    reqs = [rtnl.encode_link_by_name("a", up=True), rtnl.encode_addr("10.0.0.1", 1)]
    data = rtnl.encode(reqs, 40)
    first_len, kind, flags, seq, _ = struct.unpack_from("=IHHII", data)
    assert (kind, seq, flags & rtnl.NLM_F_ACK) == (rtnl.RTM_NEWLINK, 40, rtnl.NLM_F_ACK)
    assert struct.unpack_from("=IHHII", data, first_len)[3] == 41
    assert len(data) == first_len + 16 + len(reqs[1].body)
    # an acknowledgement (error 0) and a refusal (-EEXIST), as the kernel sends them
    ack = struct.pack("=IHHII", 36, rtnl.NLMSG_ERROR, 0, 40, 0) + struct.pack("=i", 0) + data[:16]
    refused = struct.pack("=IHHII", 36, rtnl.NLMSG_ERROR, 0, 41, 0) + struct.pack("=i", -17) + data[:16]
    assert [(k, s, c) for k, s, c, _ in rtnl.decode_answers(ack + refused)] == [(2, 40, 0), (2, 41, 17)]
