"""The deployment files under deploy/ agree with the code they deploy.

Kubernetes manifests are parsed document by document; the Nomad jobs and the Dockerfile get light
text checks. What is checked is what a typo or a renamed setting would silently break: modules that
must exist, FERRY_* variables that must be settings, probes that must use --check, the config file
that must load, names that must refer to each other, and the node supervisor script, which is run
here against a stand-in `python`.
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from ferry.common.config import Settings, load_settings
from ferry.store.s3 import S3Backend
from ferry.store.url import open_backend

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
NOMAD = DEPLOY / "nomad"
IMAGE = "ghcr.io/ferry-project/ferry:0.1.0"
CONTROL = ("api", "scheduler", "health", "pricing", "autoscaler")
NODE = ("checkpointer", "migrator")
# Kubernetes only: the controller of Kubernetes' own pods, and its node agent
KUBE_CONTROL = ("controller",)
KUBE_NODE = ("controller.podagent",)
SERVICES = CONTROL + NODE + KUBE_CONTROL + KUBE_NODE
NAMESPACE = "ferry"
REAL_VARS = {f"FERRY_{name.upper()}" for name in Settings.model_fields} | {
    "FERRY_CONFIG",
    "FERRY_S3_ACCESS_KEY",
    "FERRY_S3_SECRET_KEY",
}
MODULE_RE = re.compile(r"\bpython3?\s+-m\s+(ferry(?:\.\w+)+)")
NOMAD_MODULE_RE = re.compile(r'"-m",\s*"(ferry(?:\.\w+)+)"')
VAR_RE = re.compile(r"\bFERRY_[A-Z0-9_]+")
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
CLUSTER_SCOPED = ("Namespace", "CustomResourceDefinition", "RuntimeClass", "ClusterRole", "ClusterRoleBinding")

Doc = dict[str, Any]


# -- loading -----------------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.iterdir() if p.suffix in (".yaml", ".yml") and p.stem != "kustomization")


@cache
def documents() -> tuple[tuple[str, Doc], ...]:
    """(file name, document) for every non-empty YAML document of every manifest."""
    docs: list[tuple[str, Doc]] = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{path.name}: a document is not a mapping"
            docs.append((path.name, doc))
    return tuple(docs)


def objects(kind: str) -> list[Doc]:
    return [doc for _, doc in documents() if doc.get("kind") == kind]


def the(kind: str, name: str) -> Doc:
    found = [doc for doc in objects(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    spec = doc["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def workloads() -> list[Doc]:
    return [doc for _, doc in documents() if doc.get("kind") in WORKLOAD_KINDS]


def containers(doc: Doc, *, init: bool = True) -> list[Doc]:
    spec = pod_spec(doc)
    found: list[Doc] = list(spec.get("initContainers", [])) if init else []
    return found + list(spec["containers"])


def command_text(container: Doc) -> str:
    return " ".join(str(part) for part in [*container.get("command", []), *container.get("args", [])])


def code_lines(script: str) -> list[str]:
    """The lines of a shell script that are not blank or comments."""
    return [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def modules_run(container: Doc) -> list[str]:
    """The `python -m ferry.X` modules a container's command runs (its probes and comments not counted)."""
    return MODULE_RE.findall("\n".join(code_lines(command_text(container))))


def probes(container: Doc) -> dict[str, Doc]:
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def ferry_service_containers() -> Iterator[tuple[Doc, Doc, list[str]]]:
    """(workload, container, the Ferry services it runs) for every container that runs one."""
    for doc in workloads():
        for container in containers(doc, init=False):
            services = [m.removeprefix("ferry.") for m in modules_run(container)]
            if services:
                yield doc, container, services


def env_value(container: Doc, name: str) -> Doc:
    for var in container.get("env", []):
        if var["name"] == name:
            assert isinstance(var, dict)
            return var
    raise AssertionError(f"container {container['name']} has no env {name}")


def config_text() -> str:
    text = the("ConfigMap", "ferry-config")["data"]["ferry.yaml"]
    assert isinstance(text, str)
    return text


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FERRY_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings(tmp_path: Path, clean_env: None) -> Settings:
    path = tmp_path / "ferry.yaml"
    path.write_text(config_text())
    return load_settings(path)


# -- Kubernetes: structure ------------------------------------------------------------------------


