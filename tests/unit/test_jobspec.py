"""The rules of a job request (ferry.common.jobspec): one line naming the flag, for every client."""

import re

import pytest

from ferry.common import wire
from ferry.common.errors import UsageError
from ferry.common.jobspec import EXEC_MAX, check_request
from ferry.common.models import Network
from ferry.common.sealing import SealedEnv, new_key_pair, seal_env
from ferry.criu.runner import job_criu_args


def refused(**fields: object) -> str:
    with pytest.raises(UsageError) as info:
        check_request({"argv": ["true"], **fields})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_plain_request_passes_and_becomes_a_spec() -> None:
    request = check_request({"name": "t1", "argv": ["python", "x.py"], "env": {"A_1": "x\ny"}, "cwd": "/tmp",
                             "cpus": 1.5, "memory_bytes": "1024", "deadline_s": 60.0})
    sealed = seal_env(request.env, new_key_pair()[1], "acme")
    spec = request.to_spec("t1", now=1000.0, env=sealed)
    assert spec.deadline == 1060.0 and spec.memory_bytes == 1024 and spec.cwd == "/tmp" and spec.node is None
    assert spec.env.names == ["A_1"] and "x\ny" not in spec.model_dump_json()
    assert check_request({"argv": ["true"]}).to_spec("gen", now=0, env=SealedEnv()).name == "gen"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"cpus": float("nan")}, "bad --cpus nan: it must be a finite number"),
        ({"cpus": "NaN"}, "bad --cpus 'NaN': it must be a finite number"),  # what protobuf's JSON gives
        ({"checkpoint_every_s": float("inf")}, "bad --checkpoint-every inf: it must be a finite number"),
        ({"memory_bytes": 2**60}, "bad --memory 1048576.0 TiB: it must be at most 1024.0 TiB"),
        ({"priority": 10**23}, "bad --priority 100000000000000000000000: it must be at most 1000000"),
        ({"priority": -(10**23)}, "bad --priority -100000000000000000000000: it must be at least -1000000"),
        ({"gpus": 99999999999}, "bad --gpus 99999999999: it must be at most 1024"),
        ({"cpus": -1}, "bad --cpus -1: it must be at least 0"),
    ],
)
def test_numbers_must_be_finite_and_in_range(fields: dict[str, object], expected: str) -> None:
    assert refused(**fields) == expected


@pytest.mark.parametrize("name", ["t1\n", "a.b", "a b", "x" * 64, "ä"])
def test_names_are_one_subject_token_of_at_most_63(name: str) -> None:
    assert refused(name=name).startswith("bad --name")
    assert check_request({"name": "x" * 63, "argv": ["true"]}).name == "x" * 63


def test_environment_command_and_cwd() -> None:
    assert "variable name 'A\\nB'" in refused(env={"A\nB": "c"})
    assert refused(env={"1A": "c"}).startswith("bad --env")
    assert refused(env={"A": "x\0y"}) == "bad --env: the value of A holds a NUL byte"
    assert refused(argv=[]).startswith("empty command")
    assert refused(argv=[""]).startswith("empty command")
    assert refused(argv=["a\0b"]) == "bad command: an argument holds a NUL byte"
    assert refused(cwd="relative").startswith("bad --cwd 'relative'")
    assert refused(argv=["x" * EXEC_MAX]).startswith("the command and --env together are")
    assert refused(bogus=1) == "unknown field 'bogus' in the job request"


def test_labels_are_kept_and_checked() -> None:
    labels = {"source": "slurm", "slurm.job": "42", "example.com/team": "nlp = 2"}
    request = check_request({"argv": ["true"], "labels": labels})
    assert request.to_spec("t", now=0, env=SealedEnv()).to_job("j1", "op1").labels == labels
    assert refused(labels={"-a": "x"}).startswith("bad --label: label '-a': use 1 to 63 letters")
    assert refused(labels={"a b": "x"}).startswith("bad --label: label 'a b'")
    assert refused(labels={"x" * 64: "x"}).startswith("bad --label")
    assert refused(labels={"a": "x\ny"}) == "bad --label: the value of label a: at most 253 printable characters"
    assert refused(labels={"a": "x" * 254}).startswith("bad --label: the value of label a")
    assert refused(labels={f"k{i}": "v" for i in range(33)}) == "bad --label: at most 32 labels"


def test_tokens_end_at_the_end_of_the_string() -> None:
    assert wire.is_token("node-1") and not wire.is_token("node-1\n") and not wire.is_token("")
    with pytest.raises(wire.WireError):
        wire.token("job\n")


def test_the_op_of_an_undecodable_command_is_read_leniently() -> None:
    assert wire.op_of(b'{"op": "op-1", "kind": "submit", "spec": {"cpus": NaN}}') == "op-1"
    assert wire.op_of(b'{"op": "a.b"}') is None
    assert wire.op_of(b"not json") is None
    assert wire.op_of(b"[1]") is None


