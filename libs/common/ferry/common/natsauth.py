"""Who may say what on the bus: one NATS user per service, with the subjects it may use.

Pure functions: the users a cluster needs, each role's permissions, the server's
``authorization`` block, and the credentials file a service reads. ``ferry up`` writes them
(ferry.cli.secrets); the Kubernetes and Nomad manifests mount them from a Secret.

A role may publish only what its work needs, and nothing else is allowed:

- ``scheduler``: the only one that commands nodes (``ferry.cmd.node.>``), writes jobs, ops,
  checkpoint records and job events; the only one that creates streams and buckets.
- ``api``: sends user commands to the scheduler (``ferry.cmd.scheduler``), writes ops and the
  audit trail (``ferry.audit.>``), asks a node for logs; it can never command a node.
- ``health`` and ``pricing``: node and price records, cluster events.
- ``autoscaler``: its fleet records, drains through the scheduler (``ferry.cmd.scheduler``, like
  the API), the node records of nodes it terminated, cluster events. ``api`` also writes the
  autoscaling policy that ``ferry autoscale`` sets.
- ``controller`` and ``podagent`` (Kubernetes: the controller, the node agents): cluster events.
- ``checkpointer@N`` and ``migrator@N`` (one pair per node N): their own node's events, node
  record and consumers, and the progress of ops; nothing of another node. Where nodes come and
  go (a Kubernetes DaemonSet), the shared users ``checkpointer`` and ``migrator`` may speak for any
  node, and for nothing else.

Reading is allowed where a role needs it: every role reads the KV buckets; node roles receive
commands only through their own durable consumer, created with their own subject as its filter.
Workloads get no credentials at all.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ferry.common import wire
from ferry.common.errors import ConfigError

CONTROL_ROLES = ("scheduler", "api", "health", "pricing", "autoscaler", "controller", "podagent")
NODE_ROLES = ("checkpointer", "migrator")
_BUCKETS = (wire.KV_JOBS, wire.KV_NODES, wire.KV_CHECKPOINTS, wire.KV_OPS, wire.KV_SERVICES, wire.KV_PRICES,
            wire.KV_GANGS, wire.KV_AUTOSCALE, wire.KV_FLEET)


class NatsCreds(BaseModel):
    """What one service presents to NATS (the file is 0600)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: str
    password: str


def node_user(role: str, node: str) -> str:
    return f"{role}@{wire.token(node)}"


def users_for(nodes: Iterable[str] | None) -> list[str]:
    """Every user a cluster of these nodes needs; None: the shared node users (any node)."""
    if nodes is None:
        return [*CONTROL_ROLES, *NODE_ROLES]
    return [*CONTROL_ROLES, *(node_user(role, n) for n in nodes for role in NODE_ROLES)]


def new_password() -> str:
    return secrets.token_urlsafe(32)


def _reads() -> list[str]:
    """What every role may ask JetStream: stream and bucket info, KV reads and watches."""
    kv_streams = [f"KV_{b}" for b in _BUCKETS]
    return [
        "$JS.API.INFO",
        *(f"$JS.API.STREAM.INFO.{s}" for s in (*kv_streams, wire.CMD_STREAM, wire.EVT_STREAM, wire.AUDIT_STREAM)),
        *(f"$JS.API.DIRECT.GET.{s}.>" for s in kv_streams),
        *(f"$JS.API.DIRECT.GET.{s}" for s in kv_streams),
        *(f"$JS.API.STREAM.MSG.GET.{s}" for s in kv_streams),
        *(f"$JS.API.CONSUMER.CREATE.{s}" for s in kv_streams),  # ordered consumers of watches, keys()
        *(f"$JS.API.CONSUMER.CREATE.{s}.>" for s in kv_streams),
        *(f"$JS.API.CONSUMER.DELETE.{s}.*" for s in kv_streams),
        *(f"$JS.API.CONSUMER.INFO.{s}.*" for s in kv_streams),
        *(f"$JS.FC.{s}.>" for s in kv_streams),  # flow control replies of ordered consumers
    ]


def _kv(bucket: str, key: str = ">") -> str:
    return f"$KV.{bucket}.{key}"


