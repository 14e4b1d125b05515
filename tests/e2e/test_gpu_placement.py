"""GPU-aware placement on an all-in-one cluster whose nodes declare simulated GPUs (the cluster file):
count, model and memory are matched, each job gets CUDA_VISIBLE_DEVICES, no two jobs share a GPU,
and a request nothing can take waits with its reason."""

from collections.abc import Iterator

import pytest

from tests.conftest import Cluster, wait_until
from tests.e2e.test_control import make_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

GPUS = """
nodes:
  - {id: g1, gpus: 2, gpu_model: NVIDIA H100 80GB HBM3, gpu_memory: 80GiB}
  - {id: g2, gpus: 1, gpu_model: NVIDIA A100-SXM4-40GB, gpu_memory: 40GiB}
  - {id: c1, gpus: 0}
"""
SHOW = ["sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES\"; sleep 600"]


@pytest.fixture(scope="module")
def gpu_cluster(criu_bin: str) -> Iterator[Cluster]:
    yield from make_cluster(GPUS)


def visible(c: Cluster, job: str) -> list[str]:
    return str(c.wait_lines(job, 1)).strip().split(",")


def test_gpus_are_matched_assigned_and_never_shared(gpu_cluster: Cluster) -> None:
    c = gpu_cluster
    nodes = {n["id"]: n for n in c.json("nodes")}
    assert [g["model"] for g in nodes["g1"]["gpu_list"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert nodes["c1"]["gpus"] == 0 and nodes["c1"]["gpu_list"] == []

    big = c.json("run", "--name", "big", "--gpus", "2", "--gpu-model", "H100", "--", *SHOW)
    assert big["node"] == "g1" and big["gpu_uuids"] == ["GPU-sim-g1-0", "GPU-sim-g1-1"]
    assert visible(c, "big") == ["GPU-sim-g1-0", "GPU-sim-g1-1"]

    waiting = c.json("run", "--name", "waiting", "--gpus", "1", "--gpu-model", "H100", "--", *SHOW)
    assert waiting["state"] == "pending" and "H100" in waiting["reason"]
    roomy = c.json("run", "--name", "roomy", "--gpus", "1", "--gpu-memory", "60GiB", "--", *SHOW)
    assert roomy["state"] == "pending"
    small = c.json("run", "--name", "small", "--gpus", "1", "--", *SHOW)
    assert small["node"] == "g2" and visible(c, "small") == ["GPU-sim-g2-0"]
    cpu = c.json("run", "--name", "cpu-only", "--", *SHOW)
    assert cpu["gpu_uuids"] == [] and visible(c, "cpu-only") == [""]

    huge = c.json("run", "--name", "huge", "--gpus", "8", "--", *SHOW)
    assert huge["state"] == "pending"
    assert "8" in c.json("status", "huge")["reason"]

    c.ferry("kill", "big")  # capacity returns: the waiting jobs start, each on its own GPU
    started = wait_until(lambda: all(c.json("status", j)["state"] == "running" for j in ("waiting", "roomy")),
                         60, "the waiting GPU jobs to start")
    assert started
    got = {j: c.json("status", j) for j in ("waiting", "roomy")}
    assert {g for j in got.values() for g in j["gpu_uuids"]} == {"GPU-sim-g1-0", "GPU-sim-g1-1"}
    assert all(j["node"] == "g1" for j in got.values())
    for job in ("waiting", "roomy", "small", "cpu-only", "huge"):
        c.ferry("kill", job)