def test_a_spec_becomes_a_job_with_every_field_it_carries() -> None:
    from ferry.common.models import Job
    from ferry.common.wire import JobSpec

    spec = JobSpec(name="t1", argv=["python", "x.py"], env=SealedEnv(names=["A"], sealed="c2VhbGVk"), cwd="/w",
                   node="n1", checkpoint_every_s=60,
                   priority=3, cpus=2, memory_bytes=1 << 30, gpus=1, deadline=5.0, max_downtime_s=1.0,
                   gpu_model="H100", gpu_memory_bytes=1 << 34, gpu_shared=True)
    job = spec.to_job("job-1", "op-1")
    assert (job.id, job.op, job.requested_node, job.node) == ("job-1", "op-1", "n1", None)
    for field in set(JobSpec.model_fields) - {"node"}:
        assert field in Job.model_fields, field  # a spec field the job record would drop
        assert getattr(job, field) == getattr(spec, field), field


def test_a_network_is_bridge_isolated_or_host() -> None:
    assert check_request({"argv": ["true"], "network": "isolated"}).to_spec(
        "n", now=0, env=SealedEnv()).network == Network.ISOLATED
    assert check_request({"argv": ["true"]}).to_spec("n", now=0, env=SealedEnv()).network == Network.BRIDGE
    for caller in ({"here": True, "node": "n1"}, {"adopt_pid": 7, "node": "n1"}, {"bundle": "/b"}):
        assert check_request({"argv": ["true"], **caller}).to_spec("n", now=0, env=SealedEnv()).network == Network.HOST
    spec = check_request({"argv": ["true"], "network": "bridge", "publish": ["8080:80", "53:5353/udp"]}).to_spec(
        "n", now=0, env=SealedEnv())
    assert spec.network == Network.BRIDGE
    assert [str(m) for m in spec.publish] == ["8080:80/tcp", "53:5353/udp"]
    assert refused(network="lan").startswith("bad --network 'lan': unknown network 'lan'")


@pytest.mark.parametrize(("fields", "error"), [
    ({"network": "bridge", "publish": ["80"]}, "--publish '80': use HOST_PORT:JOB_PORT[/tcp|udp], e.g. 8080:80"),
    ({"network": "bridge", "publish": ["70000:80"]}, "--publish '70000:80': ports are 1 to 65535"),
    ({"network": "bridge", "publish": ["80:80/sctp"]}, "--publish '80:80/sctp': use HOST_PORT:JOB_PORT"),
    ({"network": "bridge", "publish": ["80:1", "80:2"]}, "bad --publish: host port 80/tcp is given twice"),
    ({"network": "host", "publish": ["80:80"]}, "--publish needs --network bridge"),
    ({"network": "bridge", "image": "oci:/x"}, "--network: a container has the network its bundle's"),
    ({"network": "bridge", "here": True, "node": "n1"}, "--network bridge: a job run --here or adopted"),
])
def test_published_ports_are_checked(fields: dict[str, object], error: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_request({"argv": ["true"], **fields})
    assert str(caught.value).startswith(error)


def test_a_here_job_names_its_node() -> None:
    assert check_request({"argv": ["true"], "here": True, "node": "n1"}).to_spec("n", now=0, env=SealedEnv()).here
    with pytest.raises(UsageError, match="--here: say which node this is"):
        check_request({"argv": ["true"], "here": True})


def test_a_container_names_a_bundle_or_a_local_image() -> None:
    spec = check_request({"argv": ["sh"], "image": "oci-archive:/srv/app.tar:v1"}).to_spec("n", now=0, env=SealedEnv())
    assert (spec.image, spec.bundle) == ("oci-archive:/srv/app.tar:v1", None)
    job = spec.to_job("job-1", "op-1")
    assert job.container and not job.adopted
    assert refused(image="docker.io/busybox").startswith("bad --image")
    assert refused(bundle="relative/dir").startswith("bad --bundle")
    with pytest.raises(UsageError, match="not both"):
        check_request({"argv": ["sh"], "image": "oci:/l", "bundle": "/b"})
    with pytest.raises(UsageError, match="--network"):
        check_request({"argv": ["sh"], "bundle": "/b", "network": "isolated"})


def test_every_dump_and_restore_of_an_isolated_job_keeps_its_connections() -> None:
    assert job_criu_args("host") == ()
    assert job_criu_args("isolated") == ("--tcp-established", "--network-lock", "nftables")
    assert job_criu_args("host", ["--tcp-established"]) == ("--tcp-established", "--network-lock", "nftables")
    assert job_criu_args("isolated", ["--tcp-established"]).count("--tcp-established") == 1
    assert job_criu_args("host", adopted=True) == ("--shell-job",)


@pytest.mark.parametrize(("fields", "error"), [
    ({"gang": "g", "network": "host"}, "--gang needs --network bridge"),
    ({"gang": "g", "network": "isolated"}, "--gang needs --network bridge"),
    ({"gang": "g", "here": True, "node": "n1"}, "--gang: a gang is moved and restarted by Ferry"),
    ({"gang": "a.b"}, "bad --gang 'a.b': use 1 to 63 letters"),
])
def test_a_gang_member_needs_a_bridge_network_and_ferry_as_its_supervisor(fields: dict[str, object],
                                                                          error: str) -> None:
    with pytest.raises(UsageError, match=re.escape(error)):
        check_request({"argv": ["x"], **fields})


def test_a_gang_member_is_a_bridge_job_by_default() -> None:
    spec = check_request({"argv": ["x"], "gang": "g1"}).to_spec("t1", 0.0, SealedEnv())
    assert spec.gang == "g1" and spec.network == Network.BRIDGE
