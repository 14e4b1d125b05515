"""Ferry under Kubernetes, the node side (issue 14), against real containerd (Debian's, two of them
standing for two nodes) driven through its CRI API as a kubelet drives it: a pod of the
RuntimeClass ``ferry`` runs train.py in a container built offline, is checkpointed by `ferry pod
checkpoint` (leave-running), then stopped as the kubelet stops a container whose pod goes, which
the runtime turns into a final checkpoint (``ferry.dev/checkpoint-on-stop``); a pod created on the other
containerd with ``ferry.dev/restore-from: auto`` (as a workload's controller recreates it)
continues it: both logs together are the lines of an uninterrupted run. A later pod of the same
job starts anew: a final checkpoint is continued from once. A restore annotation naming no
usable checkpoint starts the container fresh and says why."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.kube.annotations import AUTO, CHECKPOINT_EVERY, CHECKPOINT_ON_STOP, RESTORE_FROM
from ferry.kube.cri import ContainerSpec
from ferry.kube.runtime import RESTORE_REPORT
from tests.conftest import BIN, PY, WORKLOADS, wait_until
from tests.cri import Containerd, pod, python_container, two_nodes

pytestmark = [pytest.mark.criu]

TRAIN = [str(WORKLOADS / "train.py"), "--steps", "300", "--sleep", "0.03", "--width", "512"]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Containerd, Containerd]]:
    with two_nodes(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster


def container(command: list[str]) -> ContainerSpec:
    return python_container(command)


def ferry(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = f"{BIN}:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    return subprocess.run([str(BIN / "ferry"), *args], capture_output=True, text=True, check=False,
                          env={"FERRY_CONFIG": str(config), "PATH": path})


def test_a_pod_checkpointed_on_one_node_continues_on_another(nodes: tuple[Path, Containerd, Containerd],
                                                             tmp_path: Path) -> None:
    config, a, b = nodes
    want = subprocess.run([PY, *TRAIN], capture_output=True, text=True, check=True).stdout.splitlines()
    cid = a.start(pod("trainer", {CHECKPOINT_EVERY: "10m", CHECKPOINT_ON_STOP: "true"}, tmp_path),
                container([PY, *TRAIN]))
    wait_until(lambda: len(a.lines(cid)) >= 20, 120, "train.py's first steps in the container")

    periodic = ferry(config, "pod", "checkpoint", cid, "--endpoint", a.endpoint, "-o", "json")
    assert periodic.returncode == 0, periodic.stderr
    first = json.loads(periodic.stdout)
    assert first["job"] == "k8s.ml.trainer.main" and not first["final"] and first["parent"] is None
    seen = len(a.lines(cid))
    wait_until(lambda: len(a.lines(cid)) >= seen + 10, 60, "the container to run on after a leave-running dump")
    assert a.info(cid).state == "running"

    a.stop_container(cid)  # as the kubelet stops a container whose pod goes: the runtime checkpoints it instead
    assert a.info(cid).state == "exited"
    listed = ferry(config, "pod", "checkpoints", "k8s.ml.trainer.main", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    checkpoints = json.loads(listed.stdout)
    assert [c["checkpoint"] for c in checkpoints][:1] == [first["checkpoint"]] and len(checkpoints) == 2
    last = checkpoints[1]
    assert last["final"] and last["parent"] == first["checkpoint"]
    before = a.lines(cid)
    assert 30 <= len(before) < len(want) - 20, "the checkpoint came too late to test a restore"

    # the replacement, as a workload's controller recreates it: same names, restore-from auto
    moved = b.start(pod("trainer", {RESTORE_FROM: AUTO}, tmp_path), container([PY, *TRAIN]))
    report = json.loads((b.bundle(moved) / RESTORE_REPORT).read_text())
    assert report["restored"] is True and report["checkpoint"] == last["checkpoint"], report
    wait_until(lambda: b.info(moved).state == "exited", 180, "the restored container to finish")
    assert b.info(moved).exit_code == 0
    after = b.lines(moved)
    assert before + after == want, "the restored container did not continue where the first one stopped"

    # the job's work went on from that checkpoint: a later pod of the same job starts anew
    again = a.start(pod("trainer", {RESTORE_FROM: AUTO}, tmp_path), container([PY, *TRAIN]))
    wait_until(lambda: a.lines(again)[:1] == want[:1], 60, "a later pod of the job to start from its first step")
    report = json.loads((a.bundle(again) / RESTORE_REPORT).read_text())
    assert report["restored"] is False and "nothing to continue from" in report["reason"], report
    a.stop_container(again)


@pytest.mark.parametrize("value", ["k8s.ml.nobody.main", "../etc/passwd"])
def test_a_restore_from_nothing_usable_starts_fresh_and_says_why(nodes: tuple[Path, Containerd, Containerd],
                                                                tmp_path: Path, value: str) -> None:
    _, a, _ = nodes
    cid = a.start(pod("fresh", {RESTORE_FROM: value}, tmp_path),
                container(["/bin/sh", "-c", "echo fresh; exec sleep 60"]))
    wait_until(lambda: "fresh" in a.lines(cid), 30, "the container to start fresh")
    said = a.lines(cid)  # the runtime's one line of why, on the container's stderr (kubectl logs shows it)
    assert len(said) == 2 and said[0].startswith(f"ferry-runc: not restoring from {value}: "), said
    report = json.loads((a.bundle(cid) / RESTORE_REPORT).read_text())
    assert report["restored"] is False and report["restore_from"] == value
    assert ("no checkpoint" in report["reason"]) if value.startswith("k8s") else ("not JOB" in report["reason"])


def test_the_node_agent_carries_out_its_nodes_checkpoint_requests(nodes: tuple[Path, Containerd, Containerd],
                                                                 tmp_path: Path) -> None:
    """A FerryCheckpoint request, as the controller writes it into the API (here its double), carried
    out by the node agent through containerd's CRI and runc into the store, its status written."""
    from ferry.common.config import load_settings
    from ferry.controller import agent
    from ferry.kube.cri import CriClient
    from ferry.store.url import open_store
    from tests.kubedouble import KubeDouble

    config, a, _ = nodes
    settings = load_settings(config)
    store = open_store(settings.resolved_store_url(), settings.resolved_store_key_file())
    cid = a.start(pod("counter", {}, tmp_path),
                container(["/bin/sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done"]))
    wait_until(lambda: len(a.lines(cid)) >= 5, 30, "the counter's output")
    api = KubeDouble()
    for name, target in (("counter-1", "counter"), ("ghost-1", "ghost")):
        api.put("ferrycheckpoints", {"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryCheckpoint",
                                     "metadata": {"name": name, "namespace": "ml"},
                                     "spec": {"pod": target, "node": "node-a", "final": False, "reason": "periodic"},
                                     "status": {"phase": "Pending"}})
    api.put("ferrycheckpoints", {"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryCheckpoint",
                                 "metadata": {"name": "elsewhere-1", "namespace": "ml"},
                                 "spec": {"pod": "counter", "node": "node-b", "final": False, "reason": "periodic"}})

    async def serve() -> None:
        async with CriClient(a.endpoint) as cri:
            for request in agent.pending_for(await api.list("ferrycheckpoints"), "node-a"):
                await agent.carry_out(api, cri, store, request, tmp_path / "work")

    asyncio.run(serve())
    done = api.get("ferrycheckpoints", "ml", "counter-1")
    assert done is not None and done["status"]["phase"] == "Succeeded", done
    [entry] = done["status"]["containers"]
    assert entry["job"] == "k8s.ml.counter.main" and entry["checkpoint"] in store.list_checkpoints(entry["job"])
    ghost = api.get("ferrycheckpoints", "ml", "ghost-1")
    assert ghost is not None and ghost["status"]["phase"] == "Failed" and "no running container" in \
        ghost["status"]["message"]
    elsewhere = api.get("ferrycheckpoints", "ml", "elsewhere-1")
    assert elsewhere is not None and "status" not in elsewhere  # another node's agent's
    seen = len(a.lines(cid))
    wait_until(lambda: len(a.lines(cid)) > seen + 3, 30, "the counter to run on after a periodic checkpoint")
    a.stop_container(cid, grace=1)  # sh as a pid 1 ignores SIGTERM
