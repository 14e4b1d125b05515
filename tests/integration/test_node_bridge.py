"""The job network's bridge, routes and forwards made for real (``ip``, ``nft``) in a scratch
network namespace: routes added, moved, removed in batches, and a second node's service in the
same namespace reusing the bridge the first made."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from ferry.criu.rtnl import Request
from ferry.node.bridge import NodeNetwork
from ferry.policy.netplan import NetState

RANGE = "10.93.0.0/16"


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ferry-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    path = f"/run/netns/{name}"
    try:  # a next hop to route through: the node's side of the node network
        for cmd in (["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                    ["ip", "addr", "add", "192.168.77.1/24", "dev", "d0"],
                    ["ip", "link", "set", "d0", "up"], ["ip", "link", "set", "d1", "up"]):
            subprocess.run(["ip", "netns", "exec", name, *cmd], check=True)
        yield path
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_routes_and_forwards_follow_the_state_in_batches(netns: str) -> None:
    net = NodeNetwork(RANGE, netns)
    assert net.ensure() is None
    assert NodeNetwork(RANGE, netns).ensure() is None  # another service in the same namespace: the same bridge
    many = {f"10.93.1.{i}": "192.168.77.2" for i in range(2, 60)}
    net.apply(NetState(routes=many, forwards={("tcp", 18080): ("10.93.0.2", 80)}))
    assert net.routes() == many
    moved = {**{a: v for a, v in many.items() if a != "10.93.1.2"}, "10.93.1.3": "192.168.77.3",
             "10.93.2.9": "192.168.77.2"}
    net.apply(NetState(routes=moved, forwards={}))
    assert net.routes() == moved
    rules = subprocess.run(["ip", "netns", "exec", netns.rsplit("/", 1)[1], "nft", "list", "map", "ip", "ferry_jobs",
                            "fwd_tcp"], capture_output=True, text=True, check=True).stdout
    assert "18080" not in rules
    # between reads of the table, a pass is the requests for what changed (no read, no process)
    calls: list[tuple[str, ...]] = []
    sent: list[tuple[int, int]] = []
    run, routes = net._run, net._routes

    def counted(*argv: str, stdin: str | None = None, check: bool = True) -> str:
        calls.append(argv)
        return run(*argv, stdin=stdin, check=check)

    def counted_routes(replace: list[Request], gone: list[Request]) -> None:
        sent.append((len(replace), len(gone)))
        routes(replace, gone)

    net._run = counted  # type: ignore[method-assign]
    net._routes = counted_routes  # type: ignore[method-assign]
    back = {**moved, "10.93.1.2": "192.168.77.2"}
    net.apply(NetState(routes=back, forwards={}))
    assert calls == [] and sent == [(1, 0)]
    assert run("ip", "-j", "-4", "route", "show", "proto", "77") and net.routes() == back
    net.apply(NetState(routes=moved, forwards={}))
    assert net.routes() == moved
    # a route removed behind Ferry's back is made again at the first pass after the next read
    subprocess.run(["ip", "netns", "exec", netns.rsplit("/", 1)[1], "ip", "route", "del", "10.93.2.9/32"], check=True)
    net.apply(NetState(routes=moved, forwards={}))
    assert "10.93.2.9" not in net.routes()  # trusted what it applied: not read yet
    net.resync_s = 0.0
    net.apply(NetState(routes=moved, forwards={}))
    assert net.routes() == moved
    # one removed behind Ferry's back that the state drops too: no failure (gone is gone)
    subprocess.run(["ip", "netns", "exec", netns.rsplit("/", 1)[1], "ip", "route", "del", "10.93.1.5/32"], check=True)
    net.apply(NetState(routes={a: v for a, v in moved.items() if a != "10.93.1.5"}, forwards={}))
    assert "10.93.1.5" not in net.routes() and len(net.routes()) == len(moved) - 1
    net.apply(NetState())
    net.apply(NetState())
    assert net.routes() == {}
