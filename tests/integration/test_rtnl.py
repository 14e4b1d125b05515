"""``ferry.criu.rtnl`` against the kernel, in a scratch network namespace: a veth whose peer lands
in another namespace, addresses and routes made, a refusal named in one line, a removal of
something already gone tolerated, and more requests than one send holds."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from ferry.criu import rtnl


def ip(ns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "ip", *argv], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def two() -> Iterator[tuple[str, str]]:
    names = (f"ferry-rt-{uuid.uuid4().hex[:6]}", f"ferry-rt-{uuid.uuid4().hex[:6]}")
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_veth_into_another_namespace_configured_from_here(two: tuple[str, str]) -> None:
    node, job = two
    own = os.readlink("/proc/thread-self/ns/net")
    ip(node, "link", "add", "br9", "type", "bridge")
    fd = os.open(f"/run/netns/{job}", os.O_RDONLY)
    try:
        with rtnl.Rtnl(f"/run/netns/{node}") as sock:
            sock.call([rtnl.encode_veth("hx1", "eth0", fd, master=sock.index("br9"))])
            with pytest.raises(rtnl.RtnlError) as refused:  # the name is taken: refused, in one line
                sock.call([rtnl.encode_veth("hx1", "eth1", fd, master=sock.index("br9"))])
            assert refused.value.errno == errno.EEXIST and "link add hx1" in str(refused.value)
            with pytest.raises(rtnl.RtnlError) as missing:
                sock.index("nope")
            assert missing.value.errno == errno.ENODEV
    finally:
        os.close(fd)
    assert os.readlink("/proc/thread-self/ns/net") == own  # this thread is back where it was
    host = json.loads(ip(node, "-j", "-d", "link", "show", "hx1"))[0]
    assert host["master"] == "br9" and "UP" in host["flags"]
    with rtnl.Rtnl(f"/run/netns/{job}") as sock:
        sock.call([rtnl.encode_link_by_name("lo", up=True), rtnl.encode_link_by_name("eth0", up=True)])
        index = sock.index("eth0")
        sock.call([rtnl.encode_addr("10.77.0.5", index),
                   rtnl.encode_route("10.77.0.1", oif=index, scope=rtnl.RT_SCOPE_LINK),
                   rtnl.encode_route(None, via="10.77.0.1", oif=index)])
    rtnl.in_netns_write(f"/run/netns/{job}", "/proc/sys/net/ipv4/conf/eth0/accept_redirects", "0")
    assert "10.77.0.5/32" in ip(job, "-4", "addr", "show", "eth0")
    routes = ip(job, "route")
    assert "default via 10.77.0.1 dev eth0" in routes and "10.77.0.1 dev eth0 scope link" in routes
    assert subprocess.run(["ip", "netns", "exec", job, "cat", "/proc/sys/net/ipv4/conf/eth0/accept_redirects"],
                          capture_output=True, text=True, check=True).stdout.strip() == "0"


def test_many_routes_in_batches_and_a_removal_of_one_already_gone(two: tuple[str, str]) -> None:
    node, _ = two
    ip(node, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
    ip(node, "link", "set", "d1", "up")
    ip(node, "addr", "add", "192.168.5.1/24", "dev", "d0")
    ip(node, "link", "set", "d0", "up")
    wanted = [f"10.66.{i // 250}.{i % 250 + 2}" for i in range(3 * rtnl._BATCH + 7)]
    with rtnl.Rtnl(f"/run/netns/{node}") as sock:
        sock.call([rtnl.encode_route(a, via="192.168.5.9", proto=77, replace=True) for a in wanted])
        shown = json.loads(ip(node, "-j", "-4", "route", "show", "proto", "77"))
        assert sorted(r["dst"] for r in shown) == sorted(wanted)
        ip(node, "route", "del", f"{wanted[0]}/32")
        gone = [rtnl.encode_route(a, proto=77, delete=True) for a in wanted]
        with pytest.raises(rtnl.RtnlError) as refused:
            sock.call(gone)
        assert refused.value.errno == errno.ESRCH
        assert json.loads(ip(node, "-j", "-4", "route", "show", "proto", "77")) == []  # the rest went anyway
        sock.call(gone, tolerate=frozenset({errno.ESRCH}))
