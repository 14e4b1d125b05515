"""The controller's decisions (ferry.kube.reconcile), on Kubernetes objects that kubernetes-validate
checks against the API's own schemas (1.31) before they are used: a misconfigured opt-in is
marked once and left alone, periodic checkpoints come when due and not while one is pending, a
going node's pods that would lose their work are checkpointed, a lost node's pods are made
resumable and a pod nobody owns is recreated unbound to restore, a Kueue eviction of pods
without checkpoint-on-stop is said, and a KServe InferenceService that asks for warm starts gets
one checkpoint of a ready replica that its new replicas then restore from."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from ferry.kube.reconcile import (
    Checkpoint,
    CheckpointRecord,
    Forget,
    MakeResumable,
    Recreate,
    WarmStart,
    Warn,
    isvc_actions,
    node_actions,
    pod_actions,
    prune,
    replacement,
    workload_actions,
)

K8S = "1.31"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
T0 = "2027-01-15T07:00:00Z"  # an hour before NOW


def valid(obj: dict[str, Any]) -> dict[str, Any]:
    kubernetes_validate.validate(obj, K8S, strict=True)
    return obj


def make_pod(name: str = "trainer", *, annotations: dict[str, str] | None = None, runtime: str | None = "ferry",
             node: str = "node-a", phase: str = "Running", owner: bool = False,
             conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "annotations": annotations if annotations is not None else {
                                "ferry.dev/checkpoint-every": "10m", "ferry.dev/checkpoint-on-stop": "true"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer", "uid": "j1",
                                    "controller": True}]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.local/train:1"}], "nodeName": node}
    if runtime:
        spec["runtimeClassName"] = runtime
    status: dict[str, Any] = {"phase": phase, "startTime": T0}
    if conditions:
        status["conditions"] = conditions
    return valid({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status})


def make_node(name: str = "node-a", *, unschedulable: bool = False, taints: list[dict[str, str]] | None = None,
              ready: str = "True", since: str = T0) -> dict[str, Any]:
    spec: dict[str, Any] = {"unschedulable": unschedulable} if unschedulable else {}
    if taints:
        spec["taints"] = taints
    return valid({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": spec,
                  "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}]}})


def record(pod: str, created: float, phase: str = "Succeeded") -> CheckpointRecord:
    return CheckpointRecord(namespace="ml", pod=pod, created=created, phase=phase)


def test_an_opt_in_without_the_runtime_class_is_marked_once_and_left_alone() -> None:
    pod = make_pod(runtime=None)
    [warn] = pod_actions(pod, [], NOW)
    assert isinstance(warn, Warn) and warn.reason == "FerryRuntimeClassMissing" and "runtimeClassName" in warn.message
    marked = make_pod(runtime=None, conditions=[{"type": "FerryReady", "status": "False",
                                                 "reason": "FerryRuntimeClassMissing"}])
    assert pod_actions(marked, [], NOW) == []
    assert pod_actions(make_pod(annotations={}, runtime=None), [], NOW) == []  # not opted in: not Ferry's


def test_periodic_checkpoints_come_when_due_and_never_two_at_once() -> None:
    pod = make_pod()
    [due] = pod_actions(pod, [], NOW)  # started an hour ago, none yet
    assert due == Checkpoint(namespace="ml", pod="trainer", node="node-a", reason="periodic")
    assert pod_actions(pod, [record("trainer", NOW - 300)], NOW) == []  # 5 min old: not due
    assert pod_actions(pod, [record("trainer", NOW - 900)], NOW) != []
    assert pod_actions(pod, [record("trainer", NOW - 900), record("trainer", NOW - 5, "Pending")], NOW) == []
    assert pod_actions(pod, [record("trainer", NOW - 30, "Failed")], NOW) != []  # a failed one does not count
    assert pod_actions(make_pod(phase="Pending"), [], NOW) == []
    [bad] = pod_actions(make_pod(annotations={"ferry.dev/checkpoint-every": "often"}), [], NOW)
    assert isinstance(bad, Warn) and bad.reason == "FerryBadAnnotation"
    [bad] = pod_actions(make_pod(annotations={"ferry.dev/group": "bert", "ferry.dev/group-size": "-1"}), [], NOW)
    assert isinstance(bad, Warn) and bad.reason == "FerryBadAnnotation" and "group-size" in bad.message


@pytest.mark.parametrize("node", [
    make_node(unschedulable=True),
    make_node(taints=[{"key": "aws-node-termination-handler/spot-itn", "value": "1", "effect": "NoSchedule"}]),
    make_node(taints=[{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]),
])
def test_a_going_node_checkpoints_the_pods_that_would_otherwise_lose_their_work(node: dict[str, Any]) -> None:
    keeps = make_pod("keeps")  # checkpoint-on-stop: the runtime checkpoints it as it stops
    loses = make_pod("loses", annotations={"ferry.dev/checkpoint-every": "1h"})
    other = make_pod("elsewhere", annotations={"ferry.dev/checkpoint-every": "1h"}, node="node-b")
    actions = node_actions(node, [keeps, loses, other], [], NOW)
    assert [(a.pod, a.final) for a in actions if isinstance(a, Checkpoint)] == [("loses", False)]
    assert "node going" in actions[0].reason  # type: ignore[union-attr]
    assert node_actions(node, [loses], [record("loses", NOW, "Pending")], NOW) == []
    assert node_actions(make_node(), [keeps, loses], [], NOW) == []  # a healthy node: nothing


def test_a_lost_node_makes_its_pods_resumable_and_recreates_the_ones_nobody_owns() -> None:
    lost = make_node(ready="Unknown", since="2027-01-15T07:58:00Z")  # two minutes NotReady
    bare, of_job = make_pod("bare"), make_pod("of-job", owner=True)
    actions = node_actions(lost, [bare, of_job], [], NOW)
    assert [a.job for a in actions if isinstance(a, MakeResumable)] == ["k8s.ml.bare.main", "k8s.ml.of-job.main"]
    [again] = [a for a in actions if isinstance(a, Recreate)]  # the Job recreates its own pod
    assert again.pod == "bare"
    manifest = valid(again.manifest)
    assert "nodeName" not in manifest["spec"] and manifest["spec"]["runtimeClassName"] == "ferry"
    assert manifest["metadata"]["annotations"]["ferry.dev/restore-from"] == "auto"
    assert "uid" not in manifest["metadata"] and "status" not in manifest
    just_now = make_node(ready="False", since="2027-01-15T07:59:30Z")  # 30 s: not lost yet
    assert node_actions(just_now, [bare], [], NOW) == []


def test_a_replacement_keeps_the_pods_names_and_own_annotations() -> None:
    pod = make_pod("trainer", annotations={"ferry.dev/job": "t-{index}", "team": "ml"})
    copy_ = replacement(copy.deepcopy(pod))
    assert copy_["metadata"]["name"] == "trainer" and copy_["metadata"]["annotations"]["team"] == "ml"
    assert pod["metadata"]["annotations"] == {"ferry.dev/job": "t-{index}", "team": "ml"}  # the input is untouched


def workload(evicted: bool) -> dict[str, Any]:
    """A Kueue Workload (kueue.x-k8s.io/v1beta1) as Kueue reports a preemption; Kueue ships no Python
    SDK to validate it with, so its shape follows Kueue's API reference."""
    conditions = [{"type": "Admitted", "status": "False", "reason": "NoReservation", "message": "",
                   "lastTransitionTime": T0}]
    if evicted:
        conditions.append({"type": "Evicted", "status": "True", "reason": "Preempted",
                           "message": "Preempted to accommodate a higher priority Workload",
                           "lastTransitionTime": T0})
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": "job-trainer-1a2b3", "namespace": "ml"},
            "spec": {"queueName": "team-ml", "podSets": [{"name": "main", "count": 2}]},
            "status": {"conditions": conditions}}


