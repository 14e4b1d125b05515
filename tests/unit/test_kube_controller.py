"""The controller's passes (ferry.controller.controller) against an in-memory double of the
Kubernetes API: a misconfigured pod gets one event and a condition, a periodic checkpoint is asked
of its node's agent once, a lost node's bare pod comes back unbound with restore-from auto and its
job resumable from its newest checkpoint, a Kueue eviction is said on the pods that lose work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from ferry.controller.controller import carry_out, decide
from ferry.kube.podimages import resumable
from ferry.store.local import LocalBackend
from ferry.store.store import CheckpointStore
from tests.kubedouble import KubeDouble
from tests.unit.test_kube_reconcile import NOW, isvc, make_node, make_pod, replica, workload


def run_pass(api: KubeDouble, store: CheckpointStore | None = None, now: float | None = None) -> list[Any]:
    async def go() -> list[Any]:
        at = time.time() if now is None else now
        actions = await decide(api, at)
        await carry_out(api, store, actions, at)
        return actions

    return asyncio.run(go())


def test_a_pod_without_the_runtime_class_gets_one_event_and_a_condition() -> None:
    api = KubeDouble()
    api.put("pods", make_pod(runtime=None))
    run_pass(api)
    run_pass(api)
    assert [e["reason"] for e in api.events] == ["FerryRuntimeClassMissing"]
    pod = api.get("pods", "ml", "trainer")
    assert pod is not None
    [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "FerryReady"]
    assert cond["status"] == "False" and cond["reason"] == "FerryRuntimeClassMissing"
    assert pod["spec"].get("runtimeClassName") is None  # left alone otherwise


def test_a_periodic_checkpoint_is_asked_of_the_pods_node_once() -> None:
    api = KubeDouble()
    api.put("pods", make_pod())  # started an hour before NOW, never checkpointed
    run_pass(api, now=NOW)
    run_pass(api, now=NOW + 1)  # one pending: not another
    [request] = api.objects["ferrycheckpoints"].values()
    assert request["kind"] == "FerryCheckpoint" and request["metadata"]["namespace"] == "ml"
    assert request["spec"] == {"pod": "trainer", "node": "node-a", "final": False, "reason": "periodic"}
    assert request["status"] == {"phase": "Pending"}


def test_a_lost_nodes_bare_pod_comes_back_unbound_and_resumable(tmp_path: Path) -> None:
    store = CheckpointStore(LocalBackend(tmp_path / "store"))
    images = tmp_path / "images"
    images.mkdir()
    (images / "pages-1.img").write_bytes(b"x" * 100)
    store.write_checkpoint(job="k8s.ml.trainer.main", checkpoint="ck-periodic", parent=None, src_dir=images,
                           meta={"kind": "pod", "final": False})
    assert resumable(store, "k8s.ml.trainer.main") is None  # a periodic one: not until the node is lost
    api = KubeDouble()
    api.put("nodes", make_node(ready="Unknown", since="2020-01-01T00:00:00Z"))
    api.put("pods", make_pod(annotations={"ferry.dev/checkpoint-on-stop": "true"}))
    run_pass(api, store)
    pod = api.get("pods", "ml", "trainer")
    assert pod is not None and "nodeName" not in pod["spec"] and "status" not in pod
    assert pod["metadata"]["annotations"]["ferry.dev/restore-from"] == "auto"
    assert [e["reason"] for e in api.events] == ["FerryRecreated"]
    found = resumable(store, "k8s.ml.trainer.main")
    assert found is not None and found.checkpoint == "ck-periodic"
    run_pass(api, store)  # the new pod is not on the lost node: nothing more
    assert [e["reason"] for e in api.events] == ["FerryRecreated"]


def test_a_kueue_eviction_is_said_on_the_jobs_pods_that_lose_work() -> None:
    api = KubeDouble()
    evicted = workload(evicted=True)
    evicted["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer",
                                                "uid": "j1"}]
    api.put("workloads", evicted)
    api.put("pods", make_pod("keeps", owner=True))
    api.put("pods", make_pod("loses", owner=True, annotations={"ferry.dev/checkpoint-every": "1h"}))
    api.put("pods", make_pod("other", annotations={"ferry.dev/checkpoint-every": "1h"}))  # not the Job's
    run_pass(api, now=0.0)  # before the pods started: no periodic checkpoint is due
    assert [(e["name"], e["reason"]) for e in api.events] == [("loses", "FerryWorkLost")]


def test_a_warm_checkpoint_of_an_inference_service_reaches_its_predictor() -> None:
    api = KubeDouble()
    api.put("inferenceservices", isvc())
    api.put("pods", replica("resnet-b", is_ready=True))
    run_pass(api, now=0.0)
    [request] = api.objects["ferrycheckpoints"].values()
    assert request["spec"]["reason"] == "warm" and request["spec"]["pod"] == "resnet-b"
    name = request["metadata"]["name"]
    asyncio.run(api.patch_status("ferrycheckpoints", "ml", name, {"phase": "Succeeded", "containers": [
        {"container": "main", "job": "k8s.ml.resnet-b.main", "checkpoint": "ck-7"}]}))
    run_pass(api, now=1.0)
    service = api.get("inferenceservices", "ml", "resnet")
    assert service is not None
    assert service["spec"]["predictor"]["annotations"] == {"ferry.dev/restore-from": "k8s.ml.resnet-b.main/ck-7"}
    assert service["spec"]["predictor"]["runtimeClassName"] == "ferry"  # the rest of the spec kept
    run_pass(api, now=2.0)
    assert len(api.objects["ferrycheckpoints"]) == 1  # warm: nothing more to ask


def test_old_checkpoint_records_are_deleted_from_the_api() -> None:
    api = KubeDouble()
    for i in range(7):
        api.put("ferrycheckpoints", {"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryCheckpoint",
                                     "metadata": {"name": f"t-{i}", "namespace": "ml",
                                                  "creationTimestamp": f"2026-12-01T00:0{i}:00Z"},
                                     "spec": {"pod": "t", "node": "n", "reason": "periodic"},
                                     "status": {"phase": "Succeeded"}})
    run_pass(api, now=0.0)
    assert sorted(name for _, name in api.objects["ferrycheckpoints"]) == ["t-2", "t-3", "t-4", "t-5", "t-6"]
