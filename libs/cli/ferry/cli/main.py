"""`ferry`: run, checkpoint, restore and move long-running workloads.

Every command but `up` talks to the admin API at FERRY_ADDR (default 127.0.0.1:7070); with
FERRY_TOKEN set it sends that token. `-o json` prints one JSON document instead of text.
Exit codes: 0 success, 1 failure, 2 bad input (unknown job, node or checkpoint; invalid arguments).
"""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from ferry.common.errors import FerryError
from ferry.common.phases import LIVE_PHASES

EPILOG = """examples:
  ferry up --nodes 2 --data-dir /tmp/f --grpc 127.0.0.1:7070
  ferry run --name t1 --node node-1 --checkpoint-every 30s -- python train.py --steps 400
  ferry checkpoint t1 -o json
  ferry migrate t1 --to node-2
  ferry logs t1 -f
  ferry adopt 12345 --name step-7 --node node-1
"""


class _Sink:
    """Stands for the parser of a command that is not the one given: takes every call, does nothing."""

    def __getattr__(self, name: str) -> Callable[..., "_Sink"]:
        return self._absorb

    def _absorb(self, *args: Any, **kwargs: Any) -> "_Sink":
        return self


# the commands whose parsers another module adds (imported only when one of them is given, or all are)
PARSER_MODULES = {"simulate": ("add_simulate_parser", ("simulate",)),
                  "insight": ("add_insight_parsers", ("signals", "explain")),
                  "store": ("add_store_parser", ("store",)), "pods": ("add_pod_parser", ("pod",)),
                  "keys": ("add_keys_parser", ("keys",)), "slurm.bridge": ("add_slurm_parser", ("slurm",))}


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option or an option's value)."""
    takes_value = {"-o", "--output", "--addr", "--reason"}
    words = iter(argv)
    for word in words:
        if word in takes_value:
            next(words, None)
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that command's (a call of ``ferry nodes``
    need not build, nor import what builds, the other forty; --help and errors get the whole)."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a nested subcommand must not reset what an outer level already parsed
    common.add_argument("-o", "--output", choices=["text", "json"], default=argparse.SUPPRESS,
                        help="output format (json: one JSON document)")
    common.add_argument("--addr", default=argparse.SUPPRESS,
                        help="admin API address (default: FERRY_ADDR or 127.0.0.1:7070)")
    common.add_argument("--reason", default=argparse.SUPPRESS, metavar="TEXT",
                        help="why you make this change: the audit trail records it (an agent's token must give "
                             "one; default: FERRY_REASON)")

    parser = argparse.ArgumentParser(prog="ferry", description=__doc__, epilog=EPILOG, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    if only is not None:
        real_add_parser = sub.add_parser

        def add_only(name: str, **kwargs: Any) -> argparse.ArgumentParser:
            return real_add_parser(name, **kwargs) if name == only else cast(argparse.ArgumentParser, _Sink())

        sub.add_parser = add_only  # type: ignore[method-assign]

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[common])

    def add_from(module: str) -> None:
        adder, names = PARSER_MODULES[module]
        if only is None or only in names:
            getattr(importlib.import_module(f"ferry.cli.{module}"), adder)(sub, common)

    p = add("up", "start an all-in-one cluster in the foreground (NATS, services, N simulated nodes)")
    p.add_argument("--nodes", type=int, default=2, help="number of simulated nodes (default 2)")
    p.add_argument("--data-dir", default="/var/lib/ferry", help="where state, the store and logs live")
    p.add_argument("--store", default=None, help="checkpoint store URL (default: a directory under the data dir; "
                                                  "s3://bucket/prefix?endpoint=HOST:PORT for S3 or MinIO)")
    p.add_argument("--grpc", default="127.0.0.1:7070", help="HOST:PORT for the admin API")
    p.add_argument("--nats-port", type=int, default=0, help="port for the embedded NATS server (default: free)")
    p.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                   help="run N NATS servers as one JetStream cluster (3: R3 streams and KV, any one may die)")
    p.add_argument("--tls", action="store_true", help="TLS for NATS, the API and the page servers of live moves, "
                   "with a CA made in DATA_DIR/secrets/tls (clients: FERRY_TLS_CA=DATA_DIR/secrets/tls/ca.pem)")
    p.add_argument("--cluster", metavar="FILE", help="YAML of simulated nodes with labels, capacity and price "
                                                     "(instead of --nodes)")
    p.add_argument("--provider", choices=["local"], help="let the autoscaler (`ferry autoscale`) add and remove "
                   "nodes: `local` starts and stops node services of the instance types the --cluster file lists")

    add("nodes", "list the nodes, their state and whether CRIU works there")

    p = add("run", "start a program under Ferry")
    p.add_argument("--name", help="job name (default: generated); jobs are named by name or id")
    p.add_argument("--node", help="run on this node (default: the scheduler picks)")
    p.add_argument("--cwd", help="working directory (default: the current one)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable for the job (repeat); "
                   "values are sealed to the nodes: no record, event or `ferry status` shows them")
    p.add_argument("--secret", action="append", metavar="NAME=@FILE", help="an environment variable whose value is "
                   "the content of FILE (a token, a key), sealed like --env (repeat)")
    p.add_argument("--checkpoint-every", metavar="DURATION", help="checkpoint periodically, e.g. 30s or 5m")
    p.add_argument("--priority", type=int, default=0, help="higher runs first and is preempted last")
    p.add_argument("--cpus", type=float, default=0.0, help="cpus the job needs (placement respects capacity)")
    p.add_argument("--memory", default=None, metavar="SIZE", help="memory the job needs, e.g. 2GiB")
    p.add_argument("--gpus", type=int, default=0, help="gpus the job needs (it gets CUDA_VISIBLE_DEVICES)")
    p.add_argument("--gpu-model", help="only GPUs whose name contains this, e.g. H100")
    p.add_argument("--gpu-memory", metavar="SIZE", help="only GPUs with at least this much memory, e.g. 40GiB")
    p.add_argument("--gpu-shared", action="store_true", help="may share GPUs with jobs that also allow it")
    p.add_argument("--network", default="", metavar="bridge|isolated|host",
                   help="bridge (the default; host for containers, --here and adopted jobs): a network namespace "
                        "of the job's own with an address from the cluster's job range (FERRY_JOB_NETWORK) that "
                        "it keeps on every node, NAT to the outside; isolated: its own namespace with loopback "
                        "only; both are checkpointed with the job, TCP connections included; host: the node's "
                        "network, whose ports a restore may find taken")
    p.add_argument("--publish", action="append", default=[], metavar="HOST:JOB[/tcp|udp]",
                   help="with --network bridge: the node's port HOST reaches the job's port JOB (repeat); a port "
                        "is published by one job in the whole cluster, so the job can move to any node")
    p.add_argument("--bundle", metavar="DIR", help="run an OCI runtime bundle (a folder with config.json) with "
                   "runc: its root filesystem, mounts and namespaces; the command after -- replaces its args")
    p.add_argument("--image", metavar="REF", help="run an OCI image with runc: oci:/LAYOUT_DIR[:TAG] or "
                   "oci-archive:/FILE.tar[:TAG] (unpacked by umoci on the node; no registry is used)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label for the job (repeat): who or what started it, e.g. team=nlp; integrations set "
                        "source=slurm|kubernetes|ray (`ferry ps --label`, `ferry ps --source`)")
    add_here_arguments(p, "run here, in the foreground, as a child of this command (what a SLURM step or a "
                          "container runtime calls): its output is this command's, it ends with the job's exit "
                          "status; needs --node (or FERRY_NODE_ID) naming this machine's node")
    p.add_argument("--deadline", metavar="DURATION", help="SLA: finish within this long from now, e.g. 6h")
    p.add_argument("--max-downtime", metavar="DURATION", help="SLA: the longest stop the job tolerates, e.g. 30s")
    p.add_argument("--work", metavar="DURATION", help="about how long the job computes to its end, e.g. 4h: with "
                   "--deadline, Ferry knows its slack (the time it runs is counted) and may use spot while the "
                   "slack allows")
    p.add_argument("--gang", metavar="GANG", help="a member of this gang: jobs that talk to each other (a Ray "
                   "head and its workers, torchrun's ranks) and so are checkpointed together (`ferry checkpoint "
                   "--gang`), restored together (`ferry restore --gang`) and failed over together; needs "
                   "--network bridge")
    p.add_argument("--right-size", action="store_true", help="let the job's memory request follow what it uses "
                   "(starting from --memory): when it outgrows its node it moves, with a checkpoint, to one where it "
                   "fits (the autoscaler launches one if none has room); when it uses far less, the request shrinks "
                   "so that cheaper nodes can take it")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")

    p = add("adopt", "take a running process (and its children) into Ferry's care where it runs: watched, "
                     "checkpointed, restorable elsewhere; run it on the process's node")
    p.add_argument("pid", type=int, help="the process to adopt (a SLURM step's, a container's, a shell's child)")
    p.add_argument("--name", help="job name (default: generated)")
    p.add_argument("--node", help="the node this machine is (default: FERRY_NODE_ID)")
    p.add_argument("--cgroup", metavar="PATH", help="the cgroup the tree runs in (a SLURM step's, say): refused "
                   "unless it holds exactly the process and its descendants, which a checkpoint takes whole")

    p = add("checkpoint", "checkpoint a running job (or every member of a gang, as one) into the store")
    p.add_argument("job", nargs="?", default="", help="the job (or give --gang)")
    p.add_argument("--gang", metavar="GANG", help="one consistent group checkpoint of every member of GANG: their "
                   "network is locked, they dump in parallel, and the group commits only if every member did")
    add_dry_run(p)
    p.add_argument("--stop", action="store_true", help="final checkpoint: the job (every member) stops afterwards")

    p = add("restore", "restore a stopped job (or a whole gang) from a checkpoint (default: its newest)")
    p.add_argument("job", nargs="?", default="", help="the job (or give --gang)")
    p.add_argument("--gang", metavar="GANG", help="every member of GANG from its newest group checkpoint")
    p.add_argument("--nodes", metavar="N1,N2,...", help="with --gang: where the members go, in the order of their "
                   "names (default: the scheduler picks a node for each, one member per node)")
    p.add_argument("--allow-colocate", action="store_true", help="with --gang: members may share a node")
    p.add_argument("--node", "--to", dest="node", help="restore on this node (default: the scheduler picks); "
                   "--to is the same option, spelt as migrate spells it")
    p.add_argument("--checkpoint", help="checkpoint id (default: the newest committed one)")
    add_dry_run(p)
    add_here_arguments(p, "restore here, in the foreground, as a child of this command, in its cgroup; ends "
                          "with the job's exit status; needs --node (or FERRY_NODE_ID) naming this machine's node")
    p.add_argument("--replay-output", action="store_true", help="with --here: print the job's whole output, not "
                   "only what follows the checkpoint (for a supervisor that truncated the output file, as SLURM does "
                   "on a requeue)")

    p = add("migrate", "move a running job to another node (checkpoint --stop, then restore there)")
    p.add_argument("job")
    p.add_argument("--to", required=True, help="target node")
    p.add_argument("--live", action="store_true", help="near-live move: a pre-copy checkpoint while it runs, a "
                   "short freeze, then the target runs at once and its memory follows (CRIU post-copy)")
    p.add_argument("--tcp-established", action="store_true", help="with --live: keep the job's established TCP "
                   "connections (the nodes must carry the same service address; move it before the freeze)")
    add_dry_run(p)

    p = add("ps", "list jobs (running and stopped; -a adds finished ones)")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("--source", metavar="NAME", help="only jobs an integration started: slurm, kubernetes, ray "
                   "(their label source=NAME)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="only jobs with this label (repeat: all must match)")

    p = add("status", "show one job: state, node, restarts, last checkpoint")
    p.add_argument("job")

    p = add("logs", "print a job's output (it continues across restores)")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--stream", choices=["stdout", "stderr"], default="stdout")

    p = add("checkpoints", "list a job's checkpoints")
    p.add_argument("job")

    p = add("wait", "wait for a job to end; exits with its exit code")
    p.add_argument("job")
    p.add_argument("--timeout", metavar="DURATION", help="give up after this long (exit 1), e.g. 600 or 10m")

    p = add("kill", "stop a job (SIGTERM, then SIGKILL after a grace period)")
    p.add_argument("job")
    p.add_argument("--grace", metavar="DURATION", help="time between SIGTERM and SIGKILL (default 5s)")
    add_dry_run(p)

    p = add("drain", "move every job off a node (checkpoint and restore elsewhere; parked if nothing fits)")
    p.add_argument("node")
    p.add_argument("--no-wait", action="store_true", help="return once draining started")
    p.add_argument("--timeout", metavar="DURATION", default="10m", help="how long to wait for the node to empty")
    add_dry_run(p)

    p = add("autoscale", "set the autoscaler's bounds (`ferry up --provider local`, or a cloud provider), or show "
            "them and the nodes it launched and retired")
    p.add_argument("--min", type=int, metavar="N", help="never fewer nodes than this")
    p.add_argument("--max", type=int, metavar="N", help="never more nodes than this")
    p.add_argument("--target-utilization", type=float, metavar="U", help="retire a node only when its jobs fit on "
                   "the others with those at or under this share of their cpus, memory and gpus (0 < U <= 1)")
    p.add_argument("--scale-down-after", metavar="DURATION", help="how long a node must stay underused before "
                   "it retires (hysteresis; default 10m)")
    p.add_argument("--scale-up-after", metavar="DURATION", help="how long a job must wait before a node is "
                   "launched for it (default 5s)")
    p.add_argument("--off", action="store_true", help="stop autoscaling (the fleet stays as it is)")

    p = add("undrain", "let a drained node take work again (parked jobs may come back to it)")
    p.add_argument("node")
    add_dry_run(p)

    add("prices", "list the prices the pricing service knows")

    p = add("chaos", "all-in-one mode only: crash a simulated node or announce its spot interruption")
    chaos = p.add_subparsers(dest="chaos", metavar="ACTION", required=True)
    c = chaos.add_parser("kill-node", help="SIGKILL a node's services and workloads, like a crash", parents=[common])
    c.add_argument("node")
    c = chaos.add_parser("spot-notice", help="the node's metadata endpoint announces an interruption; the node "
                         "dies at the deadline", parents=[common])
    c.add_argument("node")
    c.add_argument("--in", dest="in_", metavar="DURATION", default="120s", help="time until the node dies")
    c = chaos.add_parser("fail-live", help="make the next live move fail in one phase (to see it recover)",
                         parents=[common])
    c.add_argument("phase", choices=LIVE_PHASES, help="round: a pre-copy checkpoint; freeze: the final dump; "
                   "restore: the target's restore; postcopy: the memory transfer after the target ran; "
                   "source: the source dies (page server and process) as the target starts")

    add_from("simulate")
    add_from("insight")
    p = add("mcp", "serve Ferry's tools to an agent over MCP (stdio, or --http): signals, explain, and guarded "
                   "checkpoint, migrate, drain and restore (dry run unless asked)")
    p.add_argument("--http", metavar="HOST:PORT", help="serve MCP's streamable HTTP on this loopback address "
                   "instead of stdio")
    add_from("store")
    add_from("pods")
    add_from("keys")
    add_from("slurm.bridge")

    p = add("ray", "Ray clusters as gangs")
    ray = p.add_subparsers(dest="ray_cmd", metavar="ACTION", required=True)
    r = ray.add_parser("up", parents=[common], help="start a Ray cluster as a gang: a head and its workers, each a "
                       "job on a node of its own, checkpointed, restored and failed over together")
    r.add_argument("--name", default="ray", help="the gang's name; members are NAME-head, NAME-w1... (default: ray)")
    r.add_argument("--workers", type=int, default=2, help="worker nodes besides the head (default: 2)")
    r.add_argument("--nodes", metavar="N0,N1,...", help="the head's node, then each worker's (default: the "
                   "scheduler picks)")
    r.add_argument("--cpus", type=int, default=0, help="CPUs each Ray node offers (ray start --num-cpus)")
    r.add_argument("--checkpoint-every", metavar="DURATION", help="a group checkpoint of the whole cluster this often")
    r.add_argument("--ray-bin", metavar="PATH", help="the `ray` the nodes run (default: beside this Python, else "
                   "PATH's)")
    r.add_argument("driver", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]: a driver, run in the head's "
                   "job once the head is up (Ray wants drivers on a Ray node); ray.init() finds the cluster")
    add("whoami", "who the API takes this caller for: tenant, role, quota and what the tenant uses")
    p = add("audit", "the audit trail: every mutating call, who made it and how it ended (a user sees its tenant's)")
    p.add_argument("--since", metavar="DURATION", default="1d", help="how far back (default 1d), e.g. 1h")
    p.add_argument("--limit", type=int, default=100, help="at most this many, the newest (default 100)")

    p = add("events", "follow the event stream (one line per event; JSON lines with -o json)")
    p.add_argument("-f", "--follow", action="store_true", help="accepted for habit: events always follow")
    p.add_argument("--job", help="only this job's events")
    return parser