def test_a_kueue_eviction_of_pods_that_would_lose_their_work_is_said() -> None:
    keeps = make_pod("keeps", owner=True)
    loses = make_pod("loses", owner=True, annotations={"ferry.dev/checkpoint-every": "1h"})
    [warn] = workload_actions(workload(evicted=True), [keeps, loses])
    assert isinstance(warn, Warn) and warn.pod == "loses" and warn.reason == "FerryWorkLost"
    assert "Preempted" in warn.message and "checkpoint-on-stop" in warn.message
    assert workload_actions(workload(evicted=False), [keeps, loses]) == []


def isvc(warm: bool = True, restore_from: str | None = None) -> dict[str, Any]:
    """A KServe InferenceService (serving.kserve.io/v1beta1). KServe's SDK pins protobuf below 7,
    which Ferry's gRPC code needs, so its shape follows KServe's API reference instead of the SDK."""
    predictor: dict[str, Any] = {"runtimeClassName": "ferry", "model": {"modelFormat": {"name": "pytorch"},
                                                                        "storageUri": "pvc://models/resnet"}}
    if restore_from:
        predictor["annotations"] = {"ferry.dev/restore-from": restore_from}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "resnet", "namespace": "ml",
                         "annotations": {"ferry.dev/warm-start": "true"} if warm else {}},
            "spec": {"predictor": predictor}}


