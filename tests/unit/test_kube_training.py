"""Kubeflow PyTorchJobs under Ferry (issue 14): the controller says, once per generation, what a
job's replica templates lack for its replicas to be checkpointed together as they stop and to
resume from that checkpoint (``training_actions``). Every job here is first read by the Kubeflow
training SDK's own models (kubeflow-training), which refuse what the CRD requires and is
missing, and must give back exactly the object they read (an unknown field would be dropped)."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest

from ferry.controller.controller import carry_out
from ferry.kube.annotations import AUTO, CHECKPOINT_ON_STOP, GROUP, GROUP_SIZE, RESTORE_FROM
from ferry.kube.reconcile import Note, training_actions
from tests.kubedouble import KubeDouble


@dataclass
class _Response:  # what the SDK's ApiClient.deserialize reads: the API's JSON body
    data: str


def valid(job: dict[str, Any]) -> dict[str, Any]:
    from kubeflow.training import ApiClient

    client = ApiClient()
    model = client.deserialize(_Response(json.dumps(job)), "KubeflowOrgV1PyTorchJob")
    assert client.sanitize_for_serialization(model) == job, "a field the PyTorchJob CRD does not have"
    return job


def template(annotations: dict[str, str] | None, *, runtime: str | None = "ferry", host: bool = True
             ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "pytorch", "image": "registry.local/train:1",
                                            "command": ["torchrun", "train.py"]}]}
    if runtime:
        spec["runtimeClassName"] = runtime
    if host:
        spec["hostNetwork"] = True
    return {"metadata": {"annotations": annotations}, "spec": spec} if annotations is not None else {"spec": spec}


GOOD = {CHECKPOINT_ON_STOP: "true", RESTORE_FROM: AUTO, GROUP: "bert", GROUP_SIZE: "3"}


def job(master: dict[str, Any], worker: dict[str, Any], workers: int = 2, generation: int = 1) -> dict[str, Any]:
    return valid({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                  "metadata": {"name": "bert", "namespace": "ml", "generation": generation},
                  "spec": {"runPolicy": {"suspend": False},
                           "pytorchReplicaSpecs": {
                               "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": master},
                               "Worker": {"replicas": workers, "restartPolicy": "OnFailure", "template": worker}}}})


def reasons(actions: list[Any]) -> list[str]:
    assert all(isinstance(a, Note) and (a.namespace, a.name, a.object_kind) == ("ml", "bert", "PyTorchJob")
               for a in actions)
    return [a.reason for a in actions]


def test_the_sdk_refuses_a_job_without_what_the_crd_requires() -> None:
    broken = job(template(GOOD), template(GOOD))
    del broken["spec"]["runPolicy"]
    with pytest.raises(ValueError, match="run_policy"):
        valid(broken)
    typo = job(template(GOOD), template(GOOD))
    typo["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(AssertionError, match="CRD does not have"):
        valid(typo)


def test_a_job_whose_replicas_are_a_group_of_all_of_them_needs_nothing() -> None:
    assert training_actions(job(template(GOOD), template(GOOD))) == []


def test_a_job_that_does_not_opt_in_is_left_alone() -> None:
    assert training_actions(job(template(None, runtime=None), template(None, runtime=None))) == []


@pytest.mark.parametrize(("change", "want"), [
    ({GROUP: None, GROUP_SIZE: None}, "FerryNoGroup"),
    ({GROUP_SIZE: "2"}, "FerryGroupSize"),
    ({GROUP_SIZE: "two"}, "FerryBadAnnotation"),
    ({CHECKPOINT_ON_STOP: None}, "FerryNoCheckpointOnStop"),
    ({RESTORE_FROM: None}, "FerryNoResume"),
])
def test_what_a_replica_template_lacks_is_said(change: dict[str, str | None], want: str) -> None:
    lacking = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    [found] = training_actions(job(template(GOOD), template(lacking)))
    assert isinstance(found, Note) and found.reason == want and found.message.startswith("Worker: ")


def test_pod_ips_and_a_missing_runtime_class_and_a_replica_type_left_out_are_said() -> None:
    assert reasons(training_actions(job(template(GOOD), template(GOOD, host=False)))) == ["FerryPodNetwork"]
    assert reasons(training_actions(job(template(GOOD), template(GOOD, runtime=None)))) == \
        ["FerryRuntimeClassMissing"]
    assert reasons(training_actions(job(template(GOOD), template(None, runtime=None)))) == ["FerryPartlyOptedIn"]
    single = {k: v for k, v in GOOD.items() if k not in (GROUP, GROUP_SIZE)}  # one replica: no group needed
    one = job(template(single, host=False), template(single), workers=0)
    assert training_actions(one) == []


def test_a_note_is_made_once_per_generation_of_the_job() -> None:
    api = KubeDouble()
    lacking = job(template(GOOD), template({**GOOD, GROUP_SIZE: "2"}))
    noted: set[tuple[str, str, str, int, str]] = set()

    async def passes() -> list[int]:
        made = []
        for obj in (lacking, copy.deepcopy(lacking), job(template(GOOD), template({**GOOD, GROUP_SIZE: "2"}),
                                                         generation=2)):
            made.append(len(await carry_out(api, None, training_actions(obj), 0.0, noted)))
        return made

    assert asyncio.run(passes()) == [1, 0, 1]
    assert [(e["kind"], e["name"], e["reason"]) for e in api.events] == [("PyTorchJob", "bert", "FerryGroupSize")] * 2
    assert "job has 3 replicas" in api.events[0]["message"]