def test_manifests_exist() -> None:
    assert manifest_files(), "no manifests under deploy/kubernetes"
    assert (K8S / "kustomization.yaml").is_file()


def test_every_document_has_kind_api_version_and_name() -> None:
    for name, doc in documents():
        where = f"{name}: {doc.get('kind')}"
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], f"{where} has no apiVersion"
        assert isinstance(doc.get("kind"), str) and doc["kind"], f"{name}: a document has no kind"
        metadata = doc.get("metadata")
        assert isinstance(metadata, dict) and metadata.get("name"), f"{where} has no metadata.name"
        if doc["kind"] not in CLUSTER_SCOPED:
            assert metadata.get("namespace") == NAMESPACE, f"{where} {metadata['name']} is not in {NAMESPACE}"


def test_objects_are_unique() -> None:
    keys = [(doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]) for _, doc in documents()]
    assert len(keys) == len(set(keys)), f"duplicate objects: {sorted(k for k in keys if keys.count(k) > 1)}"


def test_kustomization_lists_every_file() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources)), "a file is listed twice"
    assert set(resources) == {p.name for p in manifest_files()}
    assert kustomization.get("namespace") == NAMESPACE


def test_the_expected_objects_are_there() -> None:
    assert the("Namespace", NAMESPACE)
    assert the("StatefulSet", "nats") and the("Service", "nats")
    assert the("StatefulSet", "minio") and the("Service", "minio") and the("Job", "minio-create-bucket")
    assert the("ConfigMap", "ferry-config") and the("Secret", "ferry-secrets")
    assert the("Service", "ferry-api")
    for service in CONTROL + KUBE_CONTROL:
        deployment = the("Deployment", f"ferry-{service}")
        assert deployment["spec"]["replicas"] == 1
    assert the("DaemonSet", "ferry-node") and the("DaemonSet", "ferry-podagent")
    assert the("CustomResourceDefinition", "ferrycheckpoints.ferry.dev") and the("RuntimeClass", "ferry")


def test_selectors_match_pod_labels() -> None:
    pod_labels = []
    for doc in workloads():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        pod_labels.append(labels)
        if doc["kind"] == "Job":
            continue
        wanted = doc["spec"]["selector"]["matchLabels"]
        assert wanted.items() <= labels.items(), f"{doc['kind']} {doc['metadata']['name']}: selector misses its pods"
    for service in objects("Service"):
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in pod_labels), (
            f"Service {service['metadata']['name']} selects no pod"
        )


def test_statefulsets_name_an_existing_headless_service() -> None:
    for sts in objects("StatefulSet"):
        service = the("Service", sts["spec"]["serviceName"])
        assert service["spec"].get("clusterIP") == "None"
        assert sts["spec"]["volumeClaimTemplates"], f"StatefulSet {sts['metadata']['name']} has no volume"


NATS_SERVER = Path(sys.executable).parent / "nats-server"


def made_keys(folder: Path) -> dict[str, bytes]:
    """What `ferry keys init --tls-hosts ...` makes, under the names of the Secret ferry-keys."""
    import base64

    from ferry.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["keys", "init", str(folder), "--tls-hosts", "nats.ferry.svc,ferry-api.ferry.svc", "-o", "json"])
    assert done.value.code == 0
    from ferry.cli.secrets import kubernetes_secret

    secret = yaml.safe_load(kubernetes_secret(folder, "ferry-keys", NAMESPACE))
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def nats_config_is_valid(text: str, env: dict[str, str], layout: tuple[str, str, str] = ("nats", "nats-keys",
                                                                                           "/etc/nats-keys/")) -> None:
    """nats-server itself parses the configuration (`-t`: test the file and exit), with the users,
    permissions and TLS files `ferry keys init` makes."""
    with tempfile.TemporaryDirectory() as tmp:
        conf_dir, keys_dir, keys_path = layout  # the config's folder, the keys' folder beside it, their path
        keys = Path(tmp) / keys_dir
        keys.mkdir()
        for name, data in made_keys(Path(tmp) / "made").items():
            (keys / name).write_bytes(data)
        conf = Path(tmp) / conf_dir / "nats.conf"  # beside the keys, as in the pod or the task
        conf.parent.mkdir()
        conf.write_text(text.replace("store_dir: /data", f"store_dir: {tmp}/data")
                        .replace(f'"{keys_path}', f'"{keys}/'))
        done = subprocess.run([str(NATS_SERVER), "-c", str(conf), "-t"], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=30)
        assert done.returncode == 0, done.stdout + done.stderr


