"""The controller's decisions, as pure functions: Kubernetes objects (as the API serves them, plain
JSON) and Ferry's checkpoint records in, actions out. The controller's loop (``ferry.kube.controller``)
feeds them what its watches saw and carries the actions out through a small API interface.

What the node side does on its own, and so needs no decision here: a pod with
``ferry.dev/checkpoint-on-stop`` ends with a final checkpoint whenever the kubelet stops it (a
drain, a Kueue preemption that suspends its Job, a suspended PyTorchJob, a spot reclaim's drain),
and a pod with ``ferry.dev/restore-from: auto`` continues from it when its workload's controller
creates it again. What is decided here:

- a pod that opts in (a ``ferry.dev/`` annotation) without ``runtimeClassName: ferry`` is marked
  (an event and a condition) and otherwise left alone;
- a running pod with ``ferry.dev/checkpoint-every`` gets a checkpoint when its newest is older;
- a node that is going (cordoned or drained, or tainted by a spot termination handler) gets a
  checkpoint of each opted-in pod that would otherwise lose its work (no checkpoint-on-stop);
- a node that is lost (NotReady longer than the grace) has each opted-in pod's newest checkpoint
  made resumable, and a pod no controller owns is recreated, without its node, restoring from it;
- a Kueue Workload evicted (preempted) whose pods would lose their work is marked, as above;
- a Kubeflow PyTorchJob whose replicas opt in but would not be checkpointed together, or could
  not resume, gets an event that says what its pod templates lack (``training_actions``): the
  coordinated checkpoint itself is the runtime's, as the replicas stop (``ferry.kube.groups``);
- a KServe InferenceService with ``ferry.dev/warm-start: "true"`` gets a checkpoint of its first
  ready replica (``reason: warm``), and then its new replicas restore from it instead of loading
  their model again (its predictor's annotations name the checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from ferry.common.errors import UsageError
from ferry.common.units import parse_duration
from ferry.kube.annotations import (
    AUTO,
    CHECKPOINT_EVERY,
    CHECKPOINT_ON_STOP,
    CRI_CONTAINER_NAME,
    CRI_POD_NAME,
    CRI_POD_NAMESPACE,
    GROUP,
    GROUP_SIZE,
    PREFIX,
    RESTORE_FROM,
    RUNTIME_HANDLER,
    is_true,
    job_of,
)
from ferry.kube.groups import group_of

Obj = Mapping[str, Any]

# taints that announce a node's end: the AWS node termination handler's and GKE's
SPOT_TAINTS = ("aws-node-termination-handler/spot-itn", "aws-node-termination-handler/asg-lifecycle-termination",
               "aws-node-termination-handler/rebalance-recommendation", "cloud.google.com/impending-node-termination",
               "node.kubernetes.io/out-of-service")
CONDITION = "FerryReady"  # the pod condition the controller sets when it leaves a pod alone, and why
LOST_AFTER_S = 60.0  # a node NotReady this long is lost
WARM = "warm"  # the reason of an InferenceService's warm checkpoint


class Checkpoint(BaseModel):
    """Ask the node agent of ``node`` to checkpoint a pod's containers (a FerryCheckpoint object)."""

    kind: Literal["checkpoint"] = "checkpoint"
    namespace: str
    pod: str
    node: str
    final: bool = False
    reason: str


class Warn(BaseModel):
    """An event on the pod and its condition FerryReady=False with this reason."""

    kind: Literal["warn"] = "warn"
    namespace: str
    pod: str
    reason: str
    message: str


class MakeResumable(BaseModel):
    """Let ``restore-from: auto`` continue the container job from its newest checkpoint (its node
    is lost: no final one will come)."""

    kind: Literal["resumable"] = "resumable"
    job: str


class Recreate(BaseModel):
    """Delete the pod (its node is lost) and create it again, unbound, restoring from its checkpoint."""

    kind: Literal["recreate"] = "recreate"
    namespace: str
    pod: str
    manifest: dict[str, Any]


class WarmStart(BaseModel):
    """Have an InferenceService's new replicas restore from a warm checkpoint of a ready one:
    its predictor's pod annotations gain ``ferry.dev/restore-from``."""

    kind: Literal["warm_start"] = "warm_start"
    namespace: str
    name: str
    restore_from: str


class Note(BaseModel):
    """An event on a workload object (not a pod): what its pod templates lack."""

    kind: Literal["note"] = "note"
    object_kind: str
    namespace: str
    name: str
    generation: int  # noted once per generation of the object's spec
    reason: str
    message: str


class Forget(BaseModel):
    """Delete a FerryCheckpoint object that has ended (the checkpoint stays in the store)."""

    kind: Literal["forget"] = "forget"
    namespace: str
    name: str


