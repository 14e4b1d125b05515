"""A distributed training job's replicas under Kubernetes, checkpointed together (issue 14: a
PyTorchJob suspended, then resumed), against two real containerds standing for two nodes: two
ranks of a gloo data-parallel loop (torch.distributed, TCP between the ranks, the node's network
as a ``hostNetwork`` PyTorchJob has it) run as pods of the group ``pt`` with checkpoint-on-stop.
Both are stopped as the kubelets stop a suspended job's pods; each runtime freezes its rank,
waits for the other, dumps it with its connections, and the group's record is written. Pods
created again with the nodes swapped (``restore-from: auto``) continue from that record, and rank
0's output is that of a run never stopped. A member whose peers never stop gets no group
checkpoint and ends within its wait, unfrozen, as it would have without Ferry."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ferry.common.config import load_settings
from ferry.common.ports import free_port
from ferry.kube import groups
from ferry.kube.annotations import AUTO, CHECKPOINT_ON_STOP, GROUP, GROUP_SIZE, GROUP_WAIT, RESTORE_FROM
from ferry.kube.runtime import RESTORE_REPORT
from ferry.store.url import open_store
from tests.conftest import PY, wait_until
from tests.cri import Containerd, pod, python_container, two_nodes
from tests.programs import ddp_train

pytestmark = [pytest.mark.criu]

STEPS, SLEEP = 120, 0.05


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Containerd, Containerd]]:
    with two_nodes(tmp_path_factory.mktemp("kube-group")) as cluster:
        yield cluster


def rank_env(rank: int, port: int) -> dict[str, str]:
    """What the training operator gives each replica (and gloo on the loopback here)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(rank),
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def reference(port: int) -> list[str]:
    import os

    procs = [subprocess.Popen([PY, "-c", ddp_train(STEPS, SLEEP)], env={**os.environ, **rank_env(r, port)},
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    out = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return out[0].splitlines()


def test_a_suspended_job_s_replicas_are_checkpointed_together_and_resume_together(
        nodes: tuple[Path, Containerd, Containerd], tmp_path: Path) -> None:
    config, a, b = nodes
    want = reference(free_port())
    assert len(want) == STEPS
    port = free_port()
    member = {GROUP: "pt", GROUP_SIZE: "2", CHECKPOINT_ON_STOP: "true", RESTORE_FROM: AUTO}
    names = ("pt-master-0", "pt-worker-0")
    first = [node.start(pod(name, member, tmp_path), python_container([PY, "-c", ddp_train(STEPS, SLEEP)],
                                                                      rank_env(r, port)))
             for r, (node, name) in enumerate(zip((a, b), names, strict=True))]
    wait_until(lambda: len(a.lines(first[0])) >= 25, 180, "the job's first steps")
    for node, cid in zip((a, b), first, strict=True):  # a first start: nothing to continue from
        report = json.loads((node.bundle(cid) / RESTORE_REPORT).read_text())
        assert report["restored"] is False and "group pt has no checkpoint" in report["reason"], report

    # the job is suspended: the operator deletes both pods, each kubelet stops its replica
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda nc: nc[0].stop_container(nc[1]), zip((a, b), first, strict=True)))
    stopped_s = time.monotonic() - started
    assert [a.info(first[0]).state, b.info(first[1]).state] == ["exited", "exited"]
    settings = load_settings(config)
    store = open_store(settings.resolved_store_url(), settings.resolved_store_key_file())
    [record] = groups.records(store.backend, "pt")
    assert sorted(record.members) == ["k8s.ml.pt-master-0.main", "k8s.ml.pt-worker-0.main"], record
    before = a.lines(first[0])
    assert 25 <= len(before) < STEPS - 20, f"the checkpoint came too late to test a restore ({len(before)} steps)"
    assert stopped_s < 30, f"stopping the group took {stopped_s:.1f} s"

    # resumed: the operator creates the pods again, which land on the other nodes
    second = [node.start(pod(name, member, tmp_path), python_container([PY, "-c", ddp_train(STEPS, SLEEP)],
                                                                       rank_env(r, port)))
              for r, (node, name) in enumerate(zip((b, a), names, strict=True))]
    for node, cid, name in zip((b, a), second, names, strict=True):
        report = json.loads((node.bundle(cid) / RESTORE_REPORT).read_text())
        assert report["restored"] is True and report["round"] == record.round, report
        assert report["checkpoint"] == record.members[f"k8s.ml.{name}.main"]
    wait_until(lambda: b.info(second[0]).state == "exited" and a.info(second[1]).state == "exited", 300,
               "the resumed job to finish")
    assert b.info(second[0]).exit_code == 0 and a.info(second[1]).exit_code == 0
    assert before + b.lines(second[0]) == want, "the resumed ranks did not continue where they stopped together"


def test_a_member_whose_peers_do_not_stop_ends_unfrozen_without_a_group_checkpoint(
        nodes: tuple[Path, Containerd, Containerd], tmp_path: Path) -> None:
    config, a, _ = nodes
    alone = {GROUP: "solo", GROUP_SIZE: "2", GROUP_WAIT: "3s", CHECKPOINT_ON_STOP: "true"}
    script = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: (print('sigterm', flush=True), " \
             "sys.exit(0)))\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)\n"
    cid = a.start(pod("solo-0", alone, tmp_path), python_container([PY, "-c", script]))
    wait_until(lambda: "tick" in a.lines(cid), 60, "the member's output")
    started = time.monotonic()
    a.stop_container(cid)
    took = time.monotonic() - started
    assert a.info(cid).state == "exited" and a.lines(cid)[-1] == "sigterm", a.lines(cid)[-3:]
    assert 3 <= took < 15, f"the stop took {took:.1f} s"
    settings = load_settings(config)
    store = open_store(settings.resolved_store_url(), settings.resolved_store_key_file())
    assert groups.records(store.backend, "solo") == []
    assert groups.heard(store.backend, "solo", groups.FRESH, "frozen") == []
