"""GPU-aware placement within a node, pure: which GPUs a job gets, or why it cannot have them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ferry.gpu.models import GpuInfo
from ferry.gpu.placement import GpuRequest, assign, available, cuda_visible_devices, model_matches

GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"


def gpu(index: int, model: str = H100, memory: int = 80 * GiB, **kw: Any) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", model=model, memory_total=memory, **kw)


def indexes(result: list[GpuInfo] | str) -> list[int]:
    assert isinstance(result, list), result
    return [g.index for g in result]


def test_model_match_is_a_case_insensitive_substring() -> None:
    assert model_matches("H100", H100) and model_matches("h100 80gb", H100) and model_matches("H100", "H100")
    assert model_matches("a100-sxm4", A100) and not model_matches("H100", A100)
    assert model_matches("NVIDIA H100 80GB", "NVIDIA  H100 80GB HBM3")  # blanks do not matter


def test_assigns_the_lowest_free_gpus() -> None:
    gpus = [gpu(i) for i in range(4)]
    assert indexes(assign(GpuRequest(count=2), gpus)) == [0, 1]
    assert indexes(assign(GpuRequest(count=2), gpus, {"GPU-0": ["job-a"], "GPU-2": ["job-b"]})) == [1, 3]


def test_zero_gpus_is_always_possible() -> None:
    assert assign(GpuRequest(count=0), []) == []


def test_model_and_memory_filter() -> None:
    gpus = [gpu(0, A100, 40 * GiB), gpu(1, H100), gpu(2, A100, 40 * GiB), gpu(3, H100)]
    assert indexes(assign(GpuRequest(count=2, model="H100"), gpus)) == [1, 3]
    assert indexes(assign(GpuRequest(count=1, memory_bytes=41 * GiB), gpus)) == [1]
    assert indexes(assign(GpuRequest(count=2, model="a100", memory_bytes=40 * GiB), gpus)) == [0, 2]
    assert assign(GpuRequest(count=1, model="A100", memory_bytes=80 * GiB), gpus) == (
        "needs 1 A100 GPU with >= 80.0 GiB, 0 of the node's 4 fit (2 not A100; 2 under 80.0 GiB)"
    )


def test_unhealthy_gpus_are_never_given() -> None:
    gpus = [gpu(0, healthy=False), gpu(1, lost=True, healthy=False), gpu(2)]
    assert indexes(assign(GpuRequest(count=1), gpus)) == [2]
    assert assign(GpuRequest(count=2), gpus) == "needs 2 GPUs, 1 of the node's 3 fit (2 unhealthy)"


def test_no_two_jobs_share_a_gpu_unless_asked() -> None:
    gpus = [gpu(0), gpu(1)]
    used = {"GPU-0": ["job-a"], "GPU-1": ["job-b"]}
    assert assign(GpuRequest(count=1), gpus, used) == "needs 1 GPU, 0 of the node's 2 fit (2 in use by job-a, job-b)"
    # a shared request shares only with jobs that also asked to share
    assert isinstance(assign(GpuRequest(count=1, shared=True), gpus, used, shared_jobs={"job-a"}), list)
    assert indexes(assign(GpuRequest(count=1, shared=True), gpus, used, shared_jobs={"job-a"})) == [0]
    assert isinstance(assign(GpuRequest(count=1, shared=True), gpus, used), str)
    # an exclusive request never takes a shared GPU
    assert isinstance(assign(GpuRequest(count=1), gpus, used, shared_jobs={"job-a", "job-b"}), str)


def test_shared_requests_pack_onto_shared_gpus_least_used_first() -> None:
    gpus = [gpu(0), gpu(1), gpu(2)]
    used = {"GPU-1": ["s1", "s2"], "GPU-2": ["s3"]}
    shared = {"s1", "s2", "s3"}
    assert indexes(assign(GpuRequest(count=1, shared=True), gpus, used, shared_jobs=shared)) == [2]
    assert indexes(assign(GpuRequest(count=2, shared=True), gpus, used, shared_jobs=shared)) == [1, 2]
    assert indexes(assign(GpuRequest(count=3, shared=True), gpus, used, shared_jobs=shared)) == [0, 1, 2]


def test_a_job_gets_gpus_of_one_model() -> None:
    gpus = [gpu(0, A100, 40 * GiB), gpu(1, H100), gpu(2, A100, 40 * GiB), gpu(3, H100, healthy=False)]
    assert indexes(assign(GpuRequest(count=2), gpus)) == [0, 2]
    assert assign(GpuRequest(count=3), gpus) == f"needs 3 GPUs of one model, the node has 2 {A100}, 1 {H100}"
    mixed = [gpu(0, A100, 40 * GiB), gpu(1, H100)]
    assert assign(GpuRequest(count=2), mixed) == f"needs 2 GPUs of one model, the node has 1 {A100}, 1 {H100}"


def test_no_gpus_at_all() -> None:
    assert assign(GpuRequest(count=1, model="H100"), []) == "needs 1 H100 GPU, the node has no GPUs"


def test_available_lists_what_could_take_one_gpu_of_the_request() -> None:
    gpus = [gpu(0), gpu(1, A100, 40 * GiB), gpu(2, healthy=False), gpu(3)]
    assert [g.index for g in available(GpuRequest(count=8, model="H100"), gpus, {"GPU-3": ["j"]})] == [0]


def test_request_validation_and_description() -> None:
    with pytest.raises(ValidationError):
        GpuRequest(count=-1)
    with pytest.raises(ValidationError):
        GpuRequest(count=1, memory_bytes=-5)
    assert GpuRequest(count=2, model="H100", memory_bytes=40 * GiB).describe() == "2 H100 GPUs with >= 40.0 GiB each"
    assert GpuRequest(count=1, shared=True).describe() == "1 GPU (shared)"


def test_cuda_visible_devices_uses_uuids_in_order() -> None:
    assert cuda_visible_devices([gpu(3), gpu(1)]) == "GPU-3,GPU-1"
    assert cuda_visible_devices([]) == ""
