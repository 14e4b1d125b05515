"""``KubeApi`` against a kube-apiserver, with kubernetes_asyncio: the service account's token in a
cluster, or a kubeconfig. Kept thin on purpose: no kube-apiserver can be installed where Ferry's
suite runs, so what it does is only to map ``KubeApi``'s calls onto the API's; the decisions and
their effects are tested against an in-memory double of it (tests/kubedouble.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from ferry.common.errors import AlreadyExistsError
from ferry.controller.api import GROUP, KINDS, OPTIONAL, VERSION, Kind

_CUSTOM = {"workloads": ("kueue.x-k8s.io", "v1beta1", "workloads"),
           "inferenceservices": ("serving.kserve.io", "v1beta1", "inferenceservices"),
           "pytorchjobs": ("kubeflow.org", "v1", "pytorchjobs"),
           "ferrycheckpoints": (GROUP, VERSION, "ferrycheckpoints")}
_API_VERSIONS = {"Pod": "v1", "PyTorchJob": "kubeflow.org/v1"}


class KubeClient:
    def __init__(self, api: Any) -> None:
        self._api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> KubeClient:
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig)
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        return cls(client.ApiClient())

    def _lister(self, kind: Kind) -> Callable[..., Any]:
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces
        if kind == "nodes":
            return self.core.list_node
        group, version, plural = _CUSTOM[kind]

        def custom(**kw: Any) -> Any:
            return self.custom.list_cluster_custom_object(group, version, plural, **kw)

        return custom

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        try:
            found = await self._lister(kind)()
        except ApiException as exc:
            if exc.status == 404 and kind in OPTIONAL:
                return []  # Kueue, KServe or Kubeflow's training operator is not installed
            raise
        if isinstance(found, dict):
            return list(found.get("items") or [])
        return [self._api.sanitize_for_serialization(item) for item in found.items]

    async def changes(self) -> AsyncIterator[Kind]:
        queue: asyncio.Queue[Kind] = asyncio.Queue()

        async def follow(kind: Kind) -> None:
            while True:
                try:
                    async with watch.Watch() as w:
                        async for _ in w.stream(self._lister(kind), timeout_seconds=300):
                            queue.put_nowait(kind)
                except ApiException as exc:
                    if exc.status == 404:
                        return  # a kind this cluster does not have (Kueue's)
                    await asyncio.sleep(5)

        tasks = [asyncio.create_task(follow(k)) for k in KINDS]
        try:
            while True:
                yield await queue.get()
        finally:
            for task in tasks:
                task.cancel()

    async def create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> None:
        try:
            if kind == "pods":
                body: Any = obj  # the API takes the plain JSON object
                await self.core.create_namespaced_pod(namespace, body)
            else:
                group, version, plural = _CUSTOM[kind]
                await self.custom.create_namespaced_custom_object(group, version, namespace, plural, obj)
        except ApiException as exc:
            if exc.status == 409:
                raise AlreadyExistsError(f"{kind} {namespace}/{obj['metadata']['name']} exists") from None
            raise

    async def delete(self, kind: Kind, namespace: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            if kind == "pods":
                await self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            else:
                group, version, plural = _CUSTOM[kind]
                await self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any]) -> None:
        group, version, plural = _CUSTOM[kind]  # custom objects take a JSON merge patch
        await self.custom.patch_namespaced_custom_object(group, version, namespace, plural, name, patch)

    async def patch_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> None:
        if kind == "pods":  # a strategic merge: conditions merge by type
            await self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
        else:
            group, version, plural = _CUSTOM[kind]
            await self.custom.patch_namespaced_custom_object_status(group, version, namespace, plural, name,
                                                                    {"status": status})

    async def event(self, namespace: str, name: str, reason: str, message: str, warning: bool = True,
                    kind: str = "Pod") -> None:
        import datetime

        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: Any = {
            "metadata": {"generateName": f"{name}.ferry-", "namespace": namespace},
            "involvedObject": {"kind": kind, "namespace": namespace, "name": name,
                               "apiVersion": _API_VERSIONS.get(kind, "v1")},
            "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
            "source": {"component": "ferry-controller"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        await self.core.create_namespaced_event(namespace, body)
