"""The manifests of Ferry under Kubernetes' own pods (deploy/kubernetes: the CRD FerryCheckpoint,
the RuntimeClass ferry, the controller and the node agent), validated offline: every built-in object
against the Kubernetes API's schemas (kubernetes-validate), what the controller and the agent write
against the CRD's schema, RBAC that grants only what the code calls, the host wrapper of the runtime,
and the install command the agent's init container runs."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from ferry.cli.main import parse_args
from ferry.controller.controller import checkpoint_request
from ferry.kube.reconcile import Checkpoint
from tests.unit.test_deploy import containers, documents, pod_spec, the

K8S = "1.31"
BUILT_IN = ("v1", "apps/v1", "batch/v1", "policy/v1", "rbac.authorization.k8s.io/v1", "node.k8s.io/v1",
            "apiextensions.k8s.io/v1")


def test_every_built_in_object_is_valid_for_the_kubernetes_api() -> None:
    checked = 0
    for name, doc in documents():
        if doc["apiVersion"] in BUILT_IN:
            try:
                kubernetes_validate.validate(doc, K8S, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name}: {doc['kind']} {doc['metadata']['name']}: {exc.message}") from None
            checked += 1
    assert checked >= 20


def crd_schema() -> dict[str, Any]:
    crd = the("CustomResourceDefinition", "ferrycheckpoints.ferry.dev")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_what_the_controller_and_the_agent_write_fits_the_crd() -> None:
    schema = crd_schema()
    request = checkpoint_request(Checkpoint(namespace="ml", pod="trainer", node="node-a", reason="periodic"), 1e9)
    assert request["apiVersion"] == "ferry.dev/v1alpha1" and request["kind"] == "FerryCheckpoint"
    jsonschema.validate(request, schema)
    done = {**request, "status": {"phase": "Succeeded", "durationMs": 412, "containers": [
        {"container": "main", "job": "k8s.ml.trainer.main", "checkpoint": "ck-1", "bytes": 10, "wallMs": 400}]}}
    jsonschema.validate(done, schema)
    for bad in ({**request, "spec": {"node": "n"}}, {**request, "status": {"phase": "Maybe"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def rules(role: str, kind: str = "ClusterRole") -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in the(kind, role)["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_grants_only_what_the_code_calls() -> None:
    controller = rules("ferry-controller")
    assert controller == {
        *(("", "pods", v) for v in ("get", "list", "watch", "create", "delete")), ("", "pods/status", "patch"),
        *(("", "nodes", v) for v in ("get", "list", "watch")), ("", "events", "create"),
        *(("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch")),
        *(("ferry.dev", "ferrycheckpoints", v) for v in ("get", "list", "watch", "create", "delete")),
        *(("serving.kserve.io", "inferenceservices", v) for v in ("get", "list", "watch", "patch")),
        *(("kubeflow.org", "pytorchjobs", v) for v in ("get", "list", "watch"))}
    agent = rules("ferry-podagent")
    assert agent == {*(("ferry.dev", "ferrycheckpoints", v) for v in ("get", "list", "watch")),
                     ("ferry.dev", "ferrycheckpoints/status", "patch")}
    for _, doc in documents():
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], doc["metadata"]["name"]
                assert "secrets" not in rule["resources"], f"{doc['metadata']['name']} reads Secrets"
    # the autoscaler scales node groups in its own namespace (provider: kubernetes), nothing else
    assert rules("ferry-autoscaler", "Role") == {("cluster.x-k8s.io", "machinedeployments", "get"),
                                         ("cluster.x-k8s.io", "machinedeployments", "patch"),
                                         ("cluster.x-k8s.io", "machines", "list"),
                                         ("cluster.x-k8s.io", "machines", "patch")}
    assert the("RoleBinding", "ferry-autoscaler")["subjects"][0]["name"] == (
        "ferry-autoscaler")
    for role in ("ferry-controller", "ferry-podagent"):
        binding = the("ClusterRoleBinding", role)
        assert binding["roleRef"]["name"] == role and binding["subjects"][0]["name"] == role
        assert pod_spec(the("Deployment" if role == "ferry-controller" else "DaemonSet", role))[
            "serviceAccountName"] == role
    # the other pods get no token at all
    for _, doc in documents():
        if doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet") and doc["metadata"]["name"] not in (
                "ferry-controller", "ferry-podagent", "ferry-autoscaler"):
            assert pod_spec(doc).get("automountServiceAccountToken") is False, doc["metadata"]["name"]


def test_the_runtime_class_and_the_agent_land_on_the_same_nodes() -> None:
    runtime = the("RuntimeClass", "ferry")
    assert runtime["handler"] == "ferry"
    agent = pod_spec(the("DaemonSet", "ferry-podagent"))
    assert agent["nodeSelector"] == runtime["scheduling"]["nodeSelector"]
    assert agent["hostPID"] is True


def host_wrapper(tmp_path: Path) -> Path:
    text = the("ConfigMap", "ferry-runtime-host")["data"]["ferry-runc"]
    path = tmp_path / "ferry-runc"
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_host_wrapper_falls_back_to_runc_while_the_agent_is_down(tmp_path: Path) -> None:
    wrapper = host_wrapper(tmp_path)
    assert subprocess.run(["sh", "-n", str(wrapper)], check=False).returncode == 0
    text = wrapper.read_text()
    assert "/run/ferry/podagent.pid" in text and "/opt/ferry/bin/ferry-runc" in text
    stand_in = tmp_path / "bin" / "runc"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\necho runc \"$@\"\n")
    stand_in.chmod(stat.S_IRWXU)
    assert not Path("/run/ferry/podagent.pid").exists()
    done = subprocess.run([str(wrapper), "--root", "/r", "create", "abc"], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}"}, check=False)
    assert done.stdout.strip() == "runc --root /r create abc"


def test_the_agents_init_container_runs_a_real_install_command() -> None:
    agent = the("DaemonSet", "ferry-podagent")
    (init,) = pod_spec(agent)["initContainers"]
    script = init["command"][-1]
    line = next(x for x in script.splitlines() if "ferry pod install-runtime" in x)
    argv = re.search(r"ferry (pod install-runtime[^)]*)", line).group(1).split()  # type: ignore[union-attr]
    args = parse_args(argv)
    assert args.containerd_config == "/host/etc/containerd/config.toml" and args.output == "json"
    copied = re.search(r"cp \S+ (\S+)", script).group(1)  # type: ignore[union-attr]
    assert copied == "/host" + args.binary  # containerd runs the wrapper it was told of
    (main,) = containers(agent, init=False)
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    for path in ("/run/containerd", "/var/lib/containerd"):  # the host's paths, its mounts seen here
        assert mounts[path]["mountPropagation"] == "HostToContainer"