# command -> "module:function", imported when the command runs: with the API's client ...
HANDLERS = {name: f"ferry.cli.commands:cmd_{name}" for name in (
    "nodes", "run", "adopt", "checkpoint", "restore", "migrate", "ps", "status", "logs", "checkpoints", "wait",
    "kill", "events", "drain", "undrain", "prices", "chaos", "whoami", "audit")}
HANDLERS |= {"signals": "ferry.cli.insight:cmd_signals", "explain": "ferry.cli.insight:cmd_explain",
             "ray": "ferry.cli.raygang:cmd_ray_up", "autoscale": "ferry.cli.fleet:cmd_autoscale"}
# ... and without a cluster: they act on this machine
LOCAL = {"simulate": "ferry.cli.simulate:cmd_simulate", "store": "ferry.cli.store:cmd_store",
         "pod": "ferry.cli.pods:cmd_pod", "keys": "ferry.cli.keys:cmd_keys",
         "slurm": "ferry.cli.slurm.bridge:cmd_slurm", "up": "ferry.cli.up:cmd_up",
         "mcp": "ferry.cli.agent.server:cmd_mcp"}


def handler(spec: str) -> Callable[..., int]:
    module, _, name = spec.partition(":")
    return cast(Callable[..., int], getattr(importlib.import_module(module), name))


