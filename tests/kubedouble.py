"""An in-memory double of the Kubernetes API as ``ferry.controller.api.KubeApi`` sees it (no
kube-apiserver can be installed on the machines the suite runs on): objects by kind, namespace
and name, creation times and uids as the API sets them, name conflicts, status patches (a pod's
conditions merged by type, as a strategic merge does), events, and a change feed."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from ferry.common.errors import AlreadyExistsError
from ferry.controller.api import KINDS, Kind


class KubeDouble:
    def __init__(self) -> None:
        self.objects: dict[Kind, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self.events: list[dict[str, Any]] = []
        self._feeds: list[asyncio.Queue[Kind]] = []

    def _changed(self, kind: Kind) -> None:
        for feed in self._feeds:
            feed.put_nowait(kind)

    def put(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """What another client (a kubelet, a user, Kueue) writes: stored as given."""
        meta = obj["metadata"]
        self.objects[kind][(meta.get("namespace", ""), meta["name"])] = obj
        self._changed(kind)
        return obj

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects[kind].get((namespace, name))

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects[kind].values()]

    async def changes(self) -> AsyncIterator[Kind]:
        feed: asyncio.Queue[Kind] = asyncio.Queue()
        self._feeds.append(feed)
        try:
            while True:
                yield await feed.get()
        finally:
            self._feeds.remove(feed)

    async def create(self, kind: Kind, namespace: str, obj: dict[str, Any]) -> None:
        key = (namespace, obj["metadata"]["name"])
        if key in self.objects[kind]:
            raise AlreadyExistsError(f"{kind} {namespace}/{key[1]} exists")
        stored = copy.deepcopy(obj)
        stored["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                                  creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.put(kind, stored)

    async def delete(self, kind: Kind, namespace: str, name: str) -> None:
        if self.objects[kind].pop((namespace, name), None) is not None:
            self._changed(kind)

    async def patch(self, kind: Kind, namespace: str, name: str, patch: dict[str, Any]) -> None:
        def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:  # RFC 7386
            for key, value in patch.items():
                if value is None:
                    into.pop(key, None)
                elif isinstance(value, dict) and isinstance(into.get(key), dict):
                    merge(into[key], value)
                else:
                    into[key] = copy.deepcopy(value)

        merge(self.objects[kind][(namespace, name)], patch)
        self._changed(kind)

    async def patch_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> None:
        obj = self.objects[kind][(namespace, name)]
        current = obj.setdefault("status", {})
        for key, value in status.items():
            if key == "conditions" and kind == "pods":
                by_type = {c["type"]: c for c in current.get("conditions") or []}
                by_type.update({c["type"]: c for c in value})
                current["conditions"] = list(by_type.values())
            else:
                current[key] = value
        self._changed(kind)

    async def event(self, namespace: str, name: str, reason: str, message: str, warning: bool = True,
                    kind: str = "Pod") -> None:
        self.events.append({"namespace": namespace, "name": name, "kind": kind,
                            "reason": reason, "message": message, "type": "Warning" if warning else "Normal"})