def test_nats_is_a_three_server_jetstream_cluster_that_fsyncs() -> None:
    nats = the("StatefulSet", "nats")
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    (container,) = containers(nats)
    assert container["image"].split(":")[0] == "nats"
    args = container["args"]
    conf_path = Path(args[args.index("-c") + 1])
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(nats)["volumes"]}
    config_map = volumes[mounts[str(conf_path.parent)]]["configMap"]["name"]
    text = the("ConfigMap", config_map)["data"][conf_path.name]
    assert re.search(r"^\s*sync_interval:\s*always\s*$", text, re.MULTILINE), "JetStream must fsync before acking"
    assert re.search(r"^\s*max_file_store:", text, re.MULTILINE), "JetStream needs a storage limit"
    # the store sits on the claimed volume
    store = re.search(r"^\s*store_dir:\s*(\S+)", text, re.MULTILINE)
    assert store and mounts[store.group(1)] in {c["metadata"]["name"] for c in nats["spec"]["volumeClaimTemplates"]}
    # every server has a route to every pod of the StatefulSet, by the headless service's names
    headless = nats["spec"]["serviceName"]
    routes = set(re.findall(r"nats-route://([\w.-]+):(\d+)", text))
    expected = {(f"nats-{i}.{headless}.{NAMESPACE}.svc", "6222") for i in range(replicas)}
    assert routes == expected
    assert "cluster" in {p["name"] for p in the("Service", headless)["spec"]["ports"]}
    assert any(v["name"] == "POD_NAME" for v in container["env"]) and "$POD_NAME" in text
    nats_config_is_valid(text, {"POD_NAME": "nats-0"})
    budget = the("PodDisruptionBudget", "nats")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"] == nats["spec"]["selector"]["matchLabels"]


def test_ferry_keeps_three_replicas_of_its_state(settings: Settings) -> None:
    assert settings.nats_replicas == the("StatefulSet", "nats")["spec"]["replicas"]


# -- Kubernetes: Ferry containers -----------------------------------------------------------------


def test_ferry_modules_exist() -> None:
    texts = [command_text(c) for doc in workloads() for c in containers(doc)]
    texts += [" ".join(p["exec"]["command"]) for doc in workloads() for c in containers(doc)
              for p in probes(c).values() if "exec" in p]
    modules = {m for text in texts for m in MODULE_RE.findall(text)}
    assert modules, "no container runs python -m ferry.X"
    for module in sorted(modules):
        assert importlib.util.find_spec(module) is not None, f"module {module} does not exist"


def test_every_service_is_deployed_once_by_the_ferry_image() -> None:
    deployed: list[str] = []
    for doc, container, services in ferry_service_containers():
        assert container["image"] == IMAGE, f"{doc['metadata']['name']}/{container['name']} runs {container['image']}"
        assert set(services) <= set(SERVICES), f"{container['name']} runs {services}"
        deployed += services
    assert sorted(deployed) == sorted(SERVICES)
    for service in CONTROL + KUBE_CONTROL:
        (container,) = containers(the("Deployment", f"ferry-{service}"))
        assert container["command"] == ["python", "-m", f"ferry.{service}"]


def test_ferry_variables_are_real_settings() -> None:
    files = [*K8S.glob("*.yaml"), *NOMAD.glob("*.hcl"), DEPLOY / "Dockerfile", DEPLOY / "README.md"]
    for path in files:
        unknown = set(VAR_RE.findall(path.read_text())) - REAL_VARS
        assert not unknown, f"{path.relative_to(ROOT)} uses {sorted(unknown)}, which no setting reads"
    for doc in workloads():
        for container in containers(doc):
            for var in container.get("env", []):
                if var["name"].startswith("FERRY_"):
                    assert var["name"] in REAL_VARS, f"{container['name']}: {var['name']} is no setting"
    assert set(VAR_RE.findall(config_text())) <= REAL_VARS