def add_dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="say what would happen (checked as the call itself "
                   "would be, limits included) and change nothing")


def add_here_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--here", action="store_true", help=what)
    p.add_argument("--cgroup", metavar="PATH", help="with --here: run the job in this cgroup (a folder with "
                   "cgroup.procs) instead of this command's own")
    p.add_argument("--checkpoint-on-term", action="store_true", help="with --here: on SIGTERM or SIGINT, checkpoint "
                   "the job, then stop it (this command exits with 143, 128 + SIGTERM; `ferry restore JOB --here` "
                   "continues it); without it the job gets SIGTERM, then SIGKILL after --grace")
    p.add_argument("--grace", dest="grace_here", metavar="DURATION", default="10s",
                   help="with --here: time between SIGTERM and SIGKILL when the job is stopped (default 10s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    given = sys.argv[1:] if argv is None else list(argv)
    only = command_of(given)
    known = only in HANDLERS or only in LOCAL
    helping = "-h" in given or "--help" in given
    args = build_parser(only if known and not helping else None).parse_args(given)
    args.output = getattr(args, "output", "text")  # not set_defaults: the actions are shared with subparsers
    args.addr = getattr(args, "addr", None)
    args.reason = getattr(args, "reason", None)
    return args


def console() -> None:
    """The ``ferry`` command: ``main``, and after a call of the API the process ends at once
    (``os._exit``, output flushed) instead of tearing down gRPC's threads and channel, which
    took 20 to 30 ms of every call (issue 18's CLI floor)."""
    main(fast_exit=True)


def _exit_now(code: int) -> None:
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(code)


def main(argv: Sequence[str] | None = None, fast_exit: bool = False) -> None:
    args = parse_args(argv)
    try:
        if args.cmd in LOCAL:  # no cluster: they act on this machine
            code = handler(LOCAL[args.cmd])(args)
        else:
            from ferry.cli import commands
            from ferry.cli.client import Client, default_addr

            if args.cmd in ("run", "restore"):
                commands.validate_here(args)
            if args.cmd == "run":
                commands.validate_run(args)
            if args.cmd == "adopt":
                commands.validate_adopt(args)
            # not closed: closing a gRPC channel waits for its poller, and the process ends right
            # after the command (issue 18's CLI floor)
            client = Client(args.addr or default_addr(), reason=args.reason)
            code = handler(HANDLERS[args.cmd])(client, args)
    except FerryError as exc:
        print(f"ferry: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `ferry ... | head`: the reader left, which is fine
        sys.stdout = None
        code = 0
    if fast_exit and args.cmd in HANDLERS:  # nothing of the command's own is left to finish
        _exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
