"""The `ferry` commands that talk to a running cluster through the admin API."""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ferry.cli.client import ApiError, Client
from ferry.cli.insight import dry_run
from ferry.cli.output import ago, job_dict, print_json, size, table, to_dict
from ferry.common.errors import UsageError, from_kind
from ferry.common.labels import SOURCE_LABEL
from ferry.common.units import parse_duration, parse_size
from ferry.v1 import ferry_pb2 as pb


def _json(args: argparse.Namespace) -> bool:
    return bool(args.output == "json")


def cmd_nodes(client: Client, args: argparse.Namespace) -> int:
    nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
    if _json(args):
        print_json([to_dict(n) for n in nodes])
        return 0
    table([[n.id, n.state, f"{n.criu_version} ok" if n.criu_ok else f"unusable: {n.criu_error}",
            "yes" if n.lazy_pages else "no", len(n.jobs), ago(n.heartbeat)] for n in nodes],
          ["NODE", "STATE", "CRIU", "POST-COPY", "JOBS", "HEARTBEAT"])
    return 0


def parse_pairs(pairs: list[str], flag: str) -> dict[str, str]:
    """`KEY=VALUE` pairs (the value may hold '='); the last of a repeated key wins."""
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"bad {flag} {pair!r}: use KEY=VALUE")
        found[key] = value
    return found


def parse_env(pairs: list[str]) -> dict[str, str]:
    return parse_pairs(pairs, "--env")


def parse_labels(pairs: list[str]) -> dict[str, str]:
    return parse_pairs(pairs, "--label")


def parse_secrets(pairs: list[str]) -> dict[str, str]:
    """``NAME=@FILE`` pairs: each variable gets the content of its file (one trailing newline dropped)."""
    env = {}
    for pair in pairs:
        key, sep, ref = pair.partition("=@")
        if not sep or not key or not ref:
            raise UsageError(f"bad --secret {pair!r}: use NAME=@FILE, e.g. --secret API_KEY=@/run/keys/api")
        try:
            value = Path(ref).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"bad --secret {key}: cannot read {ref}: {getattr(exc, 'strerror', None) or exc}") from exc
        env[key] = value[:-1] if value.endswith("\n") else value
    return env


def validate_here(args: argparse.Namespace) -> None:
    """`--here` and its options (`run`, `restore`): --node defaults to FERRY_NODE_ID, this machine's node."""
    if not args.here:
        for flag, given in (("--cgroup", args.cgroup), ("--checkpoint-on-term", args.checkpoint_on_term),
                            ("--replay-output", getattr(args, "replay_output", False))):
            if given:
                raise UsageError(f"{flag} works only with --here")
        return
    args.node = args.node or os.environ.get("FERRY_NODE_ID", "")
    if not args.node:
        raise UsageError("--here: say which node this is with --node NODE (or FERRY_NODE_ID)")
    args.grace_s = parse_duration(args.grace_here)


