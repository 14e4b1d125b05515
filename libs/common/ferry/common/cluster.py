"""The cluster file of `ferry up --cluster`: simulated nodes with their labels, capacity and price.

    nodes:
      - id: node-1
        cloud: aws
        region: us-east-1
        zone: us-east-1a
        instance_type: p3.2xlarge
        spot: true
        price_per_hour: 0.92
        cpus: 8
        memory: 61GiB
        gpus: 1
      - id: node-2
        ...

Only `id` is required; the rest defaults to a small on-demand node. Errors name the file and the
field (`cluster.yaml: nodes[1].memory: bad size 'lots'`).

With `ferry up --provider local`, the file may also list the instance types the local provider can
launch when the autoscaler asks, with how many of each it has (`available`: launches past that are
refused, as a cloud with no capacity left refuses them):

    instance_types:
      - name: m5.xlarge
        zone: us-east-1a
        price_per_hour: 0.192
        cpus: 4
        memory: 16GiB
        available: 4
"""

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ferry.common.errors import UsageError
from ferry.common.units import parse_size

_ID = re.compile(r"^[A-Za-z0-9_-]+$")


def offer_key(instance_type: str, zone: str, spot: bool) -> str:
    """How an offer (an instance type in one zone and market) is named: ``m5.large/us-east-1a/spot``."""
    return f"{instance_type}/{zone}/{'spot' if spot else 'on-demand'}"


class Machine(BaseModel):
    """What a node is: where (cloud, region, zone), on which market, at what price, with what
    capacity; a node of the cluster file and an instance type a provider offers both are one."""

    model_config = ConfigDict(extra="forbid")

    cloud: str = "local"
    region: str = "local"
    zone: str = "local-a"
    spot: bool = False
    price_per_hour: float = Field(default=0.0, ge=0)
    cpus: int = Field(default=2, ge=1)
    memory: int = Field(default=4 * 2**30, ge=1)
    gpus: int = Field(default=0, ge=0)  # simulated GPUs, for placement (real ones come from NVML)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value


class InstanceKind(Machine):
    """An instance type in one zone and market."""

    name: str

    @property
    def key(self) -> str:
        return offer_key(self.name, self.zone, self.spot)


class NodeSpec(Machine):
    id: str
    instance_type: str = "local"
    gpu_model: str = "Simulated GPU"
    gpu_memory: int = Field(default=80 * 2**30, ge=1)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError("use letters, digits, '-' and '_'")
        return value

    @field_validator("gpu_memory", mode="before")
    @classmethod
    def _gpu_memory(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    def labels(self) -> dict[str, str]:
        return {"cloud": self.cloud, "region": self.region, "zone": self.zone, "instance_type": self.instance_type,
                "market": "spot" if self.spot else "on-demand"}


class InstanceTypeSpec(InstanceKind):
    """An instance type the local provider offers (see the module's docstring)."""

    available: int = Field(default=8, ge=0)
    # where the provider finds nodes of this type: the SLURM nodes (a host list, node-[1-4]) or the
    # Kubernetes node group (a Cluster API MachineDeployment's name); the clouds need none
    group: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.-]+$", value):
            raise ValueError("use letters, digits, '.', '-' and '_'")
        return value

    def node(self, node_id: str) -> NodeSpec:
        """The spec of a node of this type."""
        return NodeSpec(id=node_id, cloud=self.cloud, region=self.region, zone=self.zone, instance_type=self.name,
                        spot=self.spot, price_per_hour=self.price_per_hour, cpus=self.cpus, memory=self.memory,
                        gpus=self.gpus)


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] = Field(min_length=1)
    instance_types: list[InstanceTypeSpec] = Field(default_factory=list)

    @field_validator("instance_types")
    @classmethod
    def _distinct(cls, types: list[InstanceTypeSpec]) -> list[InstanceTypeSpec]:
        _once([t.key for t in types], "instance type {}")
        return types

    @field_validator("nodes")
    @classmethod
    def _unique(cls, nodes: list[NodeSpec]) -> list[NodeSpec]:
        _once([repr(n.id) for n in nodes], "node id {}")
        return nodes


def _once(names: list[str], what: str) -> None:
    """ValueError naming the first of `names` that appears twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what.format(name)} appears twice")
        seen.add(name)


def parse_cluster(text: str, source: str) -> ClusterSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise UsageError(f"{source}: {where}not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a mapping with a `nodes:` list at the top level")
    try:
        return ClusterSpec.model_validate(data)
    except (ValidationError, UsageError) as exc:
        if isinstance(exc, UsageError):
            raise UsageError(f"{source}: {exc}") from exc
        first = exc.errors()[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
        raise UsageError(f"{source}: {path or 'nodes'}: {first['msg']}") from exc


def load_cluster(path: str | Path) -> ClusterSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read cluster file {p}: {exc.strerror}") from exc
    return parse_cluster(text, p.name)
