"""`ferry keys`: the credentials a cluster runs on, made and rotated without a running cluster.

    ferry keys init DIR [--nodes a,b]   every secret of a cluster into DIR (for Kubernetes/Nomad)
    ferry keys secret DIR               DIR as a Kubernetes Secret (YAML on stdout)
    ferry keys token --tenant acme      a new API token (printed once; its hash kept)
    ferry keys revoke NAME              remove a token by its name
    ferry keys rotate                   a new current store key (older checkpoints keep theirs)
    ferry keys add-node NODE            NATS users for a new node (`ferry up` loads them at once)
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ferry.cli.output import print_json
from ferry.common.errors import UsageError


def is_token(text: str) -> bool:
    from ferry.common.wire import is_token as token  # pydantic loads only when a keys command runs

    return token(text)

# The crypto and the store load only when a keys command runs: every other command's start-up
# stays free of them (`ferry nodes` is a CLI round trip, bench/checkpoint.py measures its floor).

EPILOG = """examples:
  ferry keys init ./keys --tls-hosts ferry-api.ferry.svc,nats.ferry.svc
  ferry keys secret ./keys | kubectl apply -f -       # the Secret ferry-keys of deploy/kubernetes
  ferry keys token --tenant acme --name ci-bot        # prints the token; FERRY_TOKEN=... ferry whoami
  ferry keys rotate --data-dir /var/lib/ferry
