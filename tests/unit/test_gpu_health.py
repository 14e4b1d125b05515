"""The GPU health rules, pure: inventories in, conditions out."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.gpu.health import (
    FATAL_XIDS,
    HealthPolicy,
    annotate,
    can_checkpoint,
    evaluate,
    healthy_gpus,
)
from ferry.gpu.models import GpuCondition, GpuInfo, GpuInventory

GiB = 1 << 30


def gpu(index: int = 0, **kw: Any) -> GpuInfo:
    base: dict[str, Any] = {"index": index, "uuid": f"GPU-{index}", "model": "NVIDIA H100 80GB HBM3",
                            "memory_total": 80 * GiB, "ecc_uncorrected": 0, "ecc_corrected": 0}
    return GpuInfo(**{**base, **kw})


def inv(t: float, *gpus: GpuInfo, error: str | None = None) -> GpuInventory:
    return GpuInventory(driver_version="570.86.10", cuda_driver_version="12.8", gpus=list(gpus), error=error,
                        sampled_at=t)


def test_healthy_node_has_no_conditions() -> None:
    now = inv(10, gpu(0), gpu(1, throttle_reasons=["gpu_idle"], xid_events=[13]))
    assert evaluate(now) == []
    assert [g.uuid for g in healthy_gpus(now, [])] == ["GPU-0", "GPU-1"]


def test_every_fatal_xid_has_its_meaning_documented() -> None:
    assert {48, 74, 79, 92, 94, 95, 119, 120} <= set(FATAL_XIDS)
    assert all(len(meaning) > 10 for meaning in FATAL_XIDS.values())


@pytest.mark.parametrize("xid", sorted(set(FATAL_XIDS) - {79}))
def test_fatal_xid_is_a_fatal_condition_that_still_answers(xid: int) -> None:
    (c,) = evaluate(inv(5, gpu(0), gpu(1, xid_events=[13, xid])))
    assert (c.kind, c.gpu_uuid, c.gpu_index, c.fatal, c.gpu_responds) == ("xid", "GPU-1", 1, True, True)
    assert c.detail.startswith(f"GPU 1: XID {xid}, ") and FATAL_XIDS[xid] in c.detail


def test_two_fatal_xids_are_two_conditions() -> None:
    conds = evaluate(inv(5, gpu(0, xid_events=[95, 48, 95])))
    assert [c.detail.split(",")[0] for c in conds] == ["GPU 0: XID 48", "GPU 0: XID 95"]


def test_xid_condition_since_is_when_it_was_first_seen() -> None:
    history = [inv(1, gpu(0)), inv(2, gpu(0, xid_events=[74])), inv(3, gpu(0, xid_events=[74]))]
    (c,) = evaluate(inv(4, gpu(0, xid_events=[74])), history)
    assert c.since == 2


def test_fell_off_the_bus_from_nvml_or_xid_79() -> None:
    (lost,) = evaluate(inv(1, gpu(0, lost=True, healthy=False)))
    (xid,) = evaluate(inv(1, gpu(0, xid_events=[79])))
    for c in (lost, xid):
        assert c.kind == "fell-off-bus" and c.fatal and not c.gpu_responds
    assert "GPU_IS_LOST" in lost.detail and "XID 79" in xid.detail
    (both,) = evaluate(inv(1, gpu(0, lost=True, xid_events=[79])))  # one condition, not two
    assert both.kind == "fell-off-bus"


def test_uncorrectable_ecc_is_fatal_and_growth_is_noted() -> None:
    history = [inv(1, gpu(0)), inv(2, gpu(0, ecc_uncorrected=1))]
    (c,) = evaluate(inv(3, gpu(0, ecc_uncorrected=4)), history)
    assert (c.kind, c.fatal, c.since) == ("ecc", True, 2)
    assert "4 uncorrectable ECC errors" in c.detail and "+3 since the last sample" in c.detail
    (same,) = evaluate(inv(4, gpu(0, ecc_uncorrected=4)), [*history, inv(3, gpu(0, ecc_uncorrected=4))])
    assert "since the last sample" not in same.detail


def test_ecc_not_supported_is_not_a_fault() -> None:
    assert evaluate(inv(1, gpu(0, ecc_uncorrected=None, ecc_corrected=None))) == []


def test_thermal_needs_a_sustained_run() -> None:
    hot = gpu(0, throttle_reasons=["sw_thermal_slowdown"], temperature_c=88)
    history = [inv(t, hot) for t in range(0, 60, 10)]
    assert evaluate(inv(59, hot), history) == []
    (c,) = evaluate(inv(60, hot), history)
    assert (c.kind, c.fatal, c.gpu_responds, c.since) == ("thermal", False, True, 0)
    assert "sw_thermal_slowdown" in c.detail and "88 C" in c.detail


def test_power_capping_is_not_thermal() -> None:
    capped = gpu(0, throttle_reasons=["sw_power_cap", "hw_slowdown"])
    history = [inv(t, capped) for t in range(0, 300, 10)]
    assert evaluate(inv(300, capped), history) == []


def test_a_cool_sample_or_a_long_gap_breaks_the_run() -> None:
    hot, cool = gpu(0, throttle_reasons=["hw_thermal_slowdown"]), gpu(0)
    history = [inv(0, hot), inv(10, hot), inv(20, cool), inv(30, hot), inv(40, hot)]
    assert evaluate(inv(70, hot), history) == []  # hot since 30 only: 40 s
    gap = [inv(0, hot), inv(10, hot), inv(50, hot)]  # 40 s without a sample
    assert evaluate(inv(69, hot), gap) == []
    assert len(evaluate(inv(69, hot), gap, HealthPolicy(max_sample_gap_s=60))) == 1


def test_the_policy_tunes_the_rules() -> None:
    hot = gpu(0, throttle_reasons=["hw_thermal_slowdown"])
    assert len(evaluate(inv(10, hot), [inv(0, hot)], HealthPolicy(thermal_sustained_s=10))) == 1
    assert evaluate(inv(1, gpu(0, xid_events=[48])), policy=HealthPolicy(fatal_xids=frozenset({95}))) == []


def test_future_history_is_ignored() -> None:
    assert evaluate(inv(5, gpu(0)), [inv(9, gpu(0, ecc_uncorrected=1))]) == []


def test_driver_error_is_a_node_condition_and_leaves_no_gpu_usable() -> None:
    history = [inv(1, gpu(0)), inv(2, error="NVIDIA driver error: x"), inv(3, error="NVIDIA driver error: x")]
    now = inv(4, error="NVIDIA driver error: x")
    (c,) = evaluate(now, history)
    assert (c.kind, c.gpu_uuid, c.fatal, c.since) == ("driver", None, True, 2)
    assert healthy_gpus(now, [c]) == []
    assert healthy_gpus(inv(5, gpu(0)), [c]) == []  # a driver condition, wherever it came from


def test_annotate_sets_health_and_problems_without_touching_the_input() -> None:
    now = inv(1, gpu(0), gpu(1, ecc_uncorrected=2, problems=["NVML nvmlDeviceGetTemperature failed: x"]))
    conds = evaluate(now)
    out = annotate(now, conds)
    assert out.gpus[0].healthy and out.gpus[0].problems == []
    assert not out.gpus[1].healthy
    assert out.gpus[1].problems == ["NVML nvmlDeviceGetTemperature failed: x", conds[0].detail]
    assert now.gpus[1].healthy  # a copy
    assert [g.uuid for g in healthy_gpus(now, conds)] == ["GPU-0"]


def test_can_checkpoint_only_when_every_gpu_of_the_job_answers() -> None:
    conds = [
        GpuCondition(kind="thermal", gpu_uuid="GPU-0", detail="hot", fatal=False),
        GpuCondition(kind="fell-off-bus", gpu_uuid="GPU-1", detail="gone", fatal=True, gpu_responds=False),
    ]
    assert can_checkpoint(conds, ["GPU-0"])
    assert not can_checkpoint(conds, ["GPU-0", "GPU-1"])
    assert can_checkpoint(conds, ["GPU-2"]) and can_checkpoint([], [])
