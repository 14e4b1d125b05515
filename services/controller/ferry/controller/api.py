"""The small interface through which the controller and the node agent talk to Kubernetes: lists,
a change feed, and the few writes they make. ``ferry.controller.kubeclient`` implements it with
kubernetes_asyncio against a kube-apiserver; the tests use an in-memory double (no kube-apiserver
can be installed on the machines the suite runs on)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

Kind = Literal["pods", "nodes", "workloads", "ferrycheckpoints", "inferenceservices", "pytorchjobs"]
KINDS: tuple[Kind, ...] = ("pods", "nodes", "workloads", "ferrycheckpoints", "inferenceservices", "pytorchjobs")
OPTIONAL: tuple[Kind, ...] = ("workloads", "inferenceservices", "pytorchjobs")  # Kueue's, KServe's, Kubeflow's
GROUP = "ferry.dev"
VERSION = "v1alpha1"
CHECKPOINT_KIND = "FerryCheckpoint"


class KubeApi(Protocol):
    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        """Every object of ``kind`` (all namespaces), as the API serves it."""

    def changes(self) -> AsyncIterator[Kind]:
        """The kinds of objects that changed, as their watches see it (a kind may repeat)."""

    async def create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> None:
        """Create ``obj``; AlreadyExistsError when its name is taken."""

    async def delete(self, kind: Kind, namespace: str, name: str) -> None:
        """Delete it now (no grace: its node is lost); a missing object is fine."""

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge ``patch`` into the object (a JSON merge patch)."""

    async def patch_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge ``status`` into the object's status (for pods: ``conditions`` entries by type)."""

    async def event(self, namespace: str, name: str, reason: str, message: str, warning: bool = True,
                    kind: str = "Pod") -> None:
        """An Event on the object (a pod unless ``kind`` says otherwise: ``PyTorchJob``), as ``kubectl
        describe`` shows."""