Action = Checkpoint | Warn | MakeResumable | Recreate | WarmStart | Forget | Note
KEEP_RECORDS = 5  # ended FerryCheckpoint objects kept per pod


def prune(records: Sequence[CheckpointRecord], keep: int = KEEP_RECORDS) -> list[Action]:
    """The ended FerryCheckpoint objects of each pod beyond its newest ``keep`` (periodic ones would
    otherwise pile up: 144 a day at ten minutes); warm ones stay, as their InferenceService names them."""
    by_pod: dict[tuple[str, str], list[CheckpointRecord]] = {}
    for r in records:
        if r.phase != "Pending" and r.reason != WARM and r.name:
            by_pod.setdefault((r.namespace, r.pod), []).append(r)
    actions: list[Action] = []
    for ended in by_pod.values():
        ended.sort(key=lambda r: r.created, reverse=True)
        actions += [Forget(namespace=r.namespace, name=r.name) for r in ended[keep:]]
    return actions


class CheckpointRecord(BaseModel):
    """What the controller knows of one FerryCheckpoint: the pod's, when, and how it went."""

    namespace: str
    pod: str
    created: float
    phase: Literal["Pending", "Succeeded", "Failed"]
    final: bool = False
    reason: str = ""
    refs: list[str] = []  # JOB/CHECKPOINT of each container it checkpointed (when it succeeded)
    name: str = ""  # the FerryCheckpoint object's


# -- reading objects ----------------------------------------------------------------------------------


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def opted_in(pod: Obj) -> bool:
    return any(k.startswith(PREFIX) for k in annotations_of(pod))


def has_runtime(pod: Obj) -> bool:
    return (pod.get("spec") or {}).get("runtimeClassName") == RUNTIME_HANDLER


def running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not _meta(pod).get("deletionTimestamp")