"""


def add_keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("keys", help="make and rotate the cluster's credentials (store keys, NATS users, tokens)",
                       description=__doc__, epilog=EPILOG, parents=[common],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="keys", metavar="ACTION", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--data-dir", help="the cluster's data dir; secrets in DATA_DIR/secrets "
                       "(default: FERRY_DATA_DIR or /var/lib/ferry)")
    a = actions.add_parser("init", help="make every secret a cluster needs into DIR (what is there is kept)",
                           parents=[common])
    a.add_argument("dir")
    a.add_argument("--nodes", default="", help="comma-separated node ids: each gets its own NATS users "
                   "(default: shared node users, for nodes that come and go)")
    a.add_argument("--tls-hosts", default="", help="comma-separated names and addresses of the servers: a CA "
                   "and certificates for them in DIR/tls")
    a = actions.add_parser("secret", help="print DIR as a Kubernetes Secret", parents=[common])
    a.add_argument("dir")
    a.add_argument("--name", default="ferry-keys")
    a.add_argument("--namespace", default="ferry")
    a.add_argument("--format", choices=["kubernetes", "nomad"], default="kubernetes",
                   help="nomad: the JSON of a Nomad variable (nomad var put -in json PATH -)")
    a = actions.add_parser("token", help="make an API token for a tenant; prints it once", parents=[common, where])
    a.add_argument("--tenant", required=True)
    a.add_argument("--role", choices=["user", "admin", "agent"], default="user",
                   help="agent: a user of its tenant that may also drain nodes; its calls need a reason and stay "
                        "within the tenant's agent_limits")
    a.add_argument("--name", default="", help="who holds it (shown in the audit trail; revoke by it)")
    a.add_argument("--tokens-file", help="default: FERRY_TOKENS_FILE, else DATA_DIR/secrets/tokens.yaml")
    a = actions.add_parser("revoke", help="remove the tokens of this name", parents=[common, where])
    a.add_argument("name")
    a.add_argument("--tokens-file", help="default: FERRY_TOKENS_FILE, else DATA_DIR/secrets/tokens.yaml")
    a = actions.add_parser("rotate", help="a new current store key; checkpoints keep the key they were sealed with",
                           parents=[common, where])
    a.add_argument("--key-file", help="default: FERRY_STORE_KEY_FILE, else DATA_DIR/secrets/store.keys")
    a = actions.add_parser("add-node", help="NATS users for a new node's services", parents=[common, where])
    a.add_argument("node")


def _secrets(args: argparse.Namespace) -> Path:
    return Path(args.data_dir or os.environ.get("FERRY_DATA_DIR", "/var/lib/ferry")) / "secrets"


def tokens_path(args: argparse.Namespace) -> Path:
    if args.tokens_file:
        return Path(args.tokens_file)
    if os.environ.get("FERRY_TOKENS_FILE") and not args.data_dir:
        return Path(os.environ["FERRY_TOKENS_FILE"])
    return _secrets(args) / "tokens.yaml"


def _load(path: Path) -> dict[str, Any]:
    import yaml

    if not path.exists():
        return {"tokens": [], "tenants": {}}
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise UsageError(f"{path} is not a tokens file (a mapping with tokens: and tenants:)")
    return loaded


def _init(args: argparse.Namespace) -> dict[str, object]:
    from ferry.cli.secrets import ensure_secrets
    from ferry.common.certs import make_tls
    from ferry.common.natsauth import authorization_block
    from ferry.store.keys import write_private

    folder = Path(args.dir)
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    if bad := [n for n in nodes if not is_token(n)]:
        raise UsageError(f"bad node id {bad[0]!r}: use letters, digits, '-' and '_'")
    passwords = ensure_secrets(folder, nodes or None)
    write_private(folder / "nats-auth.conf", authorization_block(passwords))
    if hosts := [h.strip() for h in args.tls_hosts.split(",") if h.strip()]:
        make_tls(folder / "tls", hosts)
    return {"dir": str(folder), "nats_users": sorted(passwords),
            "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())}


def _token(args: argparse.Namespace) -> dict[str, object]:
    import yaml

    from ferry.common.tenancy import token_hash
    from ferry.store.keys import write_private

    if not is_token(args.tenant):
        raise UsageError(f"bad tenant {args.tenant!r}: use letters, digits, '-' and '_'")
    path = tokens_path(args)
    table = _load(path)
    token = "fy_" + secrets.token_urlsafe(32)
    entries = list(table.get("tokens") or [])
    entries.append({"sha256": token_hash(token), "tenant": args.tenant, "role": args.role, "name": args.name})
    table["tokens"] = entries
    write_private(path, yaml.safe_dump(table, sort_keys=False))
    return {"token": token, "tenant": args.tenant, "role": args.role, "name": args.name, "tokens_file": str(path)}


def _revoke(args: argparse.Namespace) -> dict[str, object]:
    import yaml

    from ferry.store.keys import write_private

    path = tokens_path(args)
    table = _load(path)
    entries = list(table.get("tokens") or [])
    kept = [e for e in entries if e.get("name") != args.name]
    if len(kept) == len(entries):
        raise UsageError(f"no token named {args.name!r} in {path}")
    table["tokens"] = kept
    write_private(path, yaml.safe_dump(table, sort_keys=False))
    return {"revoked": len(entries) - len(kept), "name": args.name, "tokens_file": str(path)}


def _rotate(args: argparse.Namespace) -> dict[str, object]:
    from ferry.cli.secrets import rotate_store_keys

    if args.key_file:
        path = Path(args.key_file)
    elif os.environ.get("FERRY_STORE_KEY_FILE") and not args.data_dir:
        path = Path(os.environ["FERRY_STORE_KEY_FILE"])
    else:
        path = _secrets(args) / "store.keys"
    ring = rotate_store_keys(path)
    return {"key_file": str(path), "current": ring.current, "keys": ring.key_ids}


def _add_node(args: argparse.Namespace) -> dict[str, object]:
    from ferry.cli.secrets import creds_file, ensure_nats_users
    from ferry.common.natsauth import NODE_ROLES, node_user

    if not is_token(args.node):
        raise UsageError(f"bad node id {args.node!r}: use letters, digits, '-' and '_'")
    folder = _secrets(args)
    if not folder.is_dir():
        raise UsageError(f"no secrets in {folder}: give --data-dir of a cluster")
    ensure_nats_users(folder, [args.node])
    return {"node": args.node, "creds": [str(creds_file(folder, node_user(r, args.node))) for r in NODE_ROLES]}


ACTIONS: dict[str, Callable[[argparse.Namespace], dict[str, object]]] = {
    "init": _init, "token": _token, "revoke": _revoke, "rotate": _rotate, "add-node": _add_node}


def cmd_keys(args: argparse.Namespace) -> int:
    from ferry.cli.secrets import kubernetes_secret, secret_items

    if args.keys == "secret":
        folder = Path(args.dir)
        if not (folder / "store.keys").is_file():
            raise UsageError(f"{folder} holds no cluster secrets: `ferry keys init {folder}` makes them")
        if args.format == "nomad":
            print_json({"Items": {k: v.decode() for k, v in secret_items(folder).items()}})
        else:
            print(kubernetes_secret(folder, args.name, args.namespace), end="")
        return 0
    out = ACTIONS[args.keys](args)
    if args.output == "json":
        print_json(out)
    else:
        for key, value in out.items():
            print(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0