def validate_adopt(args: argparse.Namespace) -> None:
    """`ferry adopt PID`: the process must be adoptable (``ferry.node.adopt``), checked here on its
    machine before anything is contacted; its command line and folder become the job's."""
    from ferry.common.jobspec import check_request  # pydantic loads only for what submits a job
    from ferry.node.adopt import adopt_problem, cgroup_problem  # psutil loads only for adopt

    args.node = args.node or os.environ.get("FERRY_NODE_ID", "")
    if not args.node:
        raise UsageError("adopt: say which node this machine is with --node NODE (or FERRY_NODE_ID)")
    me = os.getpid()
    ours = {me}
    pid = me
    while pid > 1:  # this command and its parents: adopting one would dump this command too
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        ours.add(pid)
    problem = adopt_problem(args.pid, callers=ours)
    if problem is None and args.cgroup:
        problem = cgroup_problem(args.pid, args.cgroup)
    if problem is not None:
        raise UsageError(f"cannot adopt {args.pid}: {problem}")
    try:
        argv = [a for a in Path(f"/proc/{args.pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
        cwd = os.readlink(f"/proc/{args.pid}/cwd")
    except OSError as exc:
        raise UsageError(f"cannot adopt {args.pid}: {exc.strerror or exc}") from exc
    args.request = check_request({"name": args.name or "", "argv": argv, "cwd": cwd, "node": args.node,
                                  "adopt_pid": args.pid})


def cmd_adopt(client: Client, args: argparse.Namespace) -> int:
    job = client.call(client.stub.SubmitJob, pb.SubmitJobRequest(**args.request.model_dump()))
    if _json(args):
        print_json(job_dict(job))
    else:
        print(f"{job.name} ({job.id}) adopted on {job.node}: process {args.pid} runs on where it is; Ferry watches "
              f"and checkpoints it")
    return 0


def validate_run(args: argparse.Namespace) -> None:
    """Checks `ferry run`'s arguments before anything is contacted or started: the same rules the
    API applies (ferry.common.jobspec), plus what only the caller's machine can tell (--cwd)."""
    from ferry.common.jobspec import check_request  # pydantic loads only for what submits a job

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    cwd = os.path.abspath(args.cwd) if args.cwd else os.getcwd()
    args.request = check_request({
        "name": args.name or "", "argv": argv, "cwd": cwd, "node": args.node or "",
        "env": {**parse_env(args.env or []), **parse_secrets(args.secret or [])},
        "checkpoint_every_s": parse_duration(args.checkpoint_every) if args.checkpoint_every is not None else 0.0,
        "priority": args.priority, "cpus": args.cpus,
        "memory_bytes": parse_size(args.memory) if args.memory is not None else 0, "gpus": args.gpus,
        "deadline_s": parse_duration(args.deadline) if args.deadline is not None else 0.0,
        "max_downtime_s": parse_duration(args.max_downtime) if args.max_downtime is not None else 0.0,
        "work_s": parse_duration(args.work) if args.work is not None else 0.0,
        "gpu_model": args.gpu_model or "",
        "gpu_memory_bytes": parse_size(args.gpu_memory) if args.gpu_memory is not None else 0,
        "gpu_shared": args.gpu_shared,
        "network": args.network, "here": args.here, "publish": getattr(args, "publish", []),
        "labels": parse_labels(getattr(args, "label", [])), "gang": getattr(args, "gang", None) or "",
        "bundle": os.path.abspath(args.bundle) if args.bundle else "", "image": args.image or "",
        "right_size": bool(getattr(args, "right_size", False)),
    })
    if args.bundle or args.image:  # bad input is refused here, before anything starts
        from ferry.criu.container import check_bundle, check_image

        if args.bundle:
            check_bundle(args.request.bundle)
        else:
            check_image(args.image)
    if not os.path.isdir(cwd):
        raise UsageError(f"--cwd {cwd}: no such directory")


def cmd_run(client: Client, args: argparse.Namespace) -> int:
    if args.here:
        from ferry.cli.here import run_here  # the foreground machinery loads only for --here

        return run_here(client, args)
    job = client.call(client.stub.SubmitJob, pb.SubmitJobRequest(**args.request.model_dump()))
    if _json(args):
        print_json(job_dict(job))
    elif job.state == "pending":
        print(f"{job.name} ({job.id}) is pending: {job.reason}")
    else:
        print(f"{job.name} ({job.id}) {job.state} on {job.node}")
    return 0


def _follow_op(client: Client, args: argparse.Namespace, method: Any, request: Any, title: str) -> pb.OpUpdate:
    from ferry.cli.progress import OpProgress  # rich loads only for commands that show progress

    final: pb.OpUpdate | None = None
    with OpProgress(title) as bar:
        for update in client.stream(method, request):
            if update.done:
                final = update
                break
            bar.update(update.phase, update.done_bytes, update.total_bytes)
    if final is None:
        raise ApiError("the API closed the stream before the operation ended; `ferry status` shows the job")
    if final.error:
        # the error that ended the op, as its kind (exit 2 for a NotFoundError or a UsageError)
        if final.error_kind:
            raise from_kind(final.error_kind, final.error)
        raise ApiError(final.error, final.error_code or 1)
    return final


def checkpoint_view(c: pb.Checkpoint) -> dict[str, Any]:
    d = to_dict(c)
    d["parent"] = d["parent"] or None
    d["error"] = d["error"] or None
    return d


def _job_or_gang(args: argparse.Namespace) -> None:
    if bool(args.job) == bool(args.gang):
        raise UsageError(f"{args.cmd}: name a job, or a gang with --gang (not both)")


def cmd_checkpoint(client: Client, args: argparse.Namespace) -> int:
    _job_or_gang(args)
    req = pb.CheckpointRequest(job=args.job, stop=args.stop, gang=args.gang or "")
    if args.gang and not args.dry_run:
        return _gang_done(args, _follow_op(client, args, client.stub.Checkpoint, req, f"checkpoint gang {args.gang}"))
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(checkpoint=req))
    final = _follow_op(client, args, client.stub.Checkpoint, req, f"checkpoint {args.job}")
    c = final.checkpoint
    if _json(args):
        print_json(checkpoint_view(c))
    else:
        print(f"{c.id}: {size(c.bytes_logical)} dumped, {size(c.bytes_uploaded)} uploaded; frozen {c.freeze_ms:.0f} ms,"
              f" dump {c.dump_ms:.0f} ms, upload {c.upload_ms:.0f} ms" + ("; job stopped" if c.final else ""))
    return 0


def _gang_done(args: argparse.Namespace, final: pb.OpUpdate) -> int:
    """What a gang's checkpoint or restore did (its op's result)."""
    result = json.loads(final.result_json or "{}")
    if _json(args):
        print_json({"op": final.op, "total_ms": final.total_ms, **result})
    elif "nodes" in result:
        names = result.get("names", {})
        where = ", ".join(sorted(f"{names.get(job, job)} on {node}" for job, node in result["nodes"].items()))
        print(f"gang {args.gang} restored from {result.get('group')} in {final.total_ms / 1000:.1f}s: {where}")
    else:
        print(f"gang {args.gang}: group checkpoint {result.get('group')} of {len(result.get('members', {}))} "
              f"members, {size(int(result.get('bytes_uploaded') or 0))} uploaded; network locked "
              f"{result.get('lock_ms', 0):.0f} ms, slowest freeze {result.get('freeze_ms', 0):.0f} ms (one after "
              f"another: {result.get('freeze_ms_sum', 0):.0f} ms)"
              + ("; members stopped" if result.get("stopped") else ""))
    return 0


def _moved(args: argparse.Namespace, final: pb.OpUpdate, verb: str) -> int:
    job = final.job
    result = json.loads(final.result_json or "{}")
    fallback = result.get("fallback")  # the checkpoint asked for did not verify
    lost = result.get("lost_s")  # a move's: the progress it cost the job (ferry.policy.lost)
    if _json(args):
        d = job_dict(job)
        d.update({"op": final.op, "checkpoint": final.checkpoint.id or None, "restore_ms": final.restore_ms,
                  "total_ms": final.total_ms, "fallback": fallback, "lost_s": lost,
                  "lost_basis": result.get("lost_basis")})
        print_json(d)
    else:
        print(f"{job.name} {verb} on {job.node} from {final.checkpoint.id or job.last_checkpoint} "
              f"in {final.total_ms / 1000:.1f}s" + (f", {lost:.1f}s of progress lost" if lost is not None else "")
              + (f" ({fallback})" if fallback else ""))
    return 0


def cmd_restore(client: Client, args: argparse.Namespace) -> int:
    if args.here:
        from ferry.cli.here import restore_here

        return restore_here(client, args)
    _job_or_gang(args)
    nodes = [n for n in (args.nodes or "").split(",") if n]
    req = pb.RestoreRequest(job=args.job, node=args.node or "", checkpoint=args.checkpoint or "",
                            gang=args.gang or "", nodes=nodes, allow_colocate=args.allow_colocate)
    if args.gang and not args.dry_run:
        return _gang_done(args, _follow_op(client, args, client.stub.Restore, req, f"restore gang {args.gang}"))
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(restore=req))
    return _moved(args, _follow_op(client, args, client.stub.Restore, req, f"restore {args.job}"), "restored")


