"""Vetting a GPU restore target before anything is touched, pure."""

from __future__ import annotations

import pytest

from ferry.common.errors import ConflictError, FerryError
from ferry.gpu.compat import check_restore_target, device_map, driver_major, snapshot_of
from ferry.gpu.errors import GpuError, GpuMismatch
from ferry.gpu.models import GpuInfo, GpuSnapshot

GiB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
SOURCE = GpuSnapshot(model=H100, count=2, driver_version="570.86.10", uuids=["GPU-a", "GPU-b"])


def gpu(index: int, model: str = H100, **kw: object) -> GpuInfo:
    return GpuInfo.model_validate({"index": index, "uuid": f"GPU-{index}", "model": model,
                                   "memory_total": 80 * GiB, **kw})


def refused(target: list[GpuInfo], driver: str | None, **kw: bool) -> GpuMismatch:
    with pytest.raises(GpuMismatch) as err:
        check_restore_target(SOURCE, target, driver, **kw)
    return err.value


def test_same_model_count_and_driver_is_accepted() -> None:
    check_restore_target(SOURCE, [gpu(4), gpu(5)], "570.86.10")
    check_restore_target(SOURCE, [gpu(0, "nvidia h100 80gb  HBM3"), gpu(1)], "570.86.10")  # case, blanks


def test_model_differs() -> None:
    err = refused([gpu(0), gpu(1, "NVIDIA H100 PCIe")], "570.86.10")
    assert err.differences == [f"GPU model differs: the checkpoint ran on {H100}, the target has NVIDIA H100 PCIe"]
    assert str(err).startswith("GPU restore refused: GPU model differs")


def test_fewer_or_more_gpus() -> None:
    assert refused([gpu(0)], "570.86.10").differences == ["fewer GPUs: the checkpoint used 2, the target offers 1"]
    assert refused([gpu(0), gpu(1), gpu(2)], "570.86.10").differences == [
        "more GPUs: the checkpoint used 2, the target offers 3"
    ]


def test_driver_too_old_for_cuda_checkpoint() -> None:
    (diff,) = refused([gpu(0), gpu(1)], "550.54.15").differences
    assert "550.54.15" in diff and "older than 570" in diff


def test_driver_older_than_the_checkpoints() -> None:
    source = SOURCE.model_copy(update={"driver_version": "580.65.06"})
    with pytest.raises(GpuMismatch, match=r"older than the checkpoint's 580\.65\.06"):
        check_restore_target(source, [gpu(0), gpu(1)], "575.51.03")


def test_another_driver_version_is_refused_unless_allowed() -> None:
    (diff,) = refused([gpu(0), gpu(1)], "580.65.06").differences
    assert diff.startswith("NVIDIA driver differs: the checkpoint was taken with 570.86.10, the target has 580.65.06")
    check_restore_target(SOURCE, [gpu(0), gpu(1)], "580.65.06", same_driver=False)


def test_unknown_driver() -> None:
    assert refused([gpu(0), gpu(1)], None).differences == [
        "the target's NVIDIA driver version is unknown (is the driver installed?)"
    ]


def test_unhealthy_target_gpu() -> None:
    (diff,) = refused([gpu(0), gpu(1, healthy=False, problems=["GPU 1: XID 95, uncontained"])], "570.86.10").differences
    assert diff == "target GPU 1 (GPU-1) is unhealthy: GPU 1: XID 95, uncontained"


def test_every_difference_is_named_at_once() -> None:
    err = refused([gpu(0, "NVIDIA A100-SXM4-80GB")], "535.104.05")
    assert len(err.differences) == 3
    assert all(word in str(err) for word in ("fewer GPUs", "model differs", "older than 570"))


def test_mismatch_is_a_conflict_in_the_gpu_tree() -> None:
    err = GpuMismatch(["x"])
    assert isinstance(err, GpuError) and isinstance(err, ConflictError) and isinstance(err, FerryError)
    assert err.exit_code == 1


def test_device_map_pairs_in_order() -> None:
    assert device_map(["GPU-a", "GPU-b"], [gpu(3), gpu(1)]) == {"GPU-a": "GPU-3", "GPU-b": "GPU-1"}
    with pytest.raises(GpuMismatch, match="cannot map 2 checkpointed GPUs onto 1"):
        device_map(["GPU-a", "GPU-b"], [gpu(3)])


def test_driver_major_and_snapshot() -> None:
    assert driver_major("570.86.10") == 570 and driver_major("  580") == 580
    assert driver_major(None) is None and driver_major("n/a") is None
    snap = snapshot_of([gpu(2), gpu(3)], "570.86.10")
    assert snap == GpuSnapshot(model=H100, count=2, driver_version="570.86.10", uuids=["GPU-2", "GPU-3"])
    assert snapshot_of([], "570.86.10").count == 0
