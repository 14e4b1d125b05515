"""Pure parts: units, settings, wire formats, placement, CLI output and argument checks."""

import argparse
from pathlib import Path

import pytest

from ferry.cli import commands
from ferry.cli.main import build_parser
from ferry.cli.output import job_dict, to_dict
from ferry.common import wire
from ferry.common.config import load_settings
from ferry.common.errors import ConfigError, UsageError
from ferry.common.models import Job, JobState, Node, NodeState, OpKind, PriceRecord
from ferry.common.units import format_bytes, parse_duration, parse_size
from ferry.policy.placement import usable
from ferry.policy.views import effective_price, node_views
from ferry.v1 import ferry_pb2 as pb


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800), ("45", 45), ("1.5", 1.5),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "s", "1h-5m", "-3", "1 h"])
def test_parse_duration_refuses_garbage(text: str) -> None:
    with pytest.raises(UsageError):
        parse_duration(text)


def test_sizes() -> None:
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("512M") == 512 * 10**6
    assert parse_size("4096") == 4096
    with pytest.raises(UsageError):
        parse_size("lots")
    assert format_bytes(1536) == "1.5 KiB"


def test_settings_from_file_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "ferry.yaml"
    cfg.write_text("nats_url: nats://10.0.0.1:4222\nheartbeat-timeout-s: 9\ntoken: from-file\n")
    monkeypatch.setenv("FERRY_TOKEN", "from-env")
    s = load_settings(cfg)
    assert s.nats_url == "nats://10.0.0.1:4222" and s.heartbeat_timeout_s == 9 and s.token == "from-env"
    assert load_settings(cfg, token="from-flag").token == "from-flag"


def test_settings_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("heartbeat_timeout_s: -1\n")
    with pytest.raises(ConfigError, match="heartbeat_timeout_s"):
        load_settings(bad)
    bad.write_text("no_such_knob: 1\n")
    with pytest.raises(ConfigError, match="no_such_knob"):
        load_settings(bad)


def test_subjects_and_tokens() -> None:
    assert wire.node_cmd_subject("node-1", "checkpointer") == "ferry.cmd.node.node-1.checkpointer"
    assert wire.node_event_subject("n1", "exited") == "ferry.evt.node.n1.exited"
    assert wire.ckpt_key("job-1", "ck-2") == "job-1.ck-2"
    for bad in ("a.b", "a b", "*", ">", ""):
        with pytest.raises(wire.WireError):
            wire.token(bad)


def test_messages_round_trip_and_malformed_is_refused() -> None:
    cmd = wire.SchedulerCommand(op="op-1", kind=OpKind.SUBMIT, spec=wire.JobSpec(name="t", argv=["true"]))
    assert wire.decode(wire.SchedulerCommand, wire.encode(cmd)) == cmd
    with pytest.raises(wire.WireError):
        wire.decode(wire.SchedulerCommand, b'{"op": 1}')
    with pytest.raises(wire.WireError):
        wire.decode(wire.NodeEvent, b"not json")


def _node(i: int, **kw: object) -> Node:
    return Node.model_validate({"id": f"node-{i}", "criu_ok": True, "heartbeat": 1000.0, **kw})


def test_usable_nodes_and_their_free_capacity() -> None:
    nodes = [_node(1, cpus=4), _node(2, cpus=4), _node(3, criu_ok=False, criu_error="no criu"),
             _node(4, state=NodeState.LOST)]
    jobs = [Job(id="j1", name="a", argv=["x"], node="node-1", state=JobState.RUNNING, cpus=3),
            Job(id="j2", name="b", argv=["x"], node="node-1", state=JobState.PREEMPTED, cpus=3),
            Job(id="j3", name="c", argv=["x"], node="node-2", state=JobState.SUCCEEDED, cpus=3)]
    views = {v.id: v for v in node_views(nodes, jobs, now=1001.0, heartbeat_timeout_s=5)}
    assert views["node-1"].free_cpus == 1 and views["node-2"].free_cpus == 4
    assert views["node-1"].usable and not views["node-3"].usable and not views["node-4"].usable
    assert usable(nodes[2], 1001.0, 5) == "node node-3 has no usable CRIU (no criu)"
    assert "heartbeat" in (usable(_node(5), 2000.0, 5) or "")
    assert views["node-4"].reason == "node node-4 is lost"


def test_cli_output_keeps_numbers_and_all_fields() -> None:
    job = pb.Job(id="job-1", name="t", state="running", node="node-1", has_exit_code=False)
    d = job_dict(job)
    assert d["exit_code"] is None and d["last_checkpoint"] is None and d["node"] == "node-1"
    ck = to_dict(pb.Checkpoint(id="ck", bytes_logical=2**40))
    assert ck["bytes_logical"] == 2**40 and ck["log_excerpt"] == []


