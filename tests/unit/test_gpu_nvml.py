"""The NVML layer against a fake NVML with recorded values and scripted events: inventory, every GPU fault
as a condition, XIDs through the event-wait path (and the kernel-log fallback), and what the scheduler
decides from them. Also ``RealNvml`` itself, over a stand-in pynvml module and over this machine.

``FakeNvml`` is a test double of the ``Nvml`` protocol, not a feature: the shipped path is ``RealNvml``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from ferry.gpu.errors import NvmlError, NvmlUnavailable
from ferry.gpu.health import can_checkpoint, evaluate, healthy_gpus
from ferry.gpu.monitor import GpuMonitor
from ferry.gpu.nvml import EVENT_TYPE_XID_CRITICAL, NvmlCode, NvmlEvent, RealNvml, read_inventory, reason_names
from ferry.gpu.placement import GpuRequest, assign
from ferry.gpu.xid import XidWatcher, parse_xid_line, pci_key
from tests.gpu_fakes import H100_0, H100_1, HW_THERMAL, SW_POWER_CAP, FakeGpu, FakeNvml, GiB


def two_h100() -> FakeNvml:
    return FakeNvml([FakeGpu(**H100_0), FakeGpu(**H100_1)])


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- inventory --------------------------------------------------------------------------------------


def test_inventory_of_healthy_gpus_has_every_field() -> None:
    nvml = two_h100()
    inv = read_inventory(nvml, now=100.0)
    assert inv.error is None and inv.driver_version == "570.86.10" and inv.cuda_driver_version == "12.8"
    assert inv.sampled_at == 100.0
    g0, g1 = inv.gpus
    assert (g0.index, g0.uuid, g0.model) == (0, H100_0["uuid"], "NVIDIA H100 80GB HBM3")
    assert g0.pci_bus_id == "00000000:18:00.0"
    assert g1.memory_total == 85520809984 and g1.memory_used == 40233861120
    assert g1.utilization_pct == 97 and g1.temperature_c == 64 and g1.power_w == pytest.approx(612.004)
    assert g0.throttle_reasons == ["gpu_idle"] and g1.throttle_reasons == ["sw_power_cap"]
    assert g0.ecc_uncorrected == 0 and g0.ecc_corrected == 0 and g0.xid_events == []
    assert all(g.healthy and not g.lost and not g.problems for g in inv.gpus)
    assert evaluate(inv) == []
    assert nvml.inits == 1 and nvml.shutdowns == 1  # NVML is released after each read


def test_unsupported_queries_leave_fields_empty_not_unhealthy() -> None:
    gpu = FakeGpu(**H100_0, errors={"power_mw": NvmlCode.NOT_SUPPORTED, "ecc_errors": NvmlCode.NOT_SUPPORTED})
    (g,) = read_inventory(FakeNvml([gpu])).gpus
    assert g.power_w is None and g.ecc_uncorrected is None and g.ecc_corrected is None
    assert g.healthy and g.problems == []


def test_other_query_failures_are_noted_as_problems() -> None:
    gpu = FakeGpu(**H100_0, errors={"temperature": NvmlCode.NO_PERMISSION})
    (g,) = read_inventory(FakeNvml([gpu])).gpus
    assert g.temperature_c is None and g.healthy
    assert any("temperature" in p and "NO_PERMISSION" in p for p in g.problems)


def test_node_without_the_driver_reports_zero_gpus_and_no_error() -> None:
    nvml = FakeNvml(unavailable=True)
    inv = read_inventory(nvml)
    assert inv.gpus == [] and inv.error is None and inv.driver_version is None
    assert evaluate(inv) == [] and healthy_gpus(inv, []) == []
    report = GpuMonitor(nvml).sample()
    assert report.inventory.gpus == [] and report.conditions == []


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NvmlCode.DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (NvmlCode.LIB_RM_VERSION_MISMATCH, "versions differ"),
        (NvmlCode.NO_PERMISSION, "no permission"),
        (NvmlCode.UNKNOWN, "UNKNOWN"),
    ],
)
def test_a_driver_error_is_a_clear_node_condition_not_a_crash(code: int, words: str) -> None:
    inv = read_inventory(FakeNvml([FakeGpu(**H100_0)], init_error=code))
    assert inv.gpus == []
    assert inv.error is not None and inv.error.startswith("NVIDIA driver error") and words in inv.error
    (cond,) = evaluate(inv)
    assert cond.kind == "driver" and cond.fatal and cond.gpu_uuid is None and cond.detail == inv.error


def test_failing_to_count_gpus_is_a_driver_condition() -> None:
    inv = read_inventory(FakeNvml([FakeGpu(**H100_0)], count_error=NvmlCode.UNKNOWN))
    assert inv.gpus == [] and inv.driver_version == "570.86.10" and inv.error is not None
    assert [c.kind for c in evaluate(inv)] == ["driver"]


def test_read_inventory_never_raises_even_on_a_broken_binding() -> None:
    class Broken(FakeNvml):
        def device_count(self) -> int:
            raise RuntimeError("boom")

    inv = read_inventory(Broken())
    assert inv.gpus == [] and inv.error is not None and "boom" in inv.error


# -- each fault as a condition ----------------------------------------------------------------------


def test_uncorrectable_ecc_errors_make_the_gpu_unhealthy_and_say_when_they_grow() -> None:
    nvml = two_h100()
    monitor = GpuMonitor(nvml)
    assert monitor.sample(now=10.0).conditions == []
    nvml.gpus[1].ecc_uncorrected = 1
    first = monitor.sample(now=11.0)
    (cond,) = first.conditions
    assert (cond.kind, cond.gpu_uuid, cond.gpu_index) == ("ecc", H100_1["uuid"], 1)
    assert cond.fatal and cond.gpu_responds
    assert cond.since == 11.0 and "1 uncorrectable ECC errors" in cond.detail
    nvml.gpus[1].ecc_uncorrected = 3
    (cond,) = monitor.sample(now=12.0).conditions
    assert "+2 since the last sample" in cond.detail and cond.since == 11.0
    gpus = {g.uuid: g for g in first.inventory.gpus}
    assert gpus[H100_0["uuid"]].healthy and not gpus[H100_1["uuid"]].healthy
    assert any("uncorrectable ECC" in p for p in gpus[H100_1["uuid"]].problems)


def test_correctable_ecc_errors_alone_are_fine() -> None:
    nvml = two_h100()
    nvml.gpus[0].ecc_corrected = 12
    assert GpuMonitor(nvml).sample().conditions == []


def test_gpu_that_fell_off_the_bus_is_lost_keeps_its_identity_and_cannot_be_checkpointed() -> None:
    nvml = two_h100()
    monitor = GpuMonitor(nvml)
    monitor.sample(now=1.0)
    nvml.gpus[0].errors = {"*": NvmlCode.GPU_IS_LOST}
    report = monitor.sample(now=2.0)
    g0 = report.inventory.gpus[0]
    assert g0.lost and not g0.healthy
    assert (g0.uuid, g0.model, g0.memory_total) == (H100_0["uuid"], H100_0["name"], H100_0["total"])
    (cond,) = report.conditions
    assert cond.kind == "fell-off-bus" and cond.fatal and not cond.gpu_responds and "GPU_IS_LOST" in cond.detail
    assert not can_checkpoint(report.conditions, [H100_0["uuid"]])  # its jobs come from their last checkpoint
    assert can_checkpoint(report.conditions, [H100_1["uuid"]])


def test_a_lost_gpu_without_an_earlier_sample_still_shows_up() -> None:
    gpu = FakeGpu(**H100_0, errors={"*": NvmlCode.GPU_IS_LOST})
    (g,) = read_inventory(FakeNvml([gpu])).gpus
    assert g.lost and g.uuid == "GPU-unknown-0" and not g.healthy


def test_sustained_thermal_slowdown_marks_the_gpu_unhealthy_but_not_fatal() -> None:
    nvml = two_h100()
    nvml.gpus[1].reasons = HW_THERMAL | SW_POWER_CAP
    nvml.gpus[1].temp = 91
    monitor = GpuMonitor(nvml)
    for t in range(0, 60, 5):  # 55 s of slowdown: not yet
        assert monitor.sample(now=1000.0 + t).conditions == []
    (cond,) = monitor.sample(now=1060.0).conditions
    assert (cond.kind, cond.fatal, cond.gpu_responds, cond.since) == ("thermal", False, True, 1000.0)
    assert "hw_thermal_slowdown" in cond.detail and "60 s" in cond.detail and "91 C" in cond.detail
    assert can_checkpoint([cond], [H100_1["uuid"]])  # the GPU answers: checkpoint, then move
    nvml.gpus[1].reasons = SW_POWER_CAP  # cooled down
    assert monitor.sample(now=1065.0).conditions == []


def test_thermal_slowdown_that_comes_and_goes_is_not_sustained() -> None:
    nvml = two_h100()
    monitor = GpuMonitor(nvml)
    for t in range(0, 120, 5):
        nvml.gpus[0].reasons = HW_THERMAL if (t // 5) % 4 else 0
        assert monitor.sample(now=float(t)).conditions == []


# -- XIDs through NVML's event API ------------------------------------------------------------------


@pytest.mark.parametrize("xid", [48, 74, 92, 94, 95, 119, 120])
def test_fatal_xid_events_arrive_through_event_wait_and_mark_the_gpu(xid: int) -> None:
    nvml = two_h100()
    watcher = XidWatcher(nvml, wait_ms=20)
    monitor = GpuMonitor(two_h100(), watcher=watcher)
    monitor.start()
    try:
        assert watcher.wait_ready() == "events" and nvml.registered == {0, 1}
        nvml.push_xid(1, xid)
        wait_for(lambda: watcher.recent())
        report = monitor.sample()
    finally:
        monitor.stop()
    assert watcher.recent() == {H100_1["uuid"]: [xid]}
    assert report.xid_mode == "events" and report.inventory.gpus[1].xid_events == [xid]
    (cond,) = report.conditions
    assert cond.kind == "xid" and cond.fatal and cond.gpu_uuid == H100_1["uuid"] and f"XID {xid}" in cond.detail
    assert [g.uuid for g in healthy_gpus(report.inventory, report.conditions)] == [H100_0["uuid"]]


def test_xid_79_is_a_gpu_that_fell_off_the_bus() -> None:
    nvml = two_h100()
    with XidWatcher(nvml, wait_ms=20) as watcher:
        watcher.wait_ready()
        nvml.push_xid(0, 79, with_uuid=False)  # a lost GPU may not say its UUID: the index maps it
        wait_for(lambda: watcher.records())
        inv = read_inventory(two_h100(), xids=watcher.recent())
    (cond,) = evaluate(inv)
    assert cond.kind == "fell-off-bus" and not cond.gpu_responds and "XID 79" in cond.detail
    assert cond.gpu_uuid == H100_0["uuid"]


def test_application_xids_do_not_make_a_gpu_unhealthy() -> None:
    nvml = two_h100()
    with XidWatcher(nvml, wait_ms=20) as watcher:
        watcher.wait_ready()
        nvml.push_xid(0, 13)  # graphics engine exception: the application's fault
        nvml.push_xid(0, 31)  # MMU fault: likewise
        wait_for(lambda: len(watcher.records()) == 2)
        inv = read_inventory(two_h100(), xids=watcher.recent())
    assert inv.gpus[0].xid_events == [13, 31] and evaluate(inv) == []


def test_watcher_clear_forgets_a_reset_gpu() -> None:
    nvml = two_h100()
    with XidWatcher(nvml, wait_ms=20) as watcher:
        watcher.wait_ready()
        nvml.push_xid(0, 48)
        nvml.push_xid(1, 95)
        wait_for(lambda: len(watcher.records()) == 2)
        watcher.clear(H100_0["uuid"])
        assert watcher.recent() == {H100_1["uuid"]: [95]}
        watcher.clear()
        assert watcher.recent() == {}


def test_watcher_without_a_driver_is_off_and_quiet() -> None:
    watcher = XidWatcher(FakeNvml(unavailable=True))
    watcher.start()
    assert watcher.wait_ready() == "off" and watcher.error is None
    watcher.stop()


# -- the kernel-log fallback ------------------------------------------------------------------------


def test_parse_xid_lines_and_pci_addresses() -> None:
    line = "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert parse_xid_line(line) == ((0, 0x2A, 0), 79)
    assert parse_xid_line("NVRM: Xid (PCI:0000:18:00.0): 48, pid=1234, DBE") == ((0, 0x18, 0), 48)
    assert parse_xid_line("usb 1-1: new high-speed USB device") is None
    assert pci_key("00000000:2A:00.0") == pci_key("0000:2a:00") == (0, 0x2A, 0)
    assert pci_key("garbage") is None


def test_polling_fallback_reads_xids_from_the_kernel_log(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("4,100,5000,-;NVRM: Xid (PCI:0000:2a:00): 48, old, before the watcher started\n")
    nvml = FakeNvml([FakeGpu(**H100_0, events=False), FakeGpu(**H100_1, events=False)])
    with XidWatcher(nvml, kernel_log=str(kmsg), poll_interval_s=0.02) as watcher:
        assert watcher.wait_ready() == "polling"
        with kmsg.open("a") as f:
            f.write("4,101,6000,-;NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', GPU has fallen off the bus.\n")
            f.write(" SUBSYSTEM=pci\n")
            f.write("6,102,6001,-;eth0: link up\n")
        wait_for(lambda: watcher.records())
    assert watcher.recent() == {H100_1["uuid"]: [79]}


def test_event_wait_that_keeps_failing_falls_back_to_polling(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    nvml = two_h100()
    for _ in range(5):
        nvml.push_wait_error(NvmlCode.UNKNOWN)
    with XidWatcher(nvml, wait_ms=10, kernel_log=str(kmsg), poll_interval_s=0.02) as watcher:
        wait_for(lambda: watcher.mode == "polling")
        assert watcher.error is not None and "polling the kernel log" in watcher.error
        with kmsg.open("a") as f:
            f.write("NVRM: Xid (PCI:0000:18:00): 95, uncontained ECC error\n")
        wait_for(lambda: watcher.records())
    assert watcher.recent() == {H100_0["uuid"]: [95]}


def test_no_events_and_no_readable_kernel_log_is_off_with_a_reason(tmp_path: Path) -> None:
    nvml = FakeNvml([FakeGpu(**H100_0, events=False)])
    with XidWatcher(nvml, kernel_log=str(tmp_path / "missing")) as watcher:
        assert watcher.wait_ready() == "off"
        assert watcher.error is not None and "kernel log is unreadable" in watcher.error


# -- what the scheduler decides from it -------------------------------------------------------------


def test_scheduling_avoids_faulty_gpus_and_chooses_how_jobs_move() -> None:
    nvml = FakeNvml([FakeGpu(**H100_0), FakeGpu(**H100_1), FakeGpu(**{**H100_0, "uuid": "GPU-3", "bus_id": "0:3b:0"})])
    watcher = XidWatcher(nvml, wait_ms=20)
    monitor = GpuMonitor(nvml, watcher=watcher)
    monitor.start()
    try:
        watcher.wait_ready()
        report = monitor.sample(now=1.0)
        two = GpuRequest(count=2, model="H100", memory_bytes=40 * GiB)
        got = assign(two, report.inventory.gpus)
        assert isinstance(got, list) and [g.index for g in got] == [0, 1]
        # GPU 1 reports XID 95; GPU 2 falls off the bus.
        nvml.push_xid(1, 95)
        wait_for(lambda: watcher.recent())
        nvml.gpus[2].errors = {"*": NvmlCode.GPU_IS_LOST}
        report = monitor.sample(now=2.0)
    finally:
        monitor.stop()
    kinds = {c.gpu_index: c.kind for c in report.conditions}
    assert kinds == {1: "xid", 2: "fell-off-bus"}
    # a job on GPU 1 is checkpointed before it moves; one on GPU 2 comes back from its last checkpoint
    assert can_checkpoint(report.conditions, [H100_1["uuid"]])
    assert not can_checkpoint(report.conditions, ["GPU-3"])
    # nothing new lands on them: two GPUs no longer fit, one does
    reason = assign(GpuRequest(count=2, model="H100"), report.inventory.gpus)
    assert reason == "needs 2 H100 GPUs, 1 of the node's 3 fit (2 unhealthy)"
    one = assign(GpuRequest(count=1), report.inventory.gpus)
    assert isinstance(one, list) and [g.index for g in one] == [0]


# -- RealNvml: the shipped path ---------------------------------------------------------------------


def _has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and "GPU " in out.stdout


def test_real_nvml_on_this_machine_never_raises() -> None:
    inv = read_inventory(RealNvml())
    assert inv.error is None or inv.error.startswith("NVIDIA driver error")
    if not _has_nvidia_gpu():
        assert inv.gpus == [] and inv.error is None


def test_real_nvml_without_the_package_is_unavailable() -> None:
    nvml = RealNvml(module="ferry_no_such_pynvml")
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        nvml.init()
    assert read_inventory(nvml).gpus == []


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {15: "GPU is lost", 10: "Timeout", 12: "NVML Shared Library Not Found"}.get(self.value, "Unknown")


def _stand_in_pynvml(name: str, **overrides: Any) -> types.ModuleType:
    """A module with pynvml's names and shapes (nvidia-ml-py 13.x), for RealNvml's translation code."""
    mod = types.ModuleType(name)
    ns = types.SimpleNamespace
    handles = {0: "h0", 1: "h1"}
    waits: list[Any] = [ns(device="h1", eventType=EVENT_TYPE_XID_CRITICAL, eventData=79), _NVMLError(10)]

    def lost(*_: Any) -> Any:
        raise _NVMLError(15)

    def wait(es: object, timeout: int) -> Any:
        item = waits.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def clocks_event(h: str) -> int:
        raise _NVMLError(13)  # an older driver: the function is not there

    members: dict[str, Any] = {
        "NVMLError": _NVMLError,
        "nvmlEventTypeXidCriticalError": EVENT_TYPE_XID_CRITICAL,
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "580.65.06",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetIndex": lambda h: 1 if h == "h1" else 0,
        "nvmlDeviceGetUUID": lambda h: "GPU-aaaa" if h == "h0" else "GPU-bbbb",
        "nvmlDeviceGetName": lambda h: "NVIDIA L4",
        "nvmlDeviceGetPciInfo": lambda h: ns(busId=b"00000000:01:00.0"),
        "nvmlDeviceGetMemoryInfo": lambda h: ns(total=24 * GiB, used=GiB, free=23 * GiB),
        "nvmlDeviceGetUtilizationRates": lambda h: ns(gpu=42, memory=10),
        "nvmlDeviceGetTemperature": lambda h, sensor: 50 if sensor == 0 else -1,
        "nvmlDeviceGetPowerUsage": lambda h: 72000,
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: {(1, 0): 0, (0, 0): 5}[(kind, counter)],
        "nvmlDeviceGetCurrentClocksEventReasons": clocks_event,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: HW_THERMAL,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [ns(pid=7, usedGpuMemory=GiB), ns(pid=8, usedGpuMemory=None)],
        "nvmlEventSetCreate": lambda: "es",
        "nvmlDeviceRegisterEvents": lambda h, types_, es: None,
        "nvmlEventSetWait": wait,
        "nvmlEventSetFree": lambda es: None,
    }
    members.update(overrides)
    for key, value in members.items():
        setattr(mod, key, value)
    return mod


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(**overrides: Any) -> RealNvml:
        name = f"ferry_test_pynvml_{len(sys.modules)}"
        monkeypatch.setitem(sys.modules, name, _stand_in_pynvml(name, **overrides))
        return RealNvml(module=name)

    return install


def test_real_nvml_reads_through_pynvml_names(stand_in: Any) -> None:
    nvml: RealNvml = stand_in()
    inv = read_inventory(nvml)
    assert inv.error is None and inv.driver_version == "580.65.06" and inv.cuda_driver_version == "13.0"
    g = inv.gpus[0]
    assert (g.uuid, g.model, g.pci_bus_id) == ("GPU-aaaa", "NVIDIA L4", "00000000:01:00.0")
    assert (g.memory_total, g.memory_used, g.utilization_pct, g.temperature_c) == (24 * GiB, GiB, 42, 50)
    assert g.power_w == 72.0 and g.ecc_uncorrected == 0 and g.ecc_corrected == 5
    assert g.throttle_reasons == ["hw_thermal_slowdown"]  # through the older throttle-reasons call
    nvml.init()
    assert nvml.compute_processes(0) == [(7, GiB), (8, None)]
    es = nvml.event_set_create()
    nvml.register_xid_events(0, es)
    assert nvml.event_set_wait(es, 10) == NvmlEvent(gpu_index=1, uuid="GPU-bbbb", event_type=8, data=79)
    assert nvml.event_set_wait(es, 10) is None  # NVML's timeout is a quiet wait


def test_real_nvml_translates_errors(stand_in: Any) -> None:
    def not_found() -> None:
        raise _NVMLError(12)

    lost_gpu: RealNvml = stand_in(nvmlDeviceGetTemperature=lambda h, s: (_ for _ in ()).throw(_NVMLError(15)))
    with pytest.raises(NvmlError) as err:
        lost_gpu.temperature(0)
    assert err.value.code == NvmlCode.GPU_IS_LOST and err.value.call == "nvmlDeviceGetTemperature"
    assert "GPU is lost" in str(err.value)
    assert read_inventory(lost_gpu).gpus[0].lost

    no_lib: RealNvml = stand_in(nvmlInit=not_found)
    with pytest.raises(NvmlUnavailable):
        no_lib.init()
    inv = read_inventory(no_lib)
    assert inv.gpus == [] and inv.error is None


def test_reason_names_cover_the_nvml_bits() -> None:
    assert reason_names(0) == []
    assert reason_names(0x60) == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert reason_names(0x1000 | 0x4) == ["sw_power_cap", "other_0x1000"]
