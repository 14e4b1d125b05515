"""One pass of the controller: what the API shows, the decisions of ``ferry.kube.reconcile``, and
those carried out. The service (``ferry.controller.service``) runs a pass whenever a watch sees a
change, and when the earliest time-based decision is due (a periodic checkpoint, a node's grace)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ferry.common.errors import AlreadyExistsError
from ferry.controller.api import CHECKPOINT_KIND, GROUP, VERSION, KubeApi
from ferry.kube.annotations import RESTORE_FROM
from ferry.kube.reconcile import (
    CONDITION,
    Action,
    Checkpoint,
    CheckpointRecord,
    Forget,
    MakeResumable,
    Note,
    Recreate,
    WarmStart,
    Warn,
    isvc_actions,
    node_actions,
    pod_actions,
    prune,
    timestamp,
    training_actions,
    workload_actions,
)
from ferry.store.store import CheckpointStore

log = logging.getLogger(__name__)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def record_of(obj: dict[str, Any]) -> CheckpointRecord:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ts = timestamp(obj["metadata"].get("creationTimestamp")) or 0.0
    refs = [f"{c['job']}/{c['checkpoint']}" for c in status.get("containers") or [] if "job" in c and "checkpoint" in c]
    return CheckpointRecord(namespace=obj["metadata"].get("namespace", "default"), pod=spec.get("pod", ""),
                            created=ts, phase=status.get("phase") or "Pending", final=bool(spec.get("final")),
                            reason=spec.get("reason", ""), refs=refs, name=obj["metadata"]["name"])


def _owner_key(obj: dict[str, Any]) -> set[tuple[str, str]]:
    return {(o.get("kind", ""), o.get("name", "")) for o in obj["metadata"].get("ownerReferences") or []}


def workload_pods(workload: dict[str, Any], pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of the job a Kueue Workload stands for: owned by the Workload's owner."""
    owners = _owner_key(workload)
    namespace = workload["metadata"].get("namespace")
    return [p for p in pods if p["metadata"].get("namespace") == namespace and _owner_key(p) & owners]


async def decide(api: KubeApi, now: float) -> list[Action]:
    pods, nodes = await api.list("pods"), await api.list("nodes")
    workloads, requests = await api.list("workloads"), await api.list("ferrycheckpoints")
    records = [record_of(r) for r in requests]
    actions: list[Action] = []
    for pod in pods:
        actions += pod_actions(pod, records, now)
    for node in nodes:
        actions += node_actions(node, pods, records, now)
    for workload in workloads:
        actions += workload_actions(workload, workload_pods(workload, pods))
    for isvc in await api.list("inferenceservices"):
        actions += isvc_actions(isvc, pods, records)
    for job in await api.list("pytorchjobs"):
        actions += training_actions(job)
    actions += prune(records)
    return actions


def checkpoint_request(action: Checkpoint, now: float) -> dict[str, Any]:
    """The FerryCheckpoint object that asks ``action.node``'s agent for the checkpoint."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": CHECKPOINT_KIND,
            "metadata": {"name": f"{action.pod}-{int(now)}"[:253], "namespace": action.namespace,
                         "labels": {"ferry.dev/pod": action.pod[:63], "ferry.dev/node": action.node[:63]}},
            "spec": {"pod": action.pod, "node": action.node, "final": action.final, "reason": action.reason},
            "status": {"phase": "Pending"}}


async def carry_out(api: KubeApi, store: CheckpointStore | None, actions: Sequence[Action], now: float,
                    noted: set[tuple[str, str, str, int, str]] | None = None) -> list[Action]:
    """The actions, in order; those carried out. ``noted``: the Notes made already (by this
    controller), which are not made again; the set gains the new ones."""
    from ferry.kube.podimages import make_resumable

    noted = set() if noted is None else noted
    done: list[Action] = []
    for action in actions:
        if isinstance(action, Note):
            key = (action.object_kind, action.namespace, action.name, action.generation, action.reason)
            if key in noted:
                continue
            noted.add(key)
        log.info("decision: %s", action.model_dump_json())
        done.append(action)
        if isinstance(action, Checkpoint):
            try:
                await api.create("ferrycheckpoints", action.namespace, checkpoint_request(action, now))
            except AlreadyExistsError:
                pass  # asked already in this second
        elif isinstance(action, Warn):
            await api.event(action.namespace, action.pod, action.reason, action.message)
            await api.patch_status("pods", action.namespace, action.pod, {"conditions": [
                {"type": CONDITION, "status": "False", "reason": action.reason, "message": action.message,
                 "lastTransitionTime": _iso(now)}]})
        elif isinstance(action, MakeResumable):
            if store is None:
                log.warning("no store: cannot make %s resumable", action.job)
                continue
            made = make_resumable(store, action.job)
            log.info("job %s: %s", action.job, f"resumable from {made}" if made else "has no checkpoint")
        elif isinstance(action, Note):
            await api.event(action.namespace, action.name, action.reason, action.message, kind=action.object_kind)
        elif isinstance(action, Forget):
            await api.delete("ferrycheckpoints", action.namespace, action.name)
        elif isinstance(action, WarmStart):
            await api.patch("inferenceservices", action.namespace, action.name,
                            {"spec": {"predictor": {"annotations": {RESTORE_FROM: action.restore_from}}}})
        elif isinstance(action, Recreate):
            await api.delete("pods", action.namespace, action.pod)
            await api.create("pods", action.namespace, action.manifest)
            await api.event(action.namespace, action.pod, "FerryRecreated",
                            "its node was lost: created again, restoring from its newest checkpoint", warning=False)
    return done