def condition(obj: Obj, kind: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c  # type: ignore[no-any-return]
    return None


def owned(pod: Obj) -> bool:
    return bool(_meta(pod).get("ownerReferences"))


def container_jobs(pod: Obj) -> list[str]:
    """The store's job id of each of the pod's containers, as the runtime names them (``job_of``
    of what containerd puts in each container's spec)."""
    meta = _meta(pod)
    spec = {**annotations_of(pod), CRI_POD_NAMESPACE: meta.get("namespace", "default"),
            CRI_POD_NAME: meta.get("name", "")}
    names = [c.get("name", "main") for c in (pod.get("spec") or {}).get("containers") or []]
    return list(dict.fromkeys(job_of({**spec, CRI_CONTAINER_NAME: n}) for n in names))


def timestamp(value: str | None) -> float | None:
    """An API time (RFC 3339, ``2027-01-15T07:00:00Z``) as seconds since the epoch."""
    if not value:
        return None
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def node_going(node: Obj) -> str | None:
    """Why a node is about to go (cordoned or drained, a spot termination taint), or None."""
    spec = node.get("spec") or {}
    for taint in spec.get("taints") or []:
        if taint.get("key") in SPOT_TAINTS:
            return f"spot termination ({taint['key']})"
    if spec.get("unschedulable"):
        return "cordoned or drained"
    return None


def node_lost(node: Obj, now: float, after_s: float = LOST_AFTER_S) -> bool:
    ready = condition(node, "Ready")
    if ready is None or ready.get("status") == "True":
        return False
    since = timestamp(ready.get("lastTransitionTime"))
    return since is not None and now - since >= after_s


# -- decisions ------------------------------------------------------------------------------------------


def _warned(pod: Obj, reason: str) -> bool:
    c = condition(pod, CONDITION)
    return c is not None and c.get("status") == "False" and c.get("reason") == reason


def _ident(pod: Obj) -> tuple[str, str]:
    meta = _meta(pod)
    return meta.get("namespace", "default"), meta.get("name", "")


def pod_actions(pod: Obj, checkpoints: Sequence[CheckpointRecord], now: float) -> list[Action]:
    """A pod on its own: refuse a misconfigured opt-in, keep periodic checkpoints coming."""
    if not opted_in(pod):
        return []
    namespace, name = _ident(pod)
    if not has_runtime(pod):
        reason = "FerryRuntimeClassMissing"
        return [] if _warned(pod, reason) else [Warn(
            namespace=namespace, pod=name, reason=reason,
            message=f"the pod has Ferry annotations but not spec.runtimeClassName: {RUNTIME_HANDLER}, so Ferry "
                    "leaves it alone: set the RuntimeClass to have it checkpointed")]
    try:
        group_of(annotations_of(pod))
    except UsageError as exc:
        reason = "FerryBadAnnotation"
        return [] if _warned(pod, reason) else [Warn(
            namespace=namespace, pod=name, reason=reason, message=f"{exc}: the pod is checkpointed on its own")]
    every = annotations_of(pod).get(CHECKPOINT_EVERY)
    if not every or not running(pod):
        return []
    try:
        interval = parse_duration(every)
    except Exception:
        reason = "FerryBadAnnotation"
        return [] if _warned(pod, reason) else [Warn(
            namespace=namespace, pod=name, reason=reason,
            message=f"{CHECKPOINT_EVERY}: {every!r} is not a duration such as 90s, 10m or 1h")]
    mine = [c for c in checkpoints if (c.namespace, c.pod) == (namespace, name) and c.phase != "Failed"]
    if any(c.phase == "Pending" for c in mine):
        return []
    started = timestamp((pod.get("status") or {}).get("startTime")) or now
    newest = max((c.created for c in mine), default=started)
    if now - newest < interval:
        return []
    return [Checkpoint(namespace=namespace, pod=name, node=(pod.get("spec") or {}).get("nodeName", ""),
                       reason="periodic")]


def node_actions(node: Obj, pods: Sequence[Obj], checkpoints: Sequence[CheckpointRecord], now: float
                 ) -> list[Action]:
    """The opted-in pods of a node that is going or lost."""
    name = _meta(node).get("name", "")
    mine = [p for p in pods if (p.get("spec") or {}).get("nodeName") == name and opted_in(p) and has_runtime(p)]
    actions: list[Action] = []
    if node_lost(node, now):
        for pod in mine:
            actions += [MakeResumable(job=job) for job in container_jobs(pod)]
            if not owned(pod) and not _meta(pod).get("deletionTimestamp"):
                namespace, pod_name = _ident(pod)
                actions.append(Recreate(namespace=namespace, pod=pod_name, manifest=replacement(pod)))
        return actions
    why = node_going(node)
    if why is None:
        return actions
    for pod in mine:
        if not running(pod) or is_true(annotations_of(pod).get(CHECKPOINT_ON_STOP)):
            continue  # the runtime checkpoints it as it stops
        namespace, pod_name = _ident(pod)
        if any((c.namespace, c.pod) == (namespace, pod_name) and c.phase == "Pending" for c in checkpoints):
            continue
        actions.append(Checkpoint(namespace=namespace, pod=pod_name, node=name, reason=f"node going: {why}"))
    return actions


def workload_actions(workload: Obj, pods: Sequence[Obj]) -> list[Action]:
    """A Kueue Workload that Kueue evicted (preempted, or its pods not ready): its job is suspended and
    its pods stopped, so each opted-in pod without checkpoint-on-stop would lose its work: say so."""
    evicted = condition(workload, "Evicted")
    if evicted is None or evicted.get("status") != "True":
        return []
    actions: list[Action] = []
    for pod in pods:
        if not opted_in(pod) or not has_runtime(pod) or is_true(annotations_of(pod).get(CHECKPOINT_ON_STOP)):
            continue
        reason = "FerryWorkLost"
        if _warned(pod, reason):
            continue
        namespace, name = _ident(pod)
        actions.append(Warn(namespace=namespace, pod=name, reason=reason,
                            message=f"Kueue evicted the workload ({evicted.get('reason', '')}); without "
                                    f"{CHECKPOINT_ON_STOP}: \"true\" this pod restarts from its last checkpoint "
                                    "at best"))
    return actions


def replacement(pod: Obj) -> dict[str, Any]:
    """The pod again, as a new object: no node, uid, status or resource version; the same names,
    the RuntimeClass, and ``restore-from: auto``."""
    meta = _meta(pod)
    keep = {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "annotations")}
    keep["annotations"] = {**(keep.get("annotations") or {}), RESTORE_FROM: AUTO}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    spec["runtimeClassName"] = RUNTIME_HANDLER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": keep, "spec": spec}


# -- KServe ---------------------------------------------------------------------------------------------

WARM_START = PREFIX + "warm-start"
ISVC_LABEL = "serving.kserve.io/inferenceservice"  # KServe's label on an InferenceService's pods


def ready(pod: Obj) -> bool:
    c = condition(pod, "Ready")
    return running(pod) and c is not None and c.get("status") == "True"