def test_secret_keys_are_real_and_every_reference_resolves() -> None:
    secret = the("Secret", "ferry-secrets")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    assert keys == {"FERRY_S3_ACCESS_KEY", "FERRY_S3_SECRET_KEY"}
    with tempfile.TemporaryDirectory() as tmp:
        made = made_keys(Path(tmp) / "keys")
    for doc in workloads():  # every item a pod mounts from ferry-keys is one `ferry keys secret` makes
        for volume in pod_spec(doc).get("volumes", []):
            if "secret" in volume and volume["secret"]["secretName"] == "ferry-cloud":
                # the cloud's credentials the user creates (the autoscaler's): optional, group-readable only
                assert volume["secret"]["optional"] is True and not volume["secret"]["defaultMode"] & 0o007
                assert doc["metadata"]["name"] == "ferry-autoscaler"
            elif "secret" in volume:
                assert volume["secret"]["secretName"] == "ferry-keys", doc["metadata"]["name"]
                wanted = {item["key"] for item in volume["secret"]["items"]}
                assert wanted <= set(made) | {"tokens.yaml"}, (doc["metadata"]["name"], wanted - set(made))
                assert not volume["secret"]["defaultMode"] & 0o007, "keys readable by others"
    configmaps = {cm["metadata"]["name"]: set(cm["data"]) for cm in objects("ConfigMap")}
    for doc in workloads():
        for container in containers(doc):
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "ferry-secrets" and ref["key"] in keys, f"{container['name']}: {ref}"
        for volume in pod_spec(doc).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, f"{doc['metadata']['name']}: {volume}"


def test_ferry_containers_read_the_config_file() -> None:
    for doc, container, _ in ferry_service_containers():
        path = Path(env_value(container, "FERRY_CONFIG")["value"])
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(doc)["volumes"]}
        volume = volumes[mounts[str(path.parent)]]
        assert volume["configMap"]["name"] == "ferry-config", doc["metadata"]["name"]
        assert path.name in the("ConfigMap", "ferry-config")["data"]


def test_probes_use_check() -> None:
    for doc, container, services in ferry_service_containers():
        where = f"{doc['metadata']['name']}/{container['name']}"
        found = probes(container)
        assert "readinessProbe" in found, f"{where} has no readinessProbe"
        if doc["kind"] == "Deployment":
            assert "livenessProbe" in found, f"{where} has no livenessProbe"
        for kind, probe in found.items():
            assert "exec" in probe, f"{where}: {kind} is not an exec probe"
            text = " ".join(probe["exec"]["command"])
            for service in services:
                assert re.search(rf"\bpython -m ferry\.{service} --check\b", text), f"{where}: {kind} skips {service}"
            assert probe.get("timeoutSeconds", 1) >= 5, f"{where}: {kind} gives --check too little time"


def test_pods_outlast_the_drain(settings: Settings) -> None:
    for doc, _, _ in ferry_service_containers():
        grace = pod_spec(doc).get("terminationGracePeriodSeconds", 30)
        assert grace > settings.drain_timeout_s, f"{doc['metadata']['name']}: SIGTERM grace {grace}s is too short"


def test_resources_are_set() -> None:
    for doc in workloads():
        for container in containers(doc):
            where = f"{doc['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{where} requests no cpu and memory"
            if doc["metadata"]["name"] == "ferry-node" and container["name"] == "node":
                # the workloads run in this container's cgroup: a limit would cap them
                assert "limits" not in resources, f"{where} must not limit the workloads it runs"
            else:
                assert {"cpu", "memory"} <= set(resources.get("limits", {})), f"{where} has no limits"


def test_control_plane_runs_unprivileged() -> None:
    for service in CONTROL + KUBE_CONTROL:
        deployment = the("Deployment", f"ferry-{service}")
        assert pod_spec(deployment)["securityContext"]["runAsNonRoot"] is True
        assert not pod_spec(deployment).get("hostPID")
        (container,) = containers(deployment)
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert not container["securityContext"].get("privileged")


def test_api_service_reaches_the_api(settings: Settings) -> None:
    (container,) = containers(the("Deployment", "ferry-api"))
    host, port = env_value(container, "FERRY_ADDR")["value"].rsplit(":", 1)
    assert host == "0.0.0.0", "the API must listen on the pod's address, not on loopback"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    (service_port,) = the("Service", "ferry-api")["spec"]["ports"]
    assert named[service_port["targetPort"]] == int(port) == service_port["port"] == 7070
    # beyond loopback: TLS and tokens, or the API does not start
    assert env_value(container, "FERRY_TLS_CERT")["value"].startswith("/etc/ferry-keys/")
    assert env_value(container, "FERRY_TOKENS_FILE")["value"] == "/etc/ferry-keys/tokens.yaml"
    from ferry.api.listen import Listener

    with tempfile.TemporaryDirectory() as tmp:
        made = made_keys(Path(tmp) / "keys")
        for name in ("tls-server.pem", "tls-server.key"):
            (Path(tmp) / name).write_bytes(made[name])
        listener = Listener.from_settings(Settings(addr="0.0.0.0:7070", tls_cert=Path(tmp) / "tls-server.pem",
                                                   tls_key=Path(tmp) / "tls-server.key"))
        listener.refuse_if_open(False)


