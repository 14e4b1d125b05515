"""What a user may ask to run: the rules of a job request, checked in one place.

The CLI checks a request before it contacts anything, and the API checks the same model again, so a
client other than the CLI gets the same answers. Field names are those of the gRPC
``SubmitJobRequest``, so the request maps to and from protobuf by name. Every refusal is one line
naming the flag, as a :class:`UsageError` (exit code 2).
"""

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ferry.common.errors import UsageError
from ferry.common.jobnet import parse_publish
from ferry.common.models import DEFAULT_TENANT, Network
from ferry.common.sealing import SealedEnv
from ferry.common.units import format_bytes
from ferry.common.wire import JobSpec, is_token

NAME_MAX = 63  # a DNS label: fits Kubernetes and SLURM names and one NATS subject token
NODE_MAX = 253
GPU_MODEL_MAX = 64
PATH_MAX = 4096
ENV_MAX = 1024  # variables
EXEC_MAX = 1 << 20  # bytes of argv and environment together (Linux allows 2 MiB with the default stack)
CPUS_MAX = 4096
GPUS_MAX = 1024
BYTES_MAX = 1 << 50  # 1 PiB
PRIORITY_MAX = 1_000_000
DURATION_MAX = 10 * 365 * 86400.0  # ten years
PUBLISH_MAX = 64  # published ports of one job
LABELS_MAX = 32
LABEL_VALUE_MAX = 253

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?")

FLAGS = {
    "name": "--name", "argv": "command", "env": "--env", "cwd": "--cwd", "node": "--node",
    "checkpoint_every_s": "--checkpoint-every", "priority": "--priority", "cpus": "--cpus",
    "memory_bytes": "--memory", "gpus": "--gpus", "deadline_s": "--deadline", "max_downtime_s": "--max-downtime",
    "work_s": "--work",
    "gpu_model": "--gpu-model", "gpu_memory_bytes": "--gpu-memory", "gpu_shared": "--gpu-shared",
    "network": "--network", "here": "--here", "adopt_pid": "PID", "bundle": "--bundle",
    "image": "--image", "publish": "--publish", "labels": "--label", "gang": "--gang", "right_size": "--right-size",
}
_SIZES = {"memory_bytes", "gpu_memory_bytes"}


