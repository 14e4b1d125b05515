"""The attacks of the security issue, each tried against a real `ferry up` with tokens: the bus is
closed (no credentials, or another role's, get nothing done), tenants see only their own, and a
job's secrets are nowhere in the clear but in the workload.

One cluster for the module, with three tokens: two users of tenants acme and globex and an admin.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
import yaml
from nats.aio.client import Client as NatsClient

from ferry.common import wire
from ferry.common.models import Job, OpKind, new_id
from tests.conftest import BIN, PY, Cluster, start_cluster, stop_cluster, wait_until
from tests.tenants import Tenants, make_token

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

SECRET_ENV = "sk-env-5e1f-DO-NOT-LEAK"
SECRET_FILE = "sk-file-77aa-DO-NOT-LEAK"
SLEEPER = [PY, "-c", "import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.2)\n"]


@pytest.fixture(scope="module")
def tenants(criu_bin: str) -> Iterator[Tenants]:
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-sec-"))
    tokens = {"acme": make_token(data_dir, "acme", "user", "acme-ci"),
              "globex": make_token(data_dir, "globex", "user", "globex-ci"),
              "admin": make_token(data_dir, "ops", "admin", "alice")}
    tokens_file = data_dir / "secrets" / "tokens.yaml"
    table = yaml.safe_load(tokens_file.read_text())
    table["tenants"] = {"globex": {"quota": {"jobs": 1, "cpus": 2}}}
    tokens_file.write_text(yaml.safe_dump(table))
    c = start_cluster(data_dir, env={"FERRY_TOKEN": tokens["admin"]})
    yield Tenants(c, tokens)
    stop_cluster(c)


def _creds(cluster: Cluster, user: str) -> dict[str, str]:
    return dict(json.loads((cluster.data_dir / "secrets" / "nats" / f"{user}.json").read_text()))


async def _connect(cluster: Cluster, user: str | None, errors: list[str]) -> NatsClient:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    auth = _creds(cluster, user) if user else {}
    return await nats.connect(cluster.up_state()["nats_url"], error_cb=on_error, allow_reconnect=False,
                              max_reconnect_attempts=0, connect_timeout=2, **auth)


def _forged_submit(name: str) -> bytes:
    cmd = wire.SchedulerCommand(op=new_id("op"), kind=OpKind.SUBMIT,
                                spec=wire.JobSpec(name=name, argv=["sh", "-c", "id > /tmp/ferry-pwned"]))
    return wire.encode(cmd)


def test_nats_refuses_a_client_without_credentials(tenants: Tenants) -> None:
    async def attempt() -> str:
        try:
            nc = await _connect(tenants.cluster, None, [])
        except Exception as exc:  # nats raises its own Error for an authorization violation
            return str(exc)
        await nc.close()
        return "connected"

    assert "Authorization Violation" in asyncio.run(attempt())


def test_a_node_can_neither_submit_kill_nor_pose_as_another_node(tenants: Tenants) -> None:
    c = tenants.cluster
    victim = tenants.json("acme", "run", "--name", "sec-victim", "--", *SLEEPER)
    errors: list[str] = []

    async def attack() -> None:
        nc = await _connect(c, "checkpointer@node-1", errors)
        js = nc.jetstream(timeout=2)
        kill = wire.SchedulerCommand(op=new_id("op"), kind=OpKind.KILL, job=victim["id"])
        fake = Job(id="node-9", name="x", argv=["x"])
        for subject, body in ((wire.SCHEDULER_CMD, _forged_submit("sec-forged")),  # forged submit
                              (wire.SCHEDULER_CMD, wire.encode(kill)),  # forged kill
                              ("$KV.ferry_nodes.node-9", wire.encode(fake)),  # a fake node's record
                              (wire.node_event_subject("node-2", "started"), b"{}"),  # another node's report
                              ("$KV.ferry_jobs." + victim["id"], b"{}")):  # rewriting a job
            with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
                await js.publish(subject, body)
        await asyncio.sleep(0.5)
        await nc.close()

    asyncio.run(attack())
    denied = [e for e in errors if "permissions violation" in e.lower()]
    assert len(denied) >= 5, errors
    time.sleep(2)
    names = {j["name"] for j in tenants.json("admin", "ps", "-a")}
    assert "sec-forged" not in names and not Path("/tmp/ferry-pwned").exists()
    assert tenants.json("acme", "status", "sec-victim")["state"] == "running"
    assert "node-9" not in {n["id"] for n in tenants.json("admin", "nodes")}
    tenants.ferry("acme", "kill", "sec-victim")


def test_the_api_cannot_command_a_node_and_a_node_cannot_read_anothers_commands(tenants: Tenants) -> None:
    errors: list[str] = []

    async def attack() -> None:
        nc = await _connect(tenants.cluster, "api", errors)
        js = nc.jetstream(timeout=2)
        with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
            await js.publish(wire.node_cmd_subject("node-1", "checkpointer"), b"{}")
        await nc.close()
        nc = await _connect(tenants.cluster, "migrator@node-1", errors)
        with pytest.raises(Exception):  # noqa: B017 - a timeout or an API error: either way, nothing to read
            await nc.jetstream(timeout=2).pull_subscribe(
                wire.node_cmd_subject("node-2", "migrator"), durable="spy", stream=wire.CMD_STREAM)
        await nc.close()

    asyncio.run(attack())
    assert any('publish to "ferry.cmd.node.node-1.checkpointer"' in e for e in errors), errors
    assert any("permissions violation" in e.lower() and "spy" in e.lower() for e in errors), errors


def test_a_workload_reaches_nats_without_credentials_and_is_refused(tenants: Tenants) -> None:
    url = tenants.cluster.up_state()["nats_url"]
    probe = ("import asyncio, os, nats\n"
             "print(sorted(k for k in os.environ if k.startswith('FERRY_')), flush=True)\n"
             "async def main():\n"
             "    try:\n"
             f"        await nats.connect({url!r}, allow_reconnect=False, connect_timeout=2)\n"
             "        print('connected', flush=True)\n"
             "    except Exception as exc:\n"
             "        print('refused:', exc, flush=True)\n"
             "asyncio.run(main())\n")
    tenants.ferry("acme", "run", "--name", "sec-probe", "--network", "host", "--", PY, "-c", probe)
    assert tenants.ferry("acme", "wait", "sec-probe", "--timeout", "60", check=False).returncode == 0
    out = tenants.ferry("acme", "logs", "sec-probe").stdout.splitlines()
    assert out[0] == "[]" and out[1].startswith("refused:") and "Authorization Violation" in out[1], out


READER = """
import json, os, sys, time
paths = sys.argv[1:]
def tried(path):
    try:
        with open(path, "rb") as f:
            return "read %d bytes" % len(f.read())
    except OSError as exc:
        return type(exc).__name__