# -- Kubernetes: the node DaemonSet ---------------------------------------------------------------


def node_daemonset() -> Doc:
    return the("DaemonSet", "ferry-node")


def node_container() -> Doc:
    (container,) = containers(node_daemonset(), init=False)
    return container


def test_node_daemonset_is_privileged_with_host_pid() -> None:
    spec = pod_spec(node_daemonset())
    assert spec["hostPID"] is True
    for container in containers(node_daemonset()):
        assert container["securityContext"]["privileged"] is True, container["name"]
    # one container: a restored workload lives in the migrator's mount namespace, and the
    # checkpointer's CRIU can dump it only from that same namespace
    assert sorted(modules_run(node_container())) == ["ferry.checkpointer", "ferry.migrator"]
    assert node_daemonset()["spec"]["updateStrategy"]["type"] == "OnDelete"


def test_node_id_comes_from_the_node_name() -> None:
    field = env_value(node_container(), "FERRY_NODE_ID")["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "spec.nodeName"


def test_node_work_dir_is_on_the_host_at_the_same_path(settings: Settings) -> None:
    spec = pod_spec(node_daemonset())
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in node_container()["volumeMounts"]}
    data_dir = str(settings.data_dir)
    assert env_value(node_container(), "FERRY_DATA_DIR")["value"] == data_dir
    assert volumes[mounts[data_dir]]["hostPath"]["path"] == data_dir


def test_node_init_container_raises_pipe_max_size() -> None:
    (init,) = pod_spec(node_daemonset())["initContainers"]
    assert init["securityContext"]["privileged"] is True
    script = command_text(init)
    assert "/proc/sys/fs/pipe-max-size" in script and str(16 * 1024 * 1024) in script


# -- the config file ------------------------------------------------------------------------------


def service_endpoint(host: str) -> tuple[str, Doc]:
    """The Service that `host` (name.namespace.svc[.cluster.local]) names, and its namespace."""
    name, namespace, *rest = host.split(".")
    assert rest[:1] == ["svc"], f"{host} is not a Service address"
    return namespace, the("Service", name)


def test_config_loads_and_points_at_the_services(settings: Settings) -> None:
    nats = urlsplit(settings.nats_url)
    assert nats.scheme == "tls" and nats.hostname and nats.port and settings.nats_ca is not None
    namespace, service = service_endpoint(nats.hostname)
    assert namespace == NAMESPACE
    assert nats.port in {p["port"] for p in service["spec"]["ports"]}
    assert settings.otel_exporter == "none"


def test_store_url_opens_and_names_the_bucket_the_job_creates(settings: Settings) -> None:
    backend = open_backend(
        settings.resolved_store_url(), env={"FERRY_S3_ACCESS_KEY": "k", "FERRY_S3_SECRET_KEY": "secret-key"}
    )
    assert isinstance(backend, S3Backend)
    host, port = backend.endpoint.rsplit(":", 1)
    namespace, service = service_endpoint(host)
    assert namespace == NAMESPACE
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    (job,) = containers(the("Job", "minio-create-bucket"))
    assert f"/{backend.bucket}" in command_text(job)
    assert f"http://{backend.endpoint}" in command_text(job)


def test_config_file_rejects_what_it_should(tmp_path: Path, clean_env: None) -> None:
    # the check above means something only if load_settings refuses an unknown key
    from ferry.common.errors import ConfigError

    path = tmp_path / "bad.yaml"
    path.write_text(config_text() + "no_such_setting: 1\n")
    with pytest.raises(ConfigError):
        load_settings(path)


# -- the node supervisor script -------------------------------------------------------------------


def k8s_node_script() -> str:
    command = node_container()["command"]
    assert command[:2] == ["/bin/sh", "-c"] and len(command) == 3
    script = command[2]
    assert isinstance(script, str)
    return script