def test_run_arguments_are_checked_before_anything_starts(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--env", "A=1", "--env", "B=x=y", "--cwd", str(tmp_path), "--",
                              "python", "-c", "print(1)", "-o", "json"])
    commands.validate_run(args)
    assert args.request.argv == ["python", "-c", "print(1)", "-o", "json"]
    assert args.request.env == {"A": "1", "B": "x=y"}
    for bad in (["run", "--"], ["run", "--checkpoint-every", "soon", "--", "x"], ["run", "--env", "A", "--", "x"]):
        with pytest.raises(UsageError):
            commands.validate_run(parser.parse_args(bad))


def test_restore_takes_to_as_migrate_does() -> None:
    parser = build_parser()
    assert parser.parse_args(["restore", "t1", "--to", "node-2"]).node == "node-2"
    assert parser.parse_args(["restore", "t1", "--node", "node-3"]).node == "node-3"
    assert parser.parse_args(["restore", "t1"]).node is None


def test_every_command_takes_output_json() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert any("--output" in a.option_strings for a in p._actions), name


def test_price_feeds_override_a_nodes_declared_price() -> None:
    node = _node(1, spot=True, price_per_hour=0.92, labels={"zone": "us-east-1a", "instance_type": "p3.2xlarge"})
    feed = [PriceRecord(zone="us-east-1a", instance_type="p3.2xlarge", market="spot", price_per_hour=0.5, timestamp=1),
            PriceRecord(zone="us-east-1a", instance_type="p3.2xlarge", market="spot", price_per_hour=0.7, timestamp=2),
            PriceRecord(zone="us-east-1a", instance_type="p3.2xlarge", market="on-demand", price_per_hour=3.06),
            PriceRecord(zone="us-east-1b", instance_type="p3.2xlarge", market="spot", price_per_hour=0.1)]
    assert effective_price(node, feed) == 0.7  # the newest spot price of its zone and type
    assert effective_price(node, []) == 0.92
    (view,) = node_views([node], [], now=1001.0, heartbeat_timeout_s=5, prices=feed)
    assert view.price_per_hour == 0.7


def test_cluster_events_have_their_subjects_in_wire() -> None:
    from ferry.common import wire

    assert wire.cluster_event_subject("node_lost", "node-1") == "ferry.evt.cluster.node_lost.node-1"
    price = wire.cluster_event_subject("price", "us-east-1a.m5_large.spot")
    assert price == "ferry.evt.cluster.price.us-east-1a_m5_large_spot"
    assert wire.cluster_event_subject("price_feed_error") == "ferry.evt.cluster.price_feed_error"
    assert wire.is_user_event(wire.job_event_subject("job-1", "started"))
    assert wire.is_user_event(wire.cluster_event_subject("node_lost", "n"))
    assert not wire.is_user_event(wire.node_event_subject("n", "started"))


@pytest.mark.parametrize("argv", [
    ["nodes", "-o", "json"], ["-o", "json", "ps", "-a"], ["--addr", "127.0.0.1:1", "status", "t1"],
    ["run", "--name", "t", "--", "python", "-c", "print(1)", "nodes"], ["pod", "checkpoints", "k8s.ml.p.main"],
    ["--reason", "ray up", "ray", "up", "--workers", "3"], ["store", "verify"], ["signals"],
    ["simulate", "--help-not", "x"], ["slurm", "bridge"]])
def test_a_command_parses_the_same_with_only_its_own_parser(argv: list[str]) -> None:
    from ferry.cli.main import HANDLERS, LOCAL, command_of

    name = command_of(argv)
    assert name in HANDLERS or name in LOCAL
    try:
        want = vars(build_parser().parse_args(argv))
    except SystemExit as exc:  # refused by the whole parser: refused alike by the command's
        with pytest.raises(SystemExit) as again:
            build_parser(name).parse_args(argv)
        assert again.value.code == exc.code
        return
    assert vars(build_parser(name).parse_args(argv)) == want
    only = build_parser(name)
    sub = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [name]  # the others were not built


def test_the_command_is_found_past_the_global_options() -> None:
    from ferry.cli.main import command_of

    assert command_of(["-o", "json", "--addr", "x:1", "nodes"]) == "nodes"
    assert command_of(["--output=json", "ps"]) == "ps"
    assert command_of(["-h"]) is None and command_of([]) is None and command_of(["--", "nodes"]) is None
