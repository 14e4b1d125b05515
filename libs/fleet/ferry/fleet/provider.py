"""The small interface every provider of nodes implements, and the types it speaks in.

A provider lists the instance types it can launch (with prices, zones and markets), launches a
node of one, terminates a node, and lists the nodes it runs, with the ones it lost to an
interruption (a spot reclaim) marked. A launch is asked for under the id the autoscaler chose;
providers whose nodes are named by someone else (SLURM's node list, Kubernetes' node names) return
the name the node joins the cluster under, which the autoscaler records instead.
Errors (one tree, ``ferry.common.errors``): ``LaunchRefused`` when the provider says no (no
capacity, a quota, a bad request: the cluster stays as it was, the autoscaler backs off from that
offer), ``ProviderError`` when it cannot be reached or answers nonsense.
"""

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ferry.common.cluster import InstanceKind, InstanceTypeSpec
from ferry.common.errors import FerryError


class ProviderError(FerryError):
    """The provider could not be asked, or its answer made no sense."""


class LaunchRefused(ProviderError):
    """The provider refused a launch (capacity, quota, request): nothing was started."""


class InstanceType(InstanceKind):
    """One instance type in one zone and market, as a provider offers it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def of(cls, spec: InstanceTypeSpec) -> "InstanceType":
        """The offer a configured type makes (without how many there are, or where they come from)."""
        return cls.model_validate(spec.model_dump(exclude={"available", "group"}))


NodeState = Literal["launching", "running", "failed", "terminating", "terminated"]


class ProvidedNode(BaseModel):
    """A node a provider runs (or ran)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    instance_type: str
    zone: str
    spot: bool
    state: NodeState
    reason: str = ""
    interrupted: bool = False  # the provider took it back (a spot reclaim, an eviction)


class Provider(Protocol):
    name: str

    async def instance_types(self) -> list[InstanceType]: ...

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        """Starts a node of `offer` named `node_id` and returns once the provider has it running
        (or raises LaunchRefused with the provider's reason). The returned node's id is the name
        the node joins under: `node_id`, or the provider's own name for it."""
        ...

    async def terminate(self, node_id: str) -> None: ...

    async def nodes(self) -> list[ProvidedNode]: ...