def nomad_node_script() -> str:
    text = (NOMAD / "ferry-node.nomad.hcl").read_text()
    match = re.search(r"node_script = <<-EOS\n(.*?)\n\s*EOS\n", text, re.DOTALL)
    assert match, "ferry-node.nomad.hcl has no node_script heredoc"
    assert "${" not in match.group(1) and "%{" not in match.group(1), "HCL would interpolate the script"
    return textwrap.dedent(match.group(1)) + "\n"


def test_nomad_and_kubernetes_run_the_same_node_script() -> None:
    assert code_lines(nomad_node_script()) == code_lines(k8s_node_script())


FAKE_PYTHON = """#!/bin/sh
# stands in for python: logs how it was called, drains for a moment on SIGTERM
echo "start $FERRY_NODE_ID $*" >> "$LOG"
case "$*" in *--check*) exit 0;; esac
trap 'sleep 0.3; echo "stopped $*" >> "$LOG"; exit 0' TERM
while :; do sleep 0.05; done
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(FAKE_PYTHON)
    (bindir / "python").chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(PATH=f"{bindir}:{env.get('PATH', os.defpath)}", LOG=str(log), FERRY_NODE_ID="ip-10-0-0-1.ec2.internal")
    return env, log


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_node_script_runs_both_services_and_drains_them(fake_python: tuple[dict[str, str], Path]) -> None:
    env, log = fake_python
    proc = subprocess.Popen(["/bin/sh", "-c", k8s_node_script()], env=env, start_new_session=True)
    try:
        wait_for(lambda: log.read_text().count("start ") == 2, "both services to start")
        assert sorted(log.read_text().splitlines()) == [
            "start ip-10-0-0-1-ec2-internal -m ferry.checkpointer",
            "start ip-10-0-0-1-ec2-internal -m ferry.migrator",
        ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        # it returned only after both services had finished their drain
        stopped = sorted(line for line in log.read_text().splitlines() if line.startswith("stopped"))
        assert stopped == ["stopped -m ferry.checkpointer", "stopped -m ferry.migrator"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_node_readiness_probe_checks_both_with_the_clean_node_id(fake_python: tuple[dict[str, str], Path]) -> None:
    env, log = fake_python
    command = node_container()["readinessProbe"]["exec"]["command"]
    result = subprocess.run(command, env=env, timeout=10, check=False)
    assert result.returncode == 0
    assert log.read_text().splitlines() == [
        "start ip-10-0-0-1-ec2-internal -m ferry.checkpointer --check",
        "start ip-10-0-0-1-ec2-internal -m ferry.migrator --check",
    ]


# -- Nomad ----------------------------------------------------------------------------------------


def hcl(name: str) -> str:
    return (NOMAD / name).read_text()


def test_nomad_files_are_there_and_balanced() -> None:
    names = {"ferry.nomad.hcl", "ferry-node.nomad.hcl", "nats.nomad.hcl"}
    assert {p.name for p in NOMAD.glob("*.hcl")} == names
    for name in names:
        text = hcl(name)
        for left, right in ("{}", "[]", "()"):
            assert text.count(left) == text.count(right), f"{name}: unbalanced {left}{right}"


def test_nomad_control_job_runs_the_control_plane() -> None:
    text = hcl("ferry.nomad.hcl")
    assert re.search(r'^job "ferry" \{', text, re.MULTILINE)
    assert 'group "control"' in text
    for service in CONTROL:
        assert f'task "{service}"' in text, f"no task {service}"
    assert sorted(NOMAD_MODULE_RE.findall(text)) == sorted(f"ferry.{s}" for s in CONTROL)
    assert f'image = "{IMAGE}"' in text and 'driver       = "docker"' in text
    assert re.search(r'FERRY_ADDR +=', text) and '"0.0.0.0:7070"' in text
    assert 'FERRY_TLS_CERT            = "/secrets/tls-server.pem"' in text  # beyond loopback: TLS


def test_nomad_node_job_runs_on_every_client() -> None:
    text = hcl("ferry-node.nomad.hcl")
    assert re.search(r'^job "ferry-node" \{', text, re.MULTILINE)
    assert 'type = "system"' in text
    assert "privileged = true" in text and 'pid_mode   = "host"' in text
    assert sorted(MODULE_RE.findall("\n".join(code_lines(nomad_node_script())))) == [
        "ferry.checkpointer",
        "ferry.migrator",
    ]
    assert '"/var/lib/ferry:/var/lib/ferry"' in text and "FERRY_NODE_ID" in text
    assert "/proc/sys/fs/pipe-max-size" in text


def test_nomad_nats_job_runs_jetstream() -> None:
    text = hcl("nats.nomad.hcl")
    assert 'task "nats"' in text and 'name     = "nats"' in text
    assert '"-c", "/local/nats.conf"' in text and 'destination = "/data"' in text


def test_nomad_config_templates_name_real_settings() -> None:
    for name in ("ferry.nomad.hcl", "ferry-node.nomad.hcl"):
        templates = re.findall(r"<<-EOT\n(.*?)\n\s*EOT\n", hcl(name), re.DOTALL)
        configs = [t for t in templates if "nats_url:" in t]
        assert configs, f"{name} writes no ferry.yaml"
        for config in configs:
            keys = re.findall(r"^\s*([a-z_]+):", config, re.MULTILINE)
            assert "nats_url" in keys
            unknown = set(keys) - set(Settings.model_fields)
            assert not unknown, f"{name}: {sorted(unknown)} are no settings"


def test_nomad_modules_exist() -> None:
    for path in NOMAD.glob("*.hcl"):
        text = path.read_text()
        for module in {*MODULE_RE.findall(text), *NOMAD_MODULE_RE.findall(text)}:
            assert importlib.util.find_spec(module) is not None, f"{path.name}: {module} does not exist"


# -- the image -------------------------------------------------------------------------------------


def test_dockerfile_builds_the_image_on_debian_13_with_criu() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "debian:trixie" in text
    assert re.search(r"apt-get install[^\n]*\bcriu\b", text)
    assert "pip install --no-cache-dir /src" in text
    for service in SERVICES:
        assert f"ferry.{service}" in text, f"the image's smoke test skips ferry.{service}"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


# -- Nomad: NATS ---------------------------------------------------------------------------------


def test_nomad_nats_is_a_three_server_cluster_that_fsyncs() -> None:
    text = (NOMAD / "nats.nomad.hcl").read_text()
    assert re.search(r"^\s*count\s*=\s*3\s*$", text, re.MULTILINE)
    assert re.search(r'operator\s*=\s*"distinct_hosts"', text)
    match = re.search(r'destination\s*=\s*"local/nats.conf".*?data\s*=\s*<<-EOT\n(.*?)\n\s*EOT\n', text, re.DOTALL)
    assert match, "nats.nomad.hcl renders no nats.conf"
    template = textwrap.dedent(match.group(1))
    assert "${" not in template and "%{" not in template, "HCL would interpolate the template"
    assert re.search(r"^\s*sync_interval:\s*always\s*$", template, re.MULTILINE)
    # what Nomad renders for three servers, which nats-server must accept
    rendered = template.replace('{{ env "NOMAD_ALLOC_INDEX" }}', "1")

    def routes(m: re.Match[str]) -> str:
        line = m.group(1).replace("{{ .Port }}", "6222")
        return "\n".join(line.replace("{{ .Address }}", f"10.0.0.{i}") for i in range(1, 4))

    rendered = re.sub(r'\{\{- range nomadService "nats-cluster" \}\}\n(.*?)\n\s*\{\{- end \}\}', routes, rendered,
                      flags=re.DOTALL)
    assert "{{" not in rendered, rendered
    nats_config_is_valid(rendered, {}, ("local", "secrets", "/secrets/"))


@pytest.mark.parametrize("job", ["ferry.nomad.hcl", "ferry-node.nomad.hcl"])
def test_nomad_ferry_jobs_use_every_nats_server_and_three_replicas(job: str, tmp_path: Path, clean_env: None) -> None:
    text = (NOMAD / job).read_text()
    line = re.search(r"^\s*nats_url: (.*)$", text, re.MULTILINE)
    assert line and 'nomadService "nats"' in line.group(1)
    rendered = re.sub(r"\{\{ range .*\{\{ end \}\}", "nats://10.0.0.1:4222,nats://10.0.0.2:4222", line.group(1))
    path = tmp_path / "ferry.yaml"
    path.write_text(f"nats_url: {rendered}\nnats_replicas: 3\n")
    loaded = load_settings(path)
    assert loaded.nats_url == "nats://10.0.0.1:4222,nats://10.0.0.2:4222"
    assert re.search(r"^\s*nats_replicas: 3$", text, re.MULTILINE)
