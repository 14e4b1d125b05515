"""Values that are well-formed for argparse or protobuf but not for a job: the CLI refuses each with
one line and exit 2 before it contacts anything, the API refuses the same request from any other
client at once (not after a timeout), and nothing is created either way."""

import json
import os
import subprocess
import time
from typing import Any

import grpc
import pytest

from tests.conftest import BIN, Cluster
from tests.e2e.test_errors import one_line_error

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

BAD_RUNS = [
    (["--cpus", "nan"], "--cpus"),
    (["--cpus", "inf"], "--cpus"),
    (["--cpus", "-1"], "--cpus"),
    (["--memory", "99999999999TiB"], "--memory"),
    (["--gpu-memory", "99999999999TiB"], "--gpu-memory"),
    (["--priority", "100000000000000000000000"], "--priority"),
    (["--priority", "-100000000000000000000000"], "--priority"),
    (["--gpus", "99999999999"], "--gpus"),
    (["--name", "trailing-newline\n"], "--name"),
    (["--name", "x" * 64], "--name"),
    (["--name", "a.b"], "--name"),
    (["--env", "A\nB=c"], "--env"),
    (["--env", "1A=c"], "--env"),
    (["--checkpoint-every", "1e400"], "--checkpoint-every"),
    (["--deadline", "99999d"], "--deadline"),
    (["--gpu-model", "H1\n00"], "--gpu-model"),
    (["--label", "no-value"], "--label"),
    (["--label", "bad key=x"], "--label"),
]


@pytest.mark.parametrize(("flags", "flag"), BAD_RUNS)
def test_cli_refuses_before_contacting_anything(flags: list[str], flag: str) -> None:
    env = {**os.environ, "FERRY_ADDR": "127.0.0.1:1"}  # nothing listens there
    result = subprocess.run([str(BIN / "ferry"), "run", *flags, "--", "true"], env=env, capture_output=True,
                            text=True, timeout=30)
    line = one_line_error(result, 2)
    assert flag in line, line
    assert "Traceback" not in result.stderr


def _raw_submit(addr: str, fields: dict[str, Any]) -> grpc.RpcError:
    """SubmitJob straight through gRPC, as a client other than the CLI would send it."""
    from ferry.v1 import ferry_pb2 as pb
    from ferry.v1 import ferry_pb2_grpc as pb_grpc

    with grpc.insecure_channel(addr) as channel:
        try:
            pb_grpc.FerryAdminStub(channel).SubmitJob(pb.SubmitJobRequest(**{"argv": ["sleep", "600"], **fields}),
                                                      timeout=20)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError(f"the API accepted {fields}")


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "api-nan", "cpus": float("nan")},
        {"name": "api-inf", "checkpoint_every_s": float("inf")},
        {"name": "api-huge-memory", "memory_bytes": 2**62},
        {"name": "api-priority", "priority": 2**31 - 1},
        {"name": "api-gpus", "gpus": 2**31 - 1},
        {"name": "api-newline\n"},
        {"name": "y" * 64},
        {"name": "api-env", "env": {"A\nB": "c"}},
        {"name": "api-cwd", "cwd": "relative/dir"},
        {"name": "api-nul", "argv": ["sleep", "6\x0000"]},
        {"name": "api-empty", "argv": [""]},
        {"name": "api-label", "labels": {"-x": "y"}},
    ],
    ids=lambda f: str(f.get("name", ""))[:20].strip(),
)
def test_api_refuses_what_the_cli_refuses(cluster: Cluster, fields: dict[str, Any]) -> None:
    started = time.monotonic()
    err = _raw_submit(cluster.addr, fields)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert "\n" not in (err.details() or "") and (err.details() or "").startswith(("bad ", "empty "))
    assert time.monotonic() - started < 10, "refused only after a timeout"
    names = {j["name"] for j in json.loads(cluster.ferry("ps", "-a", "-o", "json").stdout)}
    assert not any(n.startswith(("api-", "yyyy")) for n in names), names


def test_a_taken_name_exits_2_and_the_first_job_runs_on(cluster: Cluster) -> None:
    first = cluster.json("run", "--name", "taken", "--node", "node-1", "--", "sleep", "600")
    line = one_line_error(cluster.ferry("run", "--name", "taken", "--", "true", check=False), 2)
    assert "taken" in line and "exists already" in line
    status = cluster.json("status", "taken")
    assert status["id"] == first["id"] and status["state"] == "running"
    cluster.ferry("kill", "taken")


def test_a_name_with_a_newline_is_never_stored(cluster: Cluster) -> None:
    one_line_error(cluster.ferry("run", "--name", "nl\n", "--", "true", check=False), 2)
    assert "nl\n" not in {j["name"] for j in cluster.json("ps", "-a")}


async def test_the_scheduler_ends_the_op_of_a_command_it_cannot_decode(cluster: Cluster) -> None:
    """A client that skipped the API's checks (here: NaN cpus straight on the bus) gets its op
    ended with exit code 2 instead of waiting for an answer that never comes."""
    import asyncio

    from ferry.common import wire
    from ferry.common.bus import Bus
    from ferry.common.models import Op, OpKind, OpState, new_id
    from ferry.common.natsauth import read_creds

    creds = read_creds(cluster.data_dir / "secrets" / "nats" / "api.json")  # a client with the API's rights
    bus = await Bus.connect(cluster.up_state()["nats_url"], "test-malformed", creds=creds, create=False)
    try:
        op = Op(id=new_id("op"), kind=OpKind.SUBMIT)
        await bus.ops.put(op.id, op)
        spec = '{"name": "bus-nan", "argv": ["true"], "cpus": NaN}'
        body = f'{{"op": "{op.id}", "kind": "submit", "spec": {spec}}}'
        await bus.js.publish(wire.SCHEDULER_CMD, body.encode())
        deadline = time.monotonic() + 15
        while (current := await bus.ops.get(op.id)) is None or not current.finished:
            assert time.monotonic() < deadline, "the op of a malformed command was never ended"
            await asyncio.sleep(0.1)
        assert current.state == OpState.FAILED and current.error_code == 2
        assert current.error and current.error.startswith("malformed SchedulerCommand")
    finally:
        await bus.close()
    assert "bus-nan" not in {j["name"] for j in cluster.json("ps", "-a")}