def cmd_migrate(client: Client, args: argparse.Namespace) -> int:
    req = pb.MigrateRequest(job=args.job, to=args.to, live=args.live, tcp_established=args.tcp_established)
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(migrate=req))
    final = _follow_op(client, args, client.stub.Migrate, req, f"migrate {args.job}" + (" (live)" if args.live else ""))
    if not args.live:
        return _moved(args, final, "runs")
    result = json.loads(final.result_json or "{}")
    if _json(args):
        print_json(result)
        return 0
    def ms(key: str) -> str:
        return f"{result[key]:.0f} ms" if result.get(key) is not None else "-"
    print(f"{args.job} runs on {result.get('to')} ({result.get('mode')}): downtime {ms('downtime_ms')} "
          f"(freeze {ms('freeze_ms')}, restore {ms('restore_ms')}), degraded {ms('degraded_ms')}; "
          f"{result.get('rounds')} pre-copy round(s) shipped {size(int(result.get('bytes_precopy') or 0))}"
          + (f" ({result['round_why']})" if result.get("round_why") else "") + ", "
          f"the freeze {size(int(result.get('bytes_final') or 0))}; {ms('total_ms')} in all"
          + (f"; {result['lost_s']:.1f}s of progress lost" if result.get("lost_s") is not None else ""))
    return 0


