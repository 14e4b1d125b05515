"""`ferry mcp`: Ferry's tools for an operator's agent, over MCP (stdio, or streamable HTTP on loopback).

Every tool is a call to the admin API with the agent's own token (FERRY_TOKEN), so the API's rules
hold for the agent as for anyone: its tenant's jobs only, and, for a token of role ``agent``, a
reason on every action and its tenant's hourly limits. On top of that, every action here is a dry
run unless the agent passes ``dry_run=false``: the answer then says what would happen (the API's
Plan, checked like the call itself). Read-only tools carry MCP's readOnlyHint, actions its
destructiveHint, so a client can ask a person first. Bad arguments, unknown jobs or nodes and
refused actions come back as a ToolError of one sentence; nothing changes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from ferry.cli.agent.api import Api
from ferry.cli.output import job_dict, to_dict
from ferry.common.errors import UsageError
from ferry.policy import plans, signals
from ferry.v1 import ferry_pb2 as pb

INSTRUCTIONS = """Ferry keeps long-running jobs alive and cheap: it checkpoints them (CRIU), moves them
between nodes, and restores them after failures. Watch with the read-only tools (cluster_health,
sla_risk, spot_market, queue, savings, explain); act with checkpoint, migrate, drain and restore.
Actions are dry runs unless you pass dry_run=false: look at the plan first. Every action needs a
reason, which the audit trail keeps. The skill skills/ferry/SKILL.md has runbooks."""

EVENTS_KEPT = 500
EVENTS_RETRY_S = 5.0
READ = ToolAnnotations(readOnlyHint=True, idempotentHint=True, openWorldHint=False)
ACTS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False, openWorldHint=False)
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"

Job = Annotated[str, Field(description="the job's name or id", pattern=NAME)]
NodeId = Annotated[str, Field(description="a node's id, as list_nodes shows it", pattern=NAME)]
Reason = Annotated[str, Field(description="why you do this, in one sentence: the audit trail records it",
                              min_length=3, max_length=500)]
DryRun = Annotated[bool, Field(description="true (the default): only say what would happen; false: do it")]


def one_sentence(tool: str, exc: ValidationError) -> str:
    """An argument error as one sentence (pydantic's own message spans lines and links)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "arguments"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"bad argument {where!r} to {tool}: {first['msg'][:1].lower()}{first['msg'][1:]}{more}"


class FerryMCP(MCPServer[Any]):
    """MCPServer whose argument errors read as one sentence."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(one_sentence(name, exc.__cause__)) from exc.__cause__
            raise


class ActionResult(BaseModel):
    """What an action did, or (dry run) would do."""

    dry_run: bool
    summary: str
    plan: plans.Plan | None = None  # a dry run's plan
    result: dict[str, Any] = {}  # what the API answered when it was done


class EventLog:
    """The newest events of the cluster, followed from the API in a thread (resource ferry://events)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self.error = ""

    def start(self) -> None:
        threading.Thread(target=self._follow, name="ferry-events", daemon=True).start()

    def _follow(self) -> None:
        while True:  # the API restarts, or is not up yet: follow again (a daemon thread: it ends with us)
            try:
                client = self.api.client()
                for ev in client.stream(client.stub.WatchEvents, pb.WatchEventsRequest()):
                    d = to_dict(ev)
                    d["data"] = json.loads(d.pop("data_json") or "{}")
                    self.events.append(d)
                    self.error = ""
            except Exception as exc:  # the resource says so instead of going quiet
                self.error = str(exc)
            time.sleep(EVENTS_RETRY_S)


def build_server(api: Api) -> MCPServer[Any]:  # noqa: C901  (one function per tool, registered here)
    events = EventLog(api)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        events.start()
        yield

    mcp = FerryMCP(name="ferry", instructions=INSTRUCTIONS, lifespan=lifespan, log_level="WARNING")

    # ---- read-only ------------------------------------------------------------------------

    @mcp.tool(annotations=READ, description="The jobs this token may see: name, state, node, SLA, checkpoints.")
    async def list_jobs(all: Annotated[bool, Field(description="include ended jobs")] = False
                        ) -> list[dict[str, Any]]:
        reply = await api.unary("ListJobs", pb.ListJobsRequest(all=all))
        return [job_dict(j) for j in reply.jobs]

    @mcp.tool(annotations=READ, description="One job in full: state, node, restarts, last checkpoint, labels.")
    async def job_status(job: Job) -> dict[str, Any]:
        return job_dict(await api.unary("GetJob", pb.JobRef(job=job)))

    @mcp.tool(annotations=READ, description="The nodes: state, capacity, price, spot or not, jobs, GPUs, CRIU.")
    async def list_nodes() -> list[dict[str, Any]]:
        return [to_dict(n) for n in (await api.unary("ListNodes", pb.ListNodesRequest())).nodes]

    @mcp.tool(annotations=READ, description="Nodes by state, unusable nodes and why, GPU conditions (XIDs), "
              "failing checkpoints and failed jobs of the last day.")
    async def cluster_health() -> signals.Health:
        return signals.Health.model_validate(await api.signal("cluster_health"))

    @mcp.tool(annotations=READ, description="Jobs waiting for capacity, by priority and resource shape: how many, "
              "how long, and why no node takes them.")
    async def queue() -> signals.Queue:
        return signals.Queue.model_validate(await api.signal("queue"))

    @mcp.tool(annotations=READ, description="Jobs with a deadline or downtime limit, riskiest first: the chance of "
              "an interruption on their node, the work one would lose, deadline slack, downtime budget, a suggestion.")
    async def sla_risk() -> list[signals.SlaRisk]:
        return [signals.SlaRisk.model_validate(r) for r in await api.signal("sla_risk")]

    @mcp.tool(annotations=READ, description="Per zone and instance type: spot and on-demand price, discount, the "
              "spot price's last change (trend), nodes and interruptions seen.")
    async def spot_market() -> list[signals.Market]:
        return [signals.Market.model_validate(m) for m in await api.signal("spot_market")]

    @mcp.tool(annotations=READ, description="What the fleet saved so far against the same nodes on demand, and "
              "the saving per hour at today's prices.")
    async def savings() -> signals.Savings:
        return signals.Savings.model_validate(await api.signal("savings"))

    @mcp.tool(annotations=READ, description="Why a job is where it is: its node's score, every alternative, and "
              "what a move would save, cost and pause it for.")
    async def explain(job: Job) -> signals.Explanation:
        return signals.Explanation.model_validate(await api.signal("explain", job))

    @mcp.tool(annotations=READ, description="Capacity planning: replay a job of job_hours with a deadline over "
              "spot-availability traces (files on this machine) and compare Ferry's policy with on-demand only "
              "and simple baselines.")
    async def simulate(traces: Annotated[list[str], Field(min_length=1, description="trace files (JSON)")],
                       job_hours: Annotated[float, Field(gt=0)], deadline_hours: Annotated[float, Field(gt=0)],
                       on_demand_price: Annotated[float, Field(gt=0)] = 3.06,
                       spot_price: Annotated[float, Field(ge=0)] = 0.92,
                       checkpoint_every: str = "10m") -> dict[str, Any]:
        from ferry.cli.simulate import report_dict, run_simulation

        args = argparse.Namespace(trace=traces, job_hours=job_hours, deadline_hours=deadline_hours,
                                  on_demand_price=on_demand_price, spot_price=spot_price,
                                  checkpoint_every=checkpoint_every, checkpoint_time="30s", restore_time="60s",
                                  start_hour=0.0)
        return await api.run(lambda: report_dict(run_simulation(args)))

    # ---- actions: dry runs unless dry_run=false --------------------------------------------

    async def planned(request: pb.PlanRequest) -> ActionResult:
        plan = plans.Plan.model_validate(await api.plan(request))
        return ActionResult(dry_run=True, summary=plan.summary, plan=plan)

    @mcp.tool(annotations=ACTS, description="Checkpoint a running job (stop=true: then stop it, freeing its node; "
              "restore brings it back). Dry run unless dry_run=false.")
    async def checkpoint(job: Job, reason: Reason, stop: bool = False, dry_run: DryRun = True) -> ActionResult:
        request = pb.CheckpointRequest(job=job, stop=stop)
        if dry_run:
            return await planned(pb.PlanRequest(checkpoint=request))
        final = await api.op("Checkpoint", request, reason)
        c = final.checkpoint
        return ActionResult(dry_run=False, summary=f"checkpoint {c.id} of {job}: {c.bytes_logical} bytes, frozen "
                            f"{c.freeze_ms:.0f} ms" + ("; the job stopped" if c.final else ""), result=to_dict(c))

    @mcp.tool(annotations=ACTS, description="Move a running job to another node (live=true: a short freeze, its "
              "memory follows). Look at explain and a dry run first. Dry run unless dry_run=false.")
    async def migrate(job: Job, to: NodeId, reason: Reason, live: bool = False,
                      dry_run: DryRun = True) -> ActionResult:
        request = pb.MigrateRequest(job=job, to=to, live=live)
        if dry_run:
            return await planned(pb.PlanRequest(migrate=request))
        final = await api.op("Migrate", request, reason)
        result = json.loads(final.result_json or "{}") if live else job_dict(final.job)
        return ActionResult(dry_run=False, summary=f"{job} runs on {final.job.node or to} "
                            f"({final.total_ms / 1000:.1f}s)", result=result)

    @mcp.tool(annotations=ACTS, description="Restore a stopped job from its newest checkpoint (or the one named), "
              "on a node or where the scheduler picks. Dry run unless dry_run=false.")
    async def restore(job: Job, reason: Reason, node: NodeId | None = None,
                      checkpoint_id: Annotated[str | None, Field(pattern=NAME)] = None,
                      dry_run: DryRun = True) -> ActionResult:
        request = pb.RestoreRequest(job=job, node=node or "", checkpoint=checkpoint_id or "")
        if dry_run:
            return await planned(pb.PlanRequest(restore=request))
        final = await api.op("Restore", request, reason)
        return ActionResult(dry_run=False, summary=f"{job} restored on {final.job.node}", result=job_dict(final.job))

    @mcp.tool(annotations=ACTS, description="Drain a node: its jobs move elsewhere (parked when nothing fits) and "
              "no new job is placed there; undo=true lets it take work again. Dry run unless dry_run=false.")
    async def drain(node: NodeId, reason: Reason, undo: bool = False, dry_run: DryRun = True,
                    wait_s: Annotated[float, Field(ge=0, le=3600)] = 300.0) -> ActionResult:
        request = pb.DrainNodeRequest(node=node, undo=undo, wait_s=0.0 if undo else wait_s)
        if dry_run:
            return await planned(pb.PlanRequest(drain=request))
        done = await api.unary("DrainNode", request, reason, timeout=request.wait_s + 60)
        return ActionResult(dry_run=False, summary=f"{node} is {done.state}", result=to_dict(done))

    # ---- resources ----------------------------------------------------------------------

    @mcp.resource("ferry://events", mime_type="application/json",
                  description="The cluster's newest events (up to 500), oldest first.")
    def recent_events() -> str:
        if events.error and not events.events:
            raise ToolError(f"cannot follow the events: {events.error}")
        return json.dumps(list(events.events))

    @mcp.resource("ferry://jobs/{name}", mime_type="application/json", description="One job, as job_status.")
    async def job_resource(name: str) -> str:
        return json.dumps(job_dict(await api.unary("GetJob", pb.JobRef(job=name))))

    return mcp


def cmd_mcp(args: argparse.Namespace) -> int:
    api = Api(args.addr)
    server = build_server(api)
    if not args.http:
        server.run("stdio")
        return 0
    host, _, port = args.http.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        raise UsageError(f"bad --http {args.http!r}: give a loopback HOST:PORT, e.g. 127.0.0.1:8765 (MCP over HTTP "
                         "has no TLS here; put a TLS proxy in front to reach it from elsewhere)")
    server.run("streamable-http", host=host, port=int(port))
    return 0
