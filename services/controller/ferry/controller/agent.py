"""The node agent's work: the FerryCheckpoint requests of its node, carried out through
containerd's CRI (which containers the pod has) and ``runc checkpoint`` (``ferry.kube.podimages``)
into Ferry's store, and their outcome written to the request's status."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from ferry.controller.api import KubeApi
from ferry.kube.cri import CriClient
from ferry.kube.podimages import checkpoint
from ferry.store.store import CheckpointStore

log = logging.getLogger(__name__)


def pending_for(requests: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [r for r in requests if (r.get("spec") or {}).get("node") == node
            and (r.get("status") or {}).get("phase", "Pending") == "Pending"]


async def carry_out(api: KubeApi, cri: CriClient, store: CheckpointStore, request: dict[str, Any],
                    work: Path) -> dict[str, Any]:
    """Checkpoint every running container of the request's pod; the status written, and returned."""
    meta, spec = request["metadata"], request.get("spec") or {}
    namespace, name = meta.get("namespace", "default"), meta["name"]
    started = time.monotonic()
    try:
        ids = await cri.pod_containers(namespace, spec.get("pod", ""))
        done = []
        for cid in ids:
            info = await cri.container(cid)
            if info.state != "running":
                continue
            result = await asyncio.to_thread(checkpoint, store, root=info.runc_root, container_id=cid, work=work,
                                             final=bool(spec.get("final")))
            done.append({"container": info.name, "job": result.job, "checkpoint": result.checkpoint,
                         "bytes": result.bytes_logical, "wallMs": round(result.wall_ms)})
        if not done:
            raise LookupError(f"pod {namespace}/{spec.get('pod')} has no running container on this node")
        status: dict[str, Any] = {"phase": "Succeeded", "containers": done}
    except Exception as exc:
        log.warning("checkpoint %s/%s failed: %s", namespace, name, exc)
        status = {"phase": "Failed", "message": f"{type(exc).__name__}: {exc}"}
    status["durationMs"] = round((time.monotonic() - started) * 1000)
    await api.patch_status("ferrycheckpoints", namespace, name, status)
    return status
