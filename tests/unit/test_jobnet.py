"""The bridge network's pure parts: addresses, published ports, a node's routes and forwards."""

from __future__ import annotations

import socket

import pytest

from ferry.common.errors import UsageError
from ferry.common.jobnet import PortMap, allocate, check_range, gateway, host_if, overlapping, parse_publish
from ferry.common.models import Job, JobState, Network, Node
from ferry.node.bridge import port_taken
from ferry.policy.decisions import NodeView
from ferry.policy.netplan import NetState, node_net_state, published_conflict, with_job_network


def test_addresses_are_allocated_lowest_first_skipping_the_gateway_and_held_ones() -> None:
    assert gateway("10.88.0.0/16") == "10.88.0.1"
    assert allocate("10.88.0.0/16", []) == "10.88.0.2"
    assert allocate("10.88.0.0/16", ["10.88.0.2", "10.88.0.4"]) == "10.88.0.3"
    full = [f"10.0.0.{i}" for i in range(2, 15)]
    with pytest.raises(UsageError, match="has no free address"):
        allocate("10.0.0.0/28", full)


def test_after_the_last_given_address_the_next_free_one_comes_and_the_range_wraps() -> None:
    held = {"10.0.0.2", "10.0.0.3", "10.0.0.5"}
    assert allocate("10.0.0.0/28", held, after="10.0.0.3") == "10.0.0.4"
    assert allocate("10.0.0.0/28", held | {"10.0.0.4"}, after="10.0.0.3") == "10.0.0.6"
    assert allocate("10.0.0.0/28", held, after="10.0.0.14") == "10.0.0.4"  # past the last: from the lowest
    assert allocate("10.0.0.0/28", held, after="192.168.1.1") == "10.0.0.4"  # not in the range: from the lowest
    assert allocate("10.0.0.0/28", held, after="nonsense") == "10.0.0.4"
    asked: list[str] = []

    class Held:  # 10.88.0.2 to 10.88.195.79 held; counts what allocate asks
        def __contains__(self, address: object) -> bool:
            asked.append(str(address))
            a, b = (int(x) for x in str(address).split(".")[2:])
            return 2 <= a * 256 + b < 50_000

    assert allocate("10.88.0.0/16", Held(), after="10.88.195.79") == "10.88.195.80"
    assert asked == ["10.88.195.80"]  # the next one is free: none of the 50,000 held ones is looked at


@pytest.mark.parametrize(("cidr", "why"), [
    ("10.88.0.1/16", "has host bits set"), ("8.8.8.0/24", "not a private range"), ("10.0.0.0/30", "at least /28"),
    ("fd00::/64", "IPv4"), ("nonsense", "does not appear to be"),
])
def test_a_bad_range_is_refused(cidr: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        check_range(cidr)


def test_the_veth_name_is_the_same_everywhere_and_fits_the_kernel() -> None:
    name = host_if("job-0123456789ab")
    assert name == host_if("job-0123456789ab") and name != host_if("job-0123456789ac")
    assert len(name) <= 15 and name.startswith("fj")


def test_a_range_overlapping_a_node_address_is_named() -> None:
    assert overlapping("10.88.0.0/16", [("lo", "127.0.0.1/8"), ("eth0", "192.168.1.5/24")]) is None
    assert overlapping("10.88.0.0/16", [("ferry0", "10.88.0.1/16")]) is None  # its own bridge
    why = overlapping("10.88.0.0/16", [("eth0", "10.0.0.5/8")])
    assert why is not None and "overlaps 10.0.0.5/8 on eth0" in why


def test_publish_parses_host_job_and_protocol() -> None:
    assert parse_publish("8080:80") == PortMap(host=8080, job=80, proto="tcp")
    assert str(parse_publish("53:5353/udp")) == "53:5353/udp"


def _job(name: str, node: str | None, address: str | None, *, state: JobState = JobState.RUNNING,
         publish: tuple[str, ...] = (), network: Network = Network.BRIDGE) -> Job:
    return Job(id=f"job-{name}", name=name, argv=["x"], node=node, address=address, state=state,
               network=network, publish=[parse_publish(p) for p in publish])


def test_a_live_job_holds_its_published_ports_across_the_cluster() -> None:
    jobs = [_job("web", "n1", "10.88.0.2", publish=("8080:80",)),
            _job("old", None, "10.88.0.3", state=JobState.SUCCEEDED, publish=("9090:90",))]
    why = published_conflict([parse_publish("8080:81")], jobs)
    assert why is not None and "8080/tcp is published by job web" in why
    assert published_conflict([parse_publish("8080:80/udp")], jobs) is None  # another protocol
    assert published_conflict([parse_publish("9090:90")], jobs) is None  # its job ended
    assert published_conflict([parse_publish("8080:80")], jobs, me="job-web") is None


def test_each_node_routes_the_others_jobs_and_forwards_its_own_ports() -> None:
    nodes = [Node(id="n1", net_ip="10.87.1.11"), Node(id="n2", net_ip="10.87.1.12"), Node(id="n3")]
    jobs = [_job("a", "n1", "10.88.0.2", publish=("8080:80",)), _job("b", "n2", "10.88.0.3"),
            _job("c", "n3", "10.88.0.4"),  # its node has no job network: nobody can route it
            _job("d", "n2", "10.88.0.5", state=JobState.FAILED), _job("e", "n1", None, network=Network.HOST),
            _job("f", None, "10.88.0.6", state=JobState.PREEMPTED)]
    assert node_net_state("n1", jobs, nodes) == NetState({"10.88.0.3": "10.87.1.12"},
                                                         {("tcp", 8080): ("10.88.0.2", 80)})
    assert node_net_state("n2", jobs, nodes) == NetState({"10.88.0.2": "10.87.1.11"}, {})


def test_a_node_without_a_job_network_takes_no_bridge_job() -> None:
    views = [NodeView(id="n1", spot=False, price_per_hour=0), NodeView(id="n2", spot=False, price_per_hour=0)]
    nodes = [Node(id="n1", net_ip="10.87.1.11"), Node(id="n2", net_error="no root")]
    out = with_job_network(views, nodes)
    assert out[0].usable and not out[1].usable
    assert out[1].reason == "node n2 has no job network (no root)"


def test_a_port_a_node_process_listens_on_is_not_published_there() -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        job = _job("web", "n1", "10.88.0.2", publish=(f"{port}:80",))
        why = port_taken(job, "")
        assert why is not None and f"port {port}/tcp is taken on this node" in why
        assert port_taken(job, "/run/netns/ferry-x-n1") is None  # a node namespace of its own listens on nothing
        assert port_taken(_job("udp", "n1", "10.88.0.3", publish=(f"{port}:80/udp",)), "") is None