def cmd_ps(client: Client, args: argparse.Namespace) -> int:
    wanted = parse_labels(args.label)
    if args.source:
        wanted[SOURCE_LABEL] = args.source
    jobs = [j for j in client.call(client.stub.ListJobs, pb.ListJobsRequest(all=args.all)).jobs
            if all(j.labels.get(k) == v for k, v in wanted.items())]
    if _json(args):
        print_json([job_dict(j) for j in jobs])
        return 0
    table([[j.name, j.id, j.state, j.node or "-", j.restarts, j.last_checkpoint or "-",
            j.exit_code if j.has_exit_code else "-", ago(j.created)] for j in jobs],
          ["NAME", "ID", "STATE", "NODE", "RESTARTS", "LAST CHECKPOINT", "EXIT", "CREATED"])
    return 0


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.call(client.stub.GetJob, pb.JobRef(job=args.job))
    d = job_dict(job)
    checkpoints = client.call(client.stub.ListCheckpoints, pb.JobRef(job=args.job)).checkpoints
    last = next((c for c in checkpoints if c.id == job.last_checkpoint), None)
    d["last_checkpoint_record"] = checkpoint_view(last) if last else None
    if _json(args):
        print_json(d)
        return 0
    for key in ("name", "id", "state", "node", "restarts", "exit_code", "reason", "error", "last_checkpoint"):
        if d.get(key) is not None:
            print(f"{key:16} {d[key]}")
    if last is not None:
        print(f"{'checkpointed':16} {ago(last.created)} on {last.node}, {size(last.bytes_logical)}")
    if job.HasField("last_move_lost_s"):
        print(f"{'last move':16} cost it {job.last_move_lost_s:.1f}s of progress, against the job unmoved")
    if job.work_s:
        print(f"{'ran':16} {job.ran_s / 60:.1f} min of about {job.work_s / 60:.1f} (--work)")
    if job.deadline:
        print(f"{'deadline':16} in {(job.deadline - time.time()) / 60:.1f} min")
    if job.adopt_pid:
        print(f"{'adopted':16} process {job.adopt_pid}, where its own supervisor started it (Ferry never restarts "
              f"or moves it; a restore makes it Ferry's)")
    if job.gang:
        print(f"{'gang':16} {job.gang} (group checkpoint {job.gang_checkpoint or 'none yet'})")
    if job.labels:
        print(f"{'labels':16} {', '.join(f'{k}={v}' for k, v in sorted(job.labels.items()))}")
    if job.here:
        print(f"{'here':16} in the foreground of a `--here` command on {job.node}, whose supervisor restarts it")
    network = job.network or "host"
    print(f"{'network':16} {network}" + _network_note(network, job.address))
    if job.publish:
        print(f"{'published':16} {', '.join(job.publish)} (on the node it runs on)")
    return 0