def isvc_actions(isvc: Obj, pods: Sequence[Obj], checkpoints: Sequence[CheckpointRecord]) -> list[Action]:
    """An InferenceService that asks for warm starts: a checkpoint of a ready replica once, then its
    predictor's replicas restore from it. A replica restored from it is ready as soon as it runs,
    so the model is loaded once per checkpoint, not once per replica."""
    if not is_true(annotations_of(isvc).get(WARM_START)):
        return []
    meta = _meta(isvc)
    namespace, name = meta.get("namespace", "default"), meta.get("name", "")
    predictor = ((isvc.get("spec") or {}).get("predictor") or {})
    if (predictor.get("annotations") or {}).get(RESTORE_FROM):
        return []  # warm already
    mine = [p for p in pods if _meta(p).get("namespace") == namespace
            and (_meta(p).get("labels") or {}).get(ISVC_LABEL) == name]
    names = {_meta(p).get("name") for p in mine}
    warm = [c for c in checkpoints if c.namespace == namespace and c.pod in names and c.reason == WARM]
    done = [c for c in warm if c.phase == "Succeeded" and len(c.refs) == 1]
    if done:
        newest = max(done, key=lambda c: c.created)
        return [WarmStart(namespace=namespace, name=name, restore_from=newest.refs[0])]
    if any(c.phase == "Pending" for c in warm):
        return []
    candidates = [p for p in mine if ready(p) and has_runtime(p)]
    if not candidates:
        return []
    pod = candidates[0]
    return [Checkpoint(namespace=namespace, pod=_meta(pod).get("name", ""),
                       node=(pod.get("spec") or {}).get("nodeName", ""), reason=WARM)]


# -- Kubeflow ------------------------------------------------------------------------------------------


def _lacks(template: Obj, total: int) -> list[tuple[str, str]]:
    """What one replica type's pod template lacks for its pods to be checkpointed together with
    the rest of the job's ``total`` pods as they stop, and to resume from that checkpoint."""
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    notes = dict(meta.get("annotations") or {})
    if spec.get("runtimeClassName") != RUNTIME_HANDLER:
        return [("FerryRuntimeClassMissing", f"spec.runtimeClassName: {RUNTIME_HANDLER} is missing: Ferry leaves "
                                             "these pods alone")]
    lacks = []
    if not is_true(notes.get(CHECKPOINT_ON_STOP)):
        lacks.append(("FerryNoCheckpointOnStop", f"without {CHECKPOINT_ON_STOP}: \"true\" a suspended or preempted "
                                                 "job loses the work since its last checkpoint"))
    if notes.get(RESTORE_FROM) != AUTO:
        lacks.append(("FerryNoResume", f"without {RESTORE_FROM}: auto the replicas start afresh when the job "
                                       "resumes"))
    if total > 1:
        try:
            group = group_of(notes)
        except UsageError as exc:
            return [*lacks, ("FerryBadAnnotation", str(exc))]
        if group is None:
            lacks.append(("FerryNoGroup", f"{total} replicas without {GROUP}: each is checkpointed alone, at "
                                          "another moment, and their connections to one another do not restore"))
        elif group.size != total:
            lacks.append(("FerryGroupSize", f"{GROUP_SIZE}: {group.size}, but the job has {total} replicas: its "
                                            "stops would wait for members that never come"))
        if not spec.get("hostNetwork"):
            lacks.append(("FerryPodNetwork", "the replicas' connections to one another restore only at the same "
                                             "addresses: with pod IPs they start afresh; use hostNetwork"))
    return lacks


def training_actions(job: Obj) -> list[Action]:
    """A Kubeflow PyTorchJob (``kubeflow.org/v1``) whose replicas opt in to Ferry: an event for each
    thing its replica templates lack (``_lacks``), once per generation."""
    meta = _meta(job)
    replica_specs = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {})
    templates = {kind: (int(rs.get("replicas", 1)), rs.get("template") or {}) for kind, rs in replica_specs.items()}
    opted = {kind: (n, t) for kind, (n, t) in templates.items()
             if any(k.startswith(PREFIX) for k in ((t.get("metadata") or {}).get("annotations") or {}))
             or (t.get("spec") or {}).get("runtimeClassName") == RUNTIME_HANDLER}
    if not opted:
        return []
    total = sum(n for n, _ in templates.values())
    found: dict[str, list[str]] = {}
    for kind in templates:
        if kind not in opted:
            found.setdefault("FerryPartlyOptedIn", []).append(f"{kind}: no Ferry annotations, so it is not "
                                                              "checkpointed with the others")
            continue
        for reason, message in _lacks(opted[kind][1], total):
            found.setdefault(reason, []).append(f"{kind}: {message}")
    return [Note(object_kind=job.get("kind", "PyTorchJob"), namespace=meta.get("namespace", "default"),
                 name=meta.get("name", ""), generation=int(meta.get("generation", 0)), reason=reason,
                 message="; ".join(messages)) for reason, messages in sorted(found.items())]