def _consumer(stream: str, durable: str, subject: str) -> list[str]:
    """A durable pull consumer of ``subject`` on ``stream``: created (with that filter only),
    fetched from and acknowledged."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{subject}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def permissions(user: str) -> dict[str, dict[str, list[str]]]:
    """The server-side permissions of one of ``users_for``'s users."""
    role, _, node = user.partition("@")
    if role in NODE_ROLES and not node:
        node = "*"  # a shared node user: any node (a NATS wildcard token)
    sub = ["_INBOX.>"]
    services = _kv(wire.KV_SERVICES, f"{role}.*") if not node else _kv(wire.KV_SERVICES, f"{role}.{node}")
    pub = [*_reads(), services]
    if role == "scheduler":
        pub += ["$JS.API.STREAM.CREATE.*", "$JS.API.STREAM.UPDATE.*", "$JS.API.STREAM.NAMES",
                *_consumer(wire.CMD_STREAM, "scheduler", wire.SCHEDULER_CMD),
                *_consumer(wire.EVT_STREAM, "scheduler-node-events", wire.NODE_EVENTS),
                "ferry.cmd.node.>", "ferry.evt.job.>", "ferry.evt.cluster.>",
                _kv(wire.KV_JOBS), _kv(wire.KV_OPS), _kv(wire.KV_CHECKPOINTS), _kv(wire.KV_NODES),
                _kv(wire.KV_GANGS)]
    elif role == "api":
        pub += [wire.SCHEDULER_CMD, _kv(wire.KV_OPS), _kv(wire.KV_AUTOSCALE), "ferry.rpc.node.*.logs",
                wire.AUDIT_SUBJECTS,
                f"$JS.API.CONSUMER.CREATE.{wire.AUDIT_STREAM}.>", f"$JS.API.CONSUMER.MSG.NEXT.{wire.AUDIT_STREAM}.*",
                f"$JS.API.CONSUMER.DELETE.{wire.AUDIT_STREAM}.*", f"$JS.API.CONSUMER.INFO.{wire.AUDIT_STREAM}.*",
                f"$JS.API.CONSUMER.CREATE.{wire.EVT_STREAM}", f"$JS.API.CONSUMER.CREATE.{wire.EVT_STREAM}.>",
                f"$JS.API.CONSUMER.DELETE.{wire.EVT_STREAM}.*", f"$JS.API.STREAM.MSG.GET.{wire.EVT_STREAM}"]
        sub += ["ferry.evt.>", "ferry.progress.>", *(_kv(b) for b in _BUCKETS)]
    elif role == "health":
        pub += [_kv(wire.KV_NODES), "ferry.evt.cluster.>"]
    elif role == "pricing":
        pub += [_kv(wire.KV_PRICES), "ferry.evt.cluster.>"]
    elif role == "autoscaler":  # drains nodes through the scheduler, forgets the ones it terminated
        pub += [wire.SCHEDULER_CMD, _kv(wire.KV_OPS), _kv(wire.KV_FLEET), _kv(wire.KV_NODES), "ferry.evt.cluster.>"]
    elif role in ("controller", "podagent"):
        pub += ["ferry.evt.cluster.>"]
    elif role in NODE_ROLES and node:
        durable = f"{role}-{node}" if node != "*" else "*"
        pub += [f"ferry.evt.node.{node}.>", "ferry.progress.*",
                *_consumer(wire.CMD_STREAM, durable, f"ferry.cmd.node.{node}.{role}")]
        if role == "checkpointer":
            pub += [_kv(wire.KV_NODES, node)]
            sub += [f"ferry.rpc.node.{node}.logs"]
    else:
        raise ConfigError(f"no NATS role {user!r}: expected one of {', '.join(CONTROL_ROLES)} or ROLE@NODE")
    return {"publish": {"allow": pub}, "subscribe": {"allow": [*sub, *(_kv(b) for b in _BUCKETS)]}}


def _quote(value: str) -> str:
    return json.dumps(value)


def authorization_block(passwords: dict[str, str]) -> str:
    """The ``authorization`` block of nats-server's configuration for these users."""
    lines = ["authorization {", "  users = ["]
    for user, password in sorted(passwords.items()):
        perms = permissions(user)
        lines.append(f"    {{user: {_quote(user)}, password: {_quote(password)}, permissions: {{")
        for direction in ("publish", "subscribe"):
            allow = ", ".join(_quote(s) for s in perms[direction]["allow"])
            lines.append(f"      {direction}: {{allow: [{allow}]}}")
        lines.append("      allow_responses: true")
        lines.append("    }}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def read_creds(path: Path) -> NatsCreds:
    try:
        st = path.stat()
        creds = NatsCreds.model_validate_json(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the NATS credentials {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} holds no NATS credentials ({{\"user\": ..., \"password\": ...}})") from exc
    if st.st_mode & 0o007:
        raise ConfigError(f"the NATS credentials {path} are readable by others: chmod 600 {path}")
    return creds