def _network_note(network: str, address: str) -> str:
    if network == "host":
        return " (its sockets bind the node's addresses; a restore may find its ports taken)"
    if network == "bridge":
        return f" (address {address or 'not allocated yet'}, kept on every node; checkpointed with the job)"
    return " (loopback only, checkpointed with the job)"


def cmd_checkpoints(client: Client, args: argparse.Namespace) -> int:
    records = client.call(client.stub.ListCheckpoints, pb.JobRef(job=args.job)).checkpoints
    if _json(args):
        print_json([checkpoint_view(c) for c in records])
        return 0
    table([[c.id, c.state, c.node, size(c.bytes_logical), size(c.bytes_uploaded), f"{c.freeze_ms:.0f}",
            "final" if c.final else "", ago(c.created)] for c in records],
          ["ID", "STATE", "NODE", "SIZE", "UPLOADED", "FROZEN MS", "", "CREATED"])
    return 0


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    req = pb.ReadLogsRequest(job=args.job, stream=args.stream, follow=args.follow)
    if _json(args) and not args.follow:
        data = b"".join(chunk.data for chunk in client.stream(client.stub.ReadLogs, req))
        print_json({"job": args.job, "stream": args.stream, "text": data.decode(errors="replace")})
        return 0
    out = sys.stdout.buffer
    for chunk in client.stream(client.stub.ReadLogs, req):
        if _json(args):
            print_json({"job": args.job, "stream": args.stream, "offset": chunk.offset,
                        "text": chunk.data.decode(errors="replace")})
        else:
            out.write(chunk.data)
            out.flush()
    return 0


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    timeout = parse_duration(args.timeout) if args.timeout else 0.0
    job = client.call(client.stub.WaitJob, pb.WaitJobRequest(job=args.job, timeout_s=timeout),
                      timeout=timeout + 30 if timeout else None)
    if _json(args):
        print_json(job_dict(job))
    else:
        print(f"{job.name} {job.state}" + (f" with exit code {job.exit_code}" if job.has_exit_code else ""))
    if job.has_exit_code:
        return int(job.exit_code)
    return 0 if job.state == "succeeded" else 1


def cmd_kill(client: Client, args: argparse.Namespace) -> int:
    grace = parse_duration(args.grace) if args.grace else 5.0
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(kill=pb.KillJobRequest(job=args.job, grace_s=grace)))
    job = client.call(client.stub.KillJob, pb.KillJobRequest(job=args.job, grace_s=grace))
    if _json(args):
        print_json(job_dict(job))
    else:
        print(f"{job.name} {job.state}")
    return 0


def cmd_events(client: Client, args: argparse.Namespace) -> int:
    try:
        for ev in client.stream(client.stub.WatchEvents, pb.WatchEventsRequest(job=args.job or "")):
            if _json(args):
                d = to_dict(ev)
                d["data"] = json.loads(d.pop("data_json") or "{}")
                print(json.dumps(d), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
                print(f"{stamp} {ev.kind:18} {ev.job or '-':20} {ev.node or '-':8} {ev.message}", flush=True)
    except KeyboardInterrupt:
        return 0
    return 0




def cmd_drain(client: Client, args: argparse.Namespace) -> int:
    timeout = parse_duration(args.timeout)
    # the API waits (on a watch of the jobs) until every job that ran there runs elsewhere, is
    # parked or has ended; past the timeout it answers with the jobs left
    wait_s = 0.0 if args.no_wait else max(timeout, 0.001)
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(drain=pb.DrainNodeRequest(node=args.node)))
    node = client.call(client.stub.DrainNode, pb.DrainNodeRequest(node=args.node, wait_s=wait_s),
                       timeout=wait_s + 60 if wait_s else None)
    jobs = client.call(client.stub.ListJobs, pb.ListJobsRequest()).jobs
    if _json(args):
        d = to_dict(node)
        d["jobs_left"] = []  # with --no-wait the drain has only begun; else none is left
        d["jobs"] = [{"name": j.name, "state": j.state, "node": j.node or None} for j in jobs]
        print_json(d)
    else:
        print(f"{args.node} is draining" + ("" if args.no_wait else "; no job runs there any more"))
    return 0