class JobRequest(BaseModel):
    """A job as submitted (``ferry run``, ``SubmitJob``); an empty name means: generate one."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=False)

    name: str = ""
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    node: str = ""
    checkpoint_every_s: float = Field(0.0, ge=0, le=DURATION_MAX)
    priority: int = Field(0, ge=-PRIORITY_MAX, le=PRIORITY_MAX)
    cpus: float = Field(0.0, ge=0, le=CPUS_MAX)
    memory_bytes: int = Field(0, ge=0, le=BYTES_MAX)
    gpus: int = Field(0, ge=0, le=GPUS_MAX)
    deadline_s: float = Field(0.0, ge=0, le=DURATION_MAX)
    max_downtime_s: float = Field(0.0, ge=0, le=DURATION_MAX)
    work_s: float = Field(0.0, ge=0, le=DURATION_MAX)
    gpu_model: str = Field("", max_length=GPU_MODEL_MAX)
    gpu_memory_bytes: int = Field(0, ge=0, le=BYTES_MAX)
    gpu_shared: bool = False
    network: str = ""  # empty: the default (see resolved_network)
    here: bool = False  # in the foreground of the caller, on `node`
    adopt_pid: int = Field(0, ge=0, le=1 << 22)  # `ferry adopt`: the running process on `node` (0: none)
    bundle: str = Field("", max_length=PATH_MAX)  # an OCI runtime bundle on the node
    image: str = Field("", max_length=PATH_MAX)  # oci:DIR[:TAG] or oci-archive:TAR[:TAG] on the node
    publish: list[str] = Field(default_factory=list, max_length=PUBLISH_MAX)  # HOST:JOB[/tcp|udp], bridge only
    labels: dict[str, str] = Field(default_factory=dict)  # e.g. source=slurm, slurm.job=42
    gang: str = ""  # the gang it is checkpointed and restored with (ferry.policy.gangs)
    right_size: bool = False  # its memory request follows its use; it moves when it outgrows its node

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > LABELS_MAX:
            raise ValueError(f"at most {LABELS_MAX} labels")
        for key, value in v.items():
            if not _LABEL_KEY.fullmatch(key):
                raise ValueError(f"label {key!r}: use 1 to 63 letters, digits, '.', '/', '-' and '_', starting "
                                 "and ending with a letter or digit")
            if len(value) > LABEL_VALUE_MAX or not value.isprintable():
                raise ValueError(f"the value of label {key}: at most {LABEL_VALUE_MAX} printable characters")
        return v

    @field_validator("publish")
    @classmethod
    def _publish(cls, v: list[str]) -> list[str]:
        maps = [parse_publish(p) for p in v]  # UsageError: its own message, one line
        seen: set[tuple[str, int]] = set()
        for m in maps:
            if (m.proto, m.host) in seen:
                raise ValueError(f"host port {m.host}/{m.proto} is given twice")
            seen.add((m.proto, m.host))
        return [str(m) for m in maps]

    @field_validator("bundle")
    @classmethod
    def _bundle(cls, v: str) -> str:
        if v and (not v.startswith("/") or "\0" in v):
            raise ValueError("give the bundle's absolute path")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        kind, sep, path = v.partition(":")
        if v and (kind not in ("oci", "oci-archive") or not sep or not path.startswith("/") or "\0" in v):
            raise ValueError("use oci:/LAYOUT_DIR[:TAG] or oci-archive:/FILE.tar[:TAG] (no registry is reachable)")
        return v

    @field_validator("name", "gang")
    @classmethod
    def _name(cls, v: str) -> str:
        if v and (len(v) > NAME_MAX or not is_token(v)):
            raise ValueError(f"use 1 to {NAME_MAX} letters, digits, '-' and '_'")
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if not v or not v[0]:
            raise ValueError("empty command: give the program to run after `--`, e.g. ferry run -- python train.py")
        if any("\0" in a for a in v):
            raise ValueError("bad command: an argument holds a NUL byte")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > ENV_MAX:
            raise ValueError(f"at most {ENV_MAX} variables")
        for key, value in v.items():
            if not _ENV_KEY.fullmatch(key):
                raise ValueError(f"variable name {key!r}: use letters, digits and '_', not starting with a digit")
            if "\0" in value:
                raise ValueError(f"the value of {key} holds a NUL byte")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str) -> str:
        if v and (not v.startswith("/") or "\0" in v or len(v) > PATH_MAX):
            raise ValueError(f"must be an absolute path of at most {PATH_MAX} bytes")
        return v

    @field_validator("node")
    @classmethod
    def _node(cls, v: str) -> str:
        if v and (len(v) > NODE_MAX or not is_token(v)):
            raise ValueError("no such node name: `ferry nodes` lists them")
        return v

    @field_validator("network")
    @classmethod
    def _network(cls, v: str) -> str:
        if v and v not in {n.value for n in Network}:
            raise ValueError(f"unknown network {v!r}: use bridge (an address of its own), isolated (loopback "
                             "only) or host (the node's)")
        return v

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, v: str) -> str:
        if not v.isprintable():
            raise ValueError("use printable characters, e.g. H100")
        return v

    def resolved_network(self) -> Network:
        """The asked network, or the default: ``bridge`` for a job Ferry starts itself; ``host`` for
        a container (its bundle says), a ``--here`` job and an adopted process (their caller's)."""
        if self.network:
            return Network(self.network)
        return Network.HOST if (self.bundle or self.image or self.here or self.adopt_pid) else Network.BRIDGE

    def exec_bytes(self) -> int:
        return sum(len(a) + 1 for a in self.argv) + sum(len(k) + len(v) + 2 for k, v in self.env.items())

    def to_spec(self, name: str, now: float, env: SealedEnv, tenant: str = DEFAULT_TENANT) -> JobSpec:
        """The spec the scheduler gets; `name` replaces an empty one, the deadline becomes absolute,
        `env` is this request's environment sealed to the nodes (ferry.common.sealing)."""
        return JobSpec(
            name=name, tenant=tenant, argv=self.argv, env=env, cwd=self.cwd or "/", node=self.node or None,
            checkpoint_every_s=self.checkpoint_every_s, priority=self.priority, cpus=self.cpus,
            memory_bytes=self.memory_bytes, gpus=self.gpus,
            deadline=now + self.deadline_s if self.deadline_s else None,
            max_downtime_s=self.max_downtime_s or None, work_s=self.work_s or None, gpu_model=self.gpu_model or None,
            gpu_memory_bytes=self.gpu_memory_bytes, gpu_shared=self.gpu_shared,
            network=self.resolved_network(), here=self.here, adopt_pid=self.adopt_pid or None,
            bundle=self.bundle or None, image=self.image or None,
            publish=[parse_publish(p) for p in self.publish], labels=self.labels, gang=self.gang or None,
            right_size=self.right_size)


def check_request(fields: dict[str, Any]) -> JobRequest:
    """`fields` as a valid request, or a one-line :class:`UsageError` naming the first bad flag."""
    try:
        request = JobRequest.model_validate(fields)
    except ValidationError as exc:
        raise UsageError(_one_line(exc.errors()[0], fields)) from None
    if request.bundle and request.image:
        raise UsageError("give --bundle or --image, not both")
    if (request.bundle or request.image) and request.network in (Network.ISOLATED.value, Network.BRIDGE.value):
        raise UsageError("--network: a container has the network its bundle's config.json gives it")
    if request.publish and request.resolved_network() != Network.BRIDGE:
        raise UsageError("--publish needs --network bridge (the job's own address, which the node's port reaches)")
    if request.network == Network.BRIDGE.value and (request.here or request.adopt_pid):
        raise UsageError("--network bridge: a job run --here or adopted has the network its caller gave it")
    if request.adopt_pid and not request.node:
        raise UsageError("adopt: say which node the process runs on with --node NODE (or FERRY_NODE_ID)")
    if request.adopt_pid and request.here:
        raise UsageError("adopt: an adopted process runs where it is; --here does not apply")
    if request.here and not request.node:
        raise UsageError("--here: say which node this is with --node NODE (or FERRY_NODE)")
    if request.gang and (request.here or request.adopt_pid):
        raise UsageError("--gang: a gang is moved and restarted by Ferry, not by another supervisor (drop "
                         "--here, or adopt the process alone)")
    if request.gang and request.resolved_network() != Network.BRIDGE:
        raise UsageError("--gang needs --network bridge: members keep their addresses wherever they go, and "
                         "their links are what a group checkpoint locks")
    if request.exec_bytes() > EXEC_MAX:
        raise UsageError(f"the command and --env together are {format_bytes(request.exec_bytes())}: "
                         f"at most {format_bytes(EXEC_MAX)}")
    return request


def _one_line(error: Any, fields: dict[str, Any]) -> str:
    loc = error.get("loc") or ("request",)
    field = str(loc[0])
    flag = FLAGS.get(field, field)
    value = fields.get(field)
    kind, ctx = error.get("type", ""), error.get("ctx") or {}
    if kind == "finite_number":
        why = "it must be a finite number"
    elif kind in ("less_than_equal", "greater_than_equal"):
        bound: float = ctx["le"] if "le" in ctx else ctx["ge"]
        shown = format_bytes(bound) if field in _SIZES else f"{bound:g}" if isinstance(bound, float) else str(bound)
        why = f"it must be {'at most' if kind == 'less_than_equal' else 'at least'} {shown}"
    elif kind == "extra_forbidden":
        return f"unknown field {field!r} in the job request"
    else:
        why = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if field == "argv":
        return why
    shown_value = format_bytes(value) if field in _SIZES and isinstance(value, int) else _show(value)
    return f"bad {flag}{' ' + shown_value if shown_value else ''}: {why}"


def _show(value: Any) -> str:
    if value is None or value == "" or isinstance(value, (list, dict)):
        return ""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
