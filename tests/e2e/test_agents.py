"""An operator's agent drives a real cluster through `ferry mcp`, as an MCP client over stdio (the
MCP SDK's own client), with an agent token whose tenant allows one move an hour: it lists the tools,
dry-runs a move (nothing moves), moves a job for real (its output stays identical to a run that
was never moved), is refused a second move (over the limit) and a job of another tenant (unknown to
it), and bad arguments. The audit trail keeps the reason of every action."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import BIN, PY, ROOT, WORKLOADS, Cluster, reference_output, start_cluster, stop_cluster
from tests.tenants import Tenants, make_token

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

TRAIN = [PY, str(WORKLOADS / "train.py"), "--steps", "160", "--sleep", "0.02", "--width", "1024"]
SLEEPER = [PY, "-c", "import time\nfor i in range(100000):\n    print(i, flush=True)\n    time.sleep(0.2)\n"]
WHY = "node-1 is about to be reclaimed (test)"


class Fleet(Tenants):
    def __init__(self, cluster: Cluster, tokens: dict[str, str]) -> None:
        super().__init__(cluster, tokens, timeout=300)

    def tools(self, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
        """Each call's result, made by the MCP SDK's client through one `ferry mcp` over stdio."""
        env = {**os.environ, **self.cluster.env, "FERRY_TOKEN": self.tokens["agent"]}
        server = StdioServerParameters(command=str(BIN / "ferry"), args=["mcp"], env=env)

        async def run() -> list[Any]:
            async with Client(server, read_timeout_seconds=300) as client:
                return [await (client.read_resource(name) if name.startswith("ferry://") else
                               client.call_tool(name, args)) for name, args in calls]

        return asyncio.run(run())


@pytest.fixture(scope="module")
def fleet(criu_bin: str) -> Iterator[Fleet]:
    data_dir = Path(tempfile.mkdtemp(prefix="ferry-agent-"))
    tokens = {"agent": make_token(data_dir, "acme", "agent", "claw"),
              "acme": make_token(data_dir, "acme", "user", "acme-ci"),
              "globex": make_token(data_dir, "globex", "user", "globex-ci"),
              "admin": make_token(data_dir, "ops", "admin", "alice")}
    tokens_file = data_dir / "secrets" / "tokens.yaml"
    table = yaml.safe_load(tokens_file.read_text())
    table["tenants"] = {"acme": {"agent_limits": {"moves_per_hour": 1, "drains_per_hour": 0}}}
    tokens_file.write_text(yaml.safe_dump(table))
    c = start_cluster(data_dir, env={"FERRY_TOKEN": tokens["admin"]})
    yield Fleet(c, tokens)
    stop_cluster(c)


def _text(result: Any) -> str:
    return " ".join(getattr(part, "text", "") for part in result.content)


def test_the_tools_are_listed_with_schemas_and_hints(fleet: Fleet) -> None:
    env = {**os.environ, **fleet.cluster.env, "FERRY_TOKEN": fleet.tokens["agent"]}

    async def run() -> Any:
        async with Client(StdioServerParameters(command=str(BIN / "ferry"), args=["mcp"], env=env)) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in asyncio.run(run())}
    assert set(tools) >= {"list_jobs", "job_status", "list_nodes", "cluster_health", "queue", "sla_risk",
                          "spot_market", "savings", "checkpoint", "migrate", "drain", "restore", "simulate", "explain"}
    for name in ("migrate", "drain", "checkpoint", "restore"):
        assert tools[name].annotations.destructive_hint is True, name
        assert {"reason", "dry_run"} <= set(tools[name].input_schema["properties"]), name
        assert "reason" in tools[name].input_schema["required"], name
    for name in ("sla_risk", "spot_market", "cluster_health", "explain", "queue", "savings"):
        assert tools[name].annotations.read_only_hint is True, name
        assert tools[name].output_schema, name


def test_a_dry_run_moves_nothing_a_real_move_keeps_the_output_and_the_limit_holds(fleet: Fleet) -> None:
    want = reference_output(TRAIN)
    fleet.json("acme", "run", "--name", "ag-train", "--node", "node-1", "--", *TRAIN)
    fleet.json("globex", "run", "--name", "ag-other", "--node", "node-1", "--", *SLEEPER)
    fleet.cluster.wait_lines("ag-train", 20)

    job_id = fleet.json("acme", "status", "ag-train")["id"]
    dry, real, record, again, foreign, no_reason, bad_type, health, risk, events = fleet.tools(
        ("migrate", {"job": "ag-train", "to": "node-2", "reason": WHY}),
        ("migrate", {"job": "ag-train", "to": "node-2", "reason": WHY, "dry_run": False}),
        ("ferry://jobs/ag-train", {}),
        ("migrate", {"job": "ag-train", "to": "node-1", "reason": WHY, "dry_run": False}),
        ("migrate", {"job": "ag-other", "to": "node-2", "reason": WHY, "dry_run": False}),
        ("migrate", {"job": "ag-train", "to": "node-1", "dry_run": False}),
        ("migrate", {"job": "ag-train", "to": 7, "reason": WHY}),
        ("cluster_health", {}),
        ("sla_risk", {}),
        ("ferry://events", {}),  # last: the move's events have had the other calls' time to arrive
    )
    assert not dry.is_error, _text(dry)
    assert dry.structured_content["dry_run"] is True
    assert dry.structured_content["plan"]["action"] == "migrate"
    assert dry.structured_content["summary"].startswith("would move ag-train from node-1")

    assert not real.is_error, _text(real)
    assert real.structured_content["dry_run"] is False and real.structured_content["result"]["node"] == "node-2"

    seen = json.loads(events.contents[0].text)  # followed since the server started: the move's events
    assert any(e["job"] == job_id for e in seen), seen
    assert json.loads(record.contents[0].text)["node"] == "node-2"

    assert again.is_error and "over this agent's limit of 1 moves per hour" in _text(again)
    assert foreign.is_error and "no job 'ag-other'" in _text(foreign)
    assert no_reason.is_error and _text(no_reason) == "bad argument 'reason' to migrate: field required"
    assert bad_type.is_error and _text(bad_type) == "bad argument 'to' to migrate: input should be a valid string"
    assert not health.is_error and health.structured_content["nodes"] == {"ready": 2}
    assert not risk.is_error

    # nothing but the one real move happened: the job ran on node-2 to the end, the other tenant's
    # job never left node-1
    assert fleet.json("admin", "status", "ag-other")["node"] == "node-1"
    assert fleet.ferry("acme", "wait", "ag-train", "--timeout", "300").returncode == 0
    assert fleet.json("acme", "status", "ag-train")["node"] == "node-2"
    assert fleet.cluster.logs("ag-train") == want

    audit = fleet.json("admin", "audit", "--since", "1h")
    moves = [e for e in audit if e["method"] == "Migrate" and e["who"] == "claw"]
    assert [(e["outcome"], e["reason"]) for e in moves] == [
        ("ok", WHY), ("RESOURCE_EXHAUSTED", WHY), ("NOT_FOUND", WHY)], moves
    fleet.ferry("globex", "kill", "ag-other")


def test_the_cli_with_an_agent_token_needs_a_reason_and_explains(fleet: Fleet) -> None:
    fleet.json("acme", "run", "--name", "ag-cli", "--node", "node-1", "--deadline", "2h", "--work", "30m", "--",
               *SLEEPER)
    fleet.cluster.wait_lines("ag-cli", 2)
    risk = next(r for r in fleet.json("agent", "signals", "sla-risk") if r["job"] == "ag-cli")
    assert 1700 < risk["remaining_work_s"] < 1800 and risk["slack_s"] > 5000 and risk["risk"] == "low", risk
    assert fleet.json("agent", "status", "ag-cli")["ran_s"] > 0
    refused = fleet.ferry("agent", "checkpoint", "ag-cli", check=False)
    assert refused.returncode == 2 and "an agent must say why" in refused.stderr
    assert refused.stderr.count("\n") == 1
    done = fleet.json("agent", "checkpoint", "ag-cli", "--reason", "before a risky config change")
    assert done["id"]
    drain = fleet.ferry("agent", "drain", "node-1", "--reason", "overnight shrink", "--dry-run", check=False)
    assert drain.returncode == 2 and "limit of 0 drains per hour" in drain.stderr
    explained = fleet.json("agent", "explain", "ag-cli")
    assert explained["node"] == "node-1" and {a["node"] for a in explained["alternatives"]} == {"node-1", "node-2"}
    there = fleet.ferry("agent", "migrate", "ag-cli", "--to", "node-1", "--dry-run", "--reason", "cheaper", check=False)
    assert there.returncode == 1 and "runs on node-1 already" in there.stderr
    fleet.ferry("acme", "kill", "ag-cli")


def test_openclaw_finds_the_skill_eligible_and_probes_the_mcp_tools(fleet: Fleet, tmp_path: Path) -> None:
    modules = ROOT / ".tools" / "agents" / "node_modules"
    openclaw = modules / ".bin" / "openclaw"
    node_bins = sorted(modules.glob("node-linux-*/bin"))
    assert openclaw.exists() and node_bins, f"OpenClaw or Node 24 is not in {modules}: run ./setup.sh"
    config = tmp_path / "openclaw.json"
    config.write_text(json.dumps({
        "skills": {"load": {"extraDirs": [str(ROOT / "skills")]}},
        "mcp": {"servers": {"ferry": {"command": str(BIN / "ferry"), "args": ["mcp"], "env": {
            "FERRY_ADDR": fleet.cluster.addr, "FERRY_TOKEN": fleet.tokens["agent"]}}}}}))
    env = {"PATH": f"{node_bins[0]}:{BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path),
           "OPENCLAW_STATE_DIR": str(tmp_path / "state"), "OPENCLAW_CONFIG_PATH": str(config),
           "FERRY_ADDR": fleet.cluster.addr}

    def openclaw_json(*args: str, without: str = "") -> Any:
        run_env = {k: v for k, v in env.items() if k != without}
        out = subprocess.run([str(openclaw), *args, "--json"], env=run_env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    info = openclaw_json("skills", "info", "ferry")
    assert info["eligible"] is True and info["filePath"] == str(ROOT / "skills" / "ferry" / "SKILL.md")
    assert info["requirements"]["bins"] == ["ferry"] and info["primaryEnv"] == "FERRY_TOKEN"
    gated = openclaw_json("skills", "info", "ferry", without="FERRY_ADDR")
    assert gated["eligible"] is False and gated["missing"]["env"] == ["FERRY_ADDR"]

    probe = openclaw_json("mcp", "probe", "ferry")
    assert probe["servers"]["ferry"]["tools"] == 14, probe
    assert {"ferry__migrate", "ferry__sla_risk", "ferry__spot_market", "ferry__drain"} <= set(probe["tools"])