def replica(name: str, is_ready: bool) -> dict[str, Any]:
    pod = make_pod(name, annotations={"ferry.dev/checkpoint-on-stop": "true"},
                   conditions=[{"type": "Ready", "status": "True" if is_ready else "False"}])
    pod["metadata"]["labels"] = {"serving.kserve.io/inferenceservice": "resnet"}
    return valid(pod)


def warm_record(pod: str, phase: str, refs: list[str]) -> CheckpointRecord:
    return CheckpointRecord(namespace="ml", pod=pod, created=NOW - 10, phase=phase,
                            reason="warm", refs=refs)


def test_an_inference_service_gets_one_warm_checkpoint_and_then_its_replicas_restore_from_it() -> None:
    loading, up = replica("resnet-a", is_ready=False), replica("resnet-b", is_ready=True)
    [ask] = isvc_actions(isvc(), [loading, up], [])
    assert isinstance(ask, Checkpoint) and ask.pod == "resnet-b" and ask.reason == "warm" and not ask.final
    assert isvc_actions(isvc(), [loading, up], [warm_record("resnet-b", "Pending", [])]) == []
    [warm] = isvc_actions(isvc(), [up], [warm_record("resnet-b", "Succeeded", ["k8s.ml.resnet-b.main/ck-1"])])
    assert isinstance(warm, WarmStart) and warm.restore_from == "k8s.ml.resnet-b.main/ck-1"
    assert isvc_actions(isvc(restore_from="k8s.ml.resnet-b.main/ck-1"), [up], []) == []  # warm already
    assert isvc_actions(isvc(warm=False), [up], []) == []  # not asked for
    assert isvc_actions(isvc(), [loading], []) == []  # no ready replica yet
    # a failed warm checkpoint is tried again
    [again] = isvc_actions(isvc(), [up], [warm_record("resnet-b", "Failed", [])])
    assert isinstance(again, Checkpoint)


def test_ended_checkpoint_records_are_pruned_to_the_newest_few_per_pod() -> None:
    def rec(pod: str, i: int, phase: str = "Succeeded", reason: str = "periodic") -> CheckpointRecord:
        return CheckpointRecord(namespace="ml", pod=pod, created=NOW - 600 * i, phase=phase,
                                reason=reason, name=f"{pod}-{i}")

    records = [rec("a", i) for i in range(8)] + [rec("a", 9, "Pending"), rec("a", 10, reason="warm")]
    records += [rec("b", i) for i in range(3)]
    forgotten = prune(records, keep=5)
    assert all(isinstance(f, Forget) for f in forgotten)
    assert sorted(f.name for f in forgotten) == ["a-5", "a-6", "a-7"]  # type: ignore[union-attr]