for i in range(100000):
    disks = sorted(n for n in os.listdir("/dev") if n.startswith(("vd", "sd", "nvme", "loop", "zram")))
    print(json.dumps({"i": i, "files": {p: tried(p) for p in paths}, "disks": disks}), flush=True)
    time.sleep(0.2)
"""


def test_a_workload_cannot_read_the_nodes_secrets_before_or_after_a_move(tenants: Tenants) -> None:
    """Jobs run as root: what keeps them from the node's NATS password, store keyring and other
    jobs' files is the empty tmpfs over the data dir in the job's own mount namespace, its own
    /dev without disks, and no CAP_SYS_ADMIN to undo either; a checkpoint and a move keep all."""
    c = tenants.cluster
    secrets = c.data_dir / "secrets"
    targets = [secrets / "nats" / "checkpointer@node-1.json", secrets / "store.keys", secrets / "env.key",
               c.data_dir / "nats-1.conf" if (c.data_dir / "nats-1.conf").exists() else c.data_dir / "nats.conf",
               c.data_dir / "up.json"]
    assert all(t.is_file() for t in targets), [t for t in targets if not t.is_file()]
    tenants.json("acme", "run", "--name", "sec-read", "--node", "node-1", "--", PY, "-c", READER,
                 *map(str, targets))

    def lines() -> list[dict[str, Any]]:
        return [json.loads(x) for x in tenants.ferry("acme", "logs", "sec-read").stdout.splitlines()]

    wait_until(lambda: len(lines()) >= 3, 60, "the reader's first lines")
    tenants.json("acme", "checkpoint", "sec-read")
    tenants.json("acme", "migrate", "sec-read", "--to", "node-2")
    wait_until(lambda: (s := tenants.json("acme", "status", "sec-read"))["node"] == "node-2"
               and s["state"] == "running", 90, "the reader to run on node-2")
    moved_at = len(lines())
    wait_until(lambda: len(lines()) >= moved_at + 3, 60, "the reader's lines after the move")
    seen = lines()
    assert [x["i"] for x in seen] == list(range(len(seen))), "the reader started over"
    for line in seen:
        assert set(line["files"].values()) <= {"PermissionError", "FileNotFoundError"}, line
        assert line["disks"] == [], line
    tenants.ferry("acme", "kill", "sec-read")


def test_a_tenant_sees_and_touches_only_its_own_jobs(tenants: Tenants) -> None:
    tenants.json("acme", "run", "--name", "sec-acme", "--", *SLEEPER)
    assert tenants.json("acme", "whoami")["tenant"] == "acme"
    assert "sec-acme" not in {j["name"] for j in tenants.json("globex", "ps", "-a")}
    for args in (["status", "sec-acme"], ["logs", "sec-acme"], ["kill", "sec-acme"], ["checkpoint", "sec-acme"],
                 ["checkpoints", "sec-acme"], ["migrate", "sec-acme", "--to", "node-2"]):
        refused = tenants.ferry("globex", *args, check=False)
        assert refused.returncode == 2 and "no job 'sec-acme'" in refused.stderr, (args, refused.stderr)
    assert tenants.json("acme", "status", "sec-acme")["state"] == "running"
    assert tenants.json("admin", "status", "sec-acme")["tenant"] == "acme"  # an admin sees every tenant
    drain = tenants.ferry("acme", "drain", "node-1", check=False)
    assert drain.returncode == 2 and "for admins" in drain.stderr
    chaos = tenants.ferry("acme", "chaos", "kill-node", "node-1", check=False)
    assert chaos.returncode == 2 and "for admins" in chaos.stderr
    wrong = subprocess.run([str(BIN / "ferry"), "ps"], env={**tenants.cluster.env, "FERRY_TOKEN": "fy_guess"},
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "wrong API token" in wrong.stderr
    tenants.ferry("acme", "kill", "sec-acme")


def test_quotas_are_enforced_at_submit(tenants: Tenants) -> None:
    tenants.json("globex", "run", "--name", "sec-g1", "--cpus", "1", "--", *SLEEPER)
    refused = tenants.ferry("globex", "run", "--name", "sec-g2", "--", *SLEEPER, check=False)
    assert refused.returncode == 2 and "would use 2 jobs, over its quota of 1:" in refused.stderr, refused.stderr
    me = tenants.json("globex", "whoami")
    assert me["quota"]["jobs"] == 1 and me["used"]["jobs"] == 1 and me["used"]["cpus"] == 1
    tenants.ferry("globex", "kill", "sec-g1")
    too_big = tenants.ferry("globex", "run", "--name", "sec-g3", "--cpus", "3", "--", *SLEEPER, check=False)
    assert too_big.returncode == 2 and "would use 3 cpus, over its quota of 2:" in too_big.stderr


def test_every_mutating_call_is_audited(tenants: Tenants) -> None:
    tenants.json("acme", "run", "--name", "sec-audit", "--", "true")  # allowed
    tenants.ferry("acme", "drain", "node-2", check=False)  # refused: in the trail all the same
    entries = wait_until(lambda: (e := tenants.json("admin", "audit", "--since", "1h"))
                         and any(x["method"] == "DrainNode" for x in e) and e, 30, "the audit entries")
    denied = [e for e in entries if e["method"] == "DrainNode" and e["who"] == "acme-ci"]
    assert denied and denied[-1]["outcome"] == "PERMISSION_DENIED" and denied[-1]["target"] == "node-2"
    mine = tenants.json("acme", "audit", "--since", "1h")
    assert mine and {e["tenant"] for e in mine} == {"acme"}
    assert any(e["method"] == "SubmitJob" and e["outcome"] == "ok" for e in mine)


def test_secrets_reach_only_the_workload(tenants: Tenants, tmp_path: Path) -> None:
    c = tenants.cluster
    secret_file = tmp_path / "token"
    secret_file.write_text(SECRET_FILE + "\n")
    show = ("import os, time\n"
            "held = os.environ['API_KEY'] + os.environ['TOKEN']\n"
            "print(held, flush=True)\n"
            "for i in range(100000):\n    time.sleep(0.2)\n")
    tenants.json("acme", "run", "--name", "sec-env", "--env", f"API_KEY={SECRET_ENV}",
                 "--secret", f"TOKEN=@{secret_file}", "--", PY, "-c", show)
    wait_until(lambda: tenants.ferry("acme", "logs", "sec-env").stdout.strip(), 60, "the job's first line")
    assert tenants.ferry("acme", "logs", "sec-env").stdout.strip() == SECRET_ENV + SECRET_FILE  # the workload has it
    status = tenants.ferry("acme", "status", "sec-env", "-o", "json").stdout
    assert SECRET_ENV not in status and SECRET_FILE not in status and '"API_KEY": "<sealed>"' in status
    tenants.json("acme", "checkpoint", "sec-env")

    async def read_bus() -> bytes:
        nc = await _connect(c, "api", [])
        js = nc.jetstream()
        seen = b""
        for bucket in (wire.KV_JOBS, wire.KV_OPS, wire.KV_CHECKPOINTS):
            kv = await js.key_value(bucket)
            try:
                keys = await kv.keys()
            except nats.js.errors.NoKeysError:  # the ops bucket is empty once every operation has ended
                keys = []
            for key in keys:
                entry = await kv.get(key)
                seen += entry.value or b""
        for stream in (wire.EVT_STREAM,):
            info = await js.stream_info(stream)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                with_msg = await js.get_msg(stream, seq)
                seen += with_msg.data or b""
        await nc.close()
        return seen

    seen = asyncio.run(read_bus()) + tenants.ferry("admin", "audit", "-o", "json").stdout.encode()
    assert b"sec-env" in seen  # the job's record was read
    assert SECRET_ENV.encode() not in seen and SECRET_FILE.encode() not in seen
    stored = [p.read_bytes() for p in (c.data_dir / "store" / "packs").rglob("*") if p.is_file()]
    assert stored and not any(SECRET_ENV.encode() in b or SECRET_FILE.encode() in b for b in stored)
    tenants.ferry("acme", "kill", "sec-env")


def test_a_tampered_manifest_is_refused_in_one_line(tenants: Tenants) -> None:
    c = tenants.cluster
    job = tenants.json("acme", "run", "--name", "sec-mf", "--", *SLEEPER)
    wait_until(lambda: tenants.ferry("acme", "logs", "sec-mf").stdout.count("\n") >= 3, 60, "output")
    ck = tenants.json("acme", "checkpoint", "sec-mf", "--stop")["id"]
    path = c.data_dir / "store" / "manifests" / job["id"] / f"{ck}.json"
    body = json.loads(path.read_text())
    signature = body.pop("signature")
    del body["digest"]
    body["meta"]["forged"] = True  # an attacker with write access to the store: the digest is fixed up
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    body["digest"], body["signature"] = hashlib.sha256(canonical).hexdigest(), signature
    path.write_text(json.dumps(body))
    restored = tenants.ferry("acme", "restore", "sec-mf", check=False)
    assert restored.returncode != 0
    assert "manifest refused" in restored.stderr and len(restored.stderr.strip().splitlines()) == 1, restored.stderr
    shutil.rmtree(c.data_dir / "store" / "manifests" / job["id"], ignore_errors=True)