def cmd_undrain(client: Client, args: argparse.Namespace) -> int:
    if args.dry_run:
        return dry_run(client, args, pb.PlanRequest(drain=pb.DrainNodeRequest(node=args.node, undo=True)))
    node = client.call(client.stub.DrainNode, pb.DrainNodeRequest(node=args.node, undo=True))
    if _json(args):
        print_json(to_dict(node))
    else:
        print(f"{node.id} is {node.state}")
    return 0


def cmd_prices(client: Client, args: argparse.Namespace) -> int:
    prices = client.call(client.stub.ListPrices, pb.ListPricesRequest()).prices
    nodes = client.call(client.stub.ListNodes, pb.ListNodesRequest()).nodes
    if _json(args):
        print_json({"prices": [to_dict(p) for p in prices],
                    "nodes": [{"id": n.id, "price_per_hour": n.price_per_hour, "spot": n.spot,
                               "zone": n.labels.get("zone", ""), "instance_type": n.labels.get("instance_type", "")}
                              for n in nodes]})
        return 0
    table([[p.zone, p.instance_type, p.market, f"{p.price_per_hour:.4f}", p.source] for p in prices],
          ["ZONE", "INSTANCE TYPE", "MARKET", "USD/H", "SOURCE"])
    print()
    table([[n.id, n.labels.get("zone", "-"), n.labels.get("instance_type", "-"), "spot" if n.spot else "on-demand",
            f"{n.price_per_hour:.4f}"] for n in nodes], ["NODE", "ZONE", "INSTANCE TYPE", "MARKET", "USD/H"])
    return 0


def cmd_chaos(client: Client, args: argparse.Namespace) -> int:
    in_s = parse_duration(args.in_) if args.chaos == "spot-notice" else 0.0
    kind = f"fail-live-{args.phase}" if args.chaos == "fail-live" else args.chaos
    reply = client.call(client.stub.Chaos, pb.ChaosRequest(kind=kind, node=getattr(args, "node", ""), in_s=in_s))
    if _json(args):
        print_json(to_dict(reply))
    else:
        print(reply.message)
    return 0


def cmd_whoami(client: Client, args: argparse.Namespace) -> int:
    me = client.call(client.stub.WhoAmI, pb.WhoAmIRequest())
    if _json(args):
        print_json(to_dict(me))
        return 0
    print(f"tenant {me.tenant}, role {me.role}" + (f", token {me.who}" if me.who else "")
          + (" (the API has no tokens: anyone who reaches it is an admin)" if me.open else ""))

    def limit(used: float, cap: float, fmt: Any = lambda v: f"{v:g}") -> str:
        return f"{fmt(used)} of {fmt(cap)}" if cap else f"{fmt(used)} (no limit)"

    q, u = me.quota, me.used
    table([["cpus", limit(u.cpus, q.cpus)], ["memory", limit(u.memory_bytes, q.memory_bytes, size)],
           ["gpus", limit(u.gpus, q.gpus)], ["jobs", limit(u.jobs, q.jobs)]], ["QUOTA", "USED"])
    return 0


def cmd_audit(client: Client, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError(f"bad --limit {args.limit}: at least 1")
    entries = client.call(client.stub.ListAudit, pb.ListAuditRequest(since_s=parse_duration(args.since),
                                                                      limit=args.limit)).entries
    if _json(args):
        print_json([to_dict(e) for e in entries])
        return 0
    table([[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time)), e.tenant, e.who, e.method, e.target,
            e.outcome + (f": {e.error}" if e.error else ""), e.reason or "-"] for e in entries],
          ["TIME", "TENANT", "WHO", "CALL", "TARGET", "OUTCOME", "REASON"])
    return 0
