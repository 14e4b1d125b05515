"""`ferry pod checkpoint CONTAINER` and `ferry pod checkpoints JOB`: the node side of Ferry under
Kubernetes, run on the node where the pod runs (the node agent does the same).

A pod opts in with `runtimeClassName: ferry`; its containers run through `ferry-runc`. A checkpoint
goes through `runc checkpoint` against containerd's runc state, into Ferry's store (the one
Ferry's configuration names: --config, FERRY_CONFIG, FERRY_STORE_URL...) as the next checkpoint of
the container's job: `ferry.dev/job` if the pod names one, else k8s.NAMESPACE.POD.CONTAINER. A
pod created with `ferry.dev/restore-from: JOB[/CHECKPOINT]` comes back from it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import tempfile
from pathlib import Path

from ferry.cli.output import print_json, size, table

EPILOG = """examples:
  ferry pod checkpoint 5f2c9e... --endpoint /run/containerd/containerd.sock
  ferry pod checkpoint 5f2c9e... --stop -o json     # before the pod goes: the container ends with the dump
  ferry pod checkpoints k8s.default.trainer.main
"""
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"


def add_pod_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                   common: argparse.ArgumentParser) -> None:
    help_ = "checkpoint the containers of Kubernetes pods that run with the RuntimeClass ferry (on their node)"
    p = sub.add_parser("pod", help=help_, description=help_ + ". " + (__doc__ or "").split("\n\n")[1],
                       parents=[common], epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="pod_cmd", metavar="ACTION", required=True)
    c = actions.add_parser("checkpoint", parents=[common], help="checkpoint a running container into the store")
    c.add_argument("container", help="the container's id (crictl ps, or the pod's status)")
    c.add_argument("--endpoint", help=f"containerd's CRI socket (default: FERRY_CRI_ENDPOINT, else {DEFAULT_ENDPOINT})")
    c.add_argument("--stop", action="store_true", help="end the container with the dump (before its pod goes); "
                   "without it the container runs on")
    c.add_argument("--job", help="the job id in the store (default: the pod's ferry.dev/job, else "
                   "k8s.NAMESPACE.POD.CONTAINER)")
    c.add_argument("--config", help="Ferry's configuration file (default: FERRY_CONFIG)")
    i = actions.add_parser("install-runtime", parents=[common], help="add the runtime ferry to containerd's "
                           "configuration (what the node agent does on each node; restart containerd after)")
    i.add_argument("--containerd-config", default="/etc/containerd/config.toml", metavar="PATH",
                   help="containerd's config.toml (default /etc/containerd/config.toml)")
    i.add_argument("--binary", default="/opt/ferry/bin/ferry-runc", metavar="PATH",
                   help="the ferry-runc that containerd's runc shim runs, as the host sees it")
    i.add_argument("--runc-root", default="/run/ferry/runc", metavar="PATH", help="runc's state for the runtime")
    i.add_argument("--uninstall", action="store_true", help="remove the runtime ferry again")
    ls = actions.add_parser("checkpoints", parents=[common], help="the checkpoints of a pod container's job")
    ls.add_argument("job")
    ls.add_argument("--config", help="Ferry's configuration file (default: FERRY_CONFIG)")


def cmd_pod(args: argparse.Namespace) -> int:
    if args.pod_cmd == "checkpoint":
        return _checkpoint(args)
    if args.pod_cmd == "install-runtime":
        return _install(args)
    return _list(args)


def _install(args: argparse.Namespace) -> int:
    from ferry.kube.containerd import install, runtime_options, uninstall

    path = Path(args.containerd_config)
    try:
        before = path.read_text()
    except FileNotFoundError:
        before = "version = 2\n"  # containerd's defaults, and Ferry's runtime beside them
    after = uninstall(before) if args.uninstall else install(before, args.binary, args.runc_root)
    changed = after != before
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.ferry-tmp")
        tmp.write_text(after)
        tmp.replace(path)
    result = {"config": str(path), "changed": changed, "runtime": {} if args.uninstall else runtime_options(after)}
    if args.output == "json":
        print_json(result)
    else:
        print(f"{path}: {'changed' if changed else 'already so'}"
              + ("; restart containerd to use it" if changed else ""))
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    from ferry.common.config import load_settings
    from ferry.common.errors import UsageError
    from ferry.kube.cri import ContainerInfo, CriClient
    from ferry.kube.podimages import checkpoint, open_configured_store

    endpoint = args.endpoint or load_settings(args.config).cri_endpoint

    async def look() -> ContainerInfo:
        async with CriClient(endpoint) as cri:
            return await cri.container(args.container)

    info = asyncio.run(look())
    if info.state != "running":
        raise UsageError(f"container {args.container} is {info.state}: only a running container checkpoints")
    store = open_configured_store(args.config)
    with tempfile.TemporaryDirectory(prefix="ferry-pod-") as work:
        done = checkpoint(store, root=info.runc_root, container_id=info.id, job=args.job, work=Path(work),
                          final=args.stop)
    if args.output == "json":
        print_json(done.model_dump())
    else:
        print(f"checkpoint {done.checkpoint} of {done.job}: {size(done.bytes_logical)} in {done.wall_ms:.0f} ms"
              + (" (the container ended with it)" if done.final else ""))
        print(f"restore it with the pod annotation ferry.dev/restore-from: {done.job}/{done.checkpoint}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from ferry.kube.podimages import open_configured_store

    store = open_configured_store(args.config)
    manifests = sorted((store.read_manifest(args.job, ck) for ck in store.list_checkpoints(args.job)),
                       key=lambda m: m.created)
    if args.output == "json":
        print_json([{"checkpoint": m.checkpoint, "parent": m.parent, "created": m.created, "bytes": m.bytes_logical,
                     "final": bool(m.meta.get("final"))} for m in manifests])
    else:
        table([[m.checkpoint, datetime.datetime.fromtimestamp(m.created).isoformat(timespec="seconds"),
                size(m.bytes_logical), "yes" if m.meta.get("final") else ""] for m in manifests],
              ["CHECKPOINT", "CREATED", "SIZE", "FINAL"])
    return 0
