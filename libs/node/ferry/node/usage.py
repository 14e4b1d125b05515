"""What each running job uses, sampled on its node for its heartbeat (``Node.usage``): the resident
memory of its whole process tree, the peak of that since the job started or was restored here, and
the cores it used since the last sample. psutil reads /proc; a tree that ends meanwhile is skipped.
On a node with GPUs, NVML's compute processes say how much GPU memory the tree holds on each GPU
(``gpu_use``): the busiest GPU's share, its peak, and that GPU's utilisation.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from ferry.common.models import JobUsage
from ferry.criu.jobdir import ShimInfo
from ferry.gpu.nvml import Nvml

MIN_SPAN_S = 0.5  # a rate over a shorter span is mostly noise

GpuUse = Callable[[set[int]], tuple[int, float]]  # pids -> (bytes on the busiest GPU, its utilisation %)


def nvml_gpu_use(nvml: Nvml) -> GpuUse:
    """``gpu_use`` over NVML: per GPU, the memory the given processes hold there."""
    def use(pids: set[int]) -> tuple[int, float]:
        best, util = 0, 0.0
        for index in range(nvml.device_count()):
            procs = [(pid, used) for pid, used in nvml.compute_processes(index) if pid in pids]
            held = sum(used or 0 for _, used in procs)
            if procs and held >= best:
                best, util = held, float(nvml.utilization(index))
        return best, util
    return use


@dataclass
class UsageSampler:
    every_s: float = 2.0  # a sample at most this often (each heartbeat reuses the last in between)
    _cpu: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # job -> (cpu s, at, incarnation)
    _peak: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (peak rss, incarnation)
    _last: dict[str, JobUsage] = field(default_factory=dict)
    _at: float = 0.0
    gpu_use: GpuUse | None = None  # set on a node with GPUs
    _gpu_peak: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (peak bytes, incarnation)

    def sample(self, running: dict[str, ShimInfo]) -> dict[str, JobUsage]:
        t = time.time()
        if t - self._at < self.every_s and set(self._last) <= set(running):
            return {k: v for k, v in self._last.items() if k in running}
        self._at = t
        out: dict[str, JobUsage] = {}
        for job, info in running.items():
            got = tree_usage(info.pid)
            if got is None:
                continue
            rss, cpu_s, pids = got
            prev = self._cpu.get(job)
            cores = 0.0
            if prev is not None and prev[2] == info.incarnation and t > prev[1]:
                cores = _cores(prev, cpu_s, t)
            self._cpu[job] = (cpu_s, t, info.incarnation)
            peak, inc = self._peak.get(job, (0, info.incarnation))
            peak = max(rss, peak if inc == info.incarnation else 0)
            self._peak[job] = (peak, info.incarnation)
            gpu_bytes, gpu_util = self._gpu(pids)
            gpu_peak, inc = self._gpu_peak.get(job, (0, info.incarnation))
            gpu_peak = max(gpu_bytes, gpu_peak if inc == info.incarnation else 0)
            self._gpu_peak[job] = (gpu_peak, info.incarnation)
            out[job] = JobUsage(rss_bytes=rss, peak_rss_bytes=peak, cpu=round(cores, 3), gpu_memory_bytes=gpu_bytes,
                                peak_gpu_memory_bytes=gpu_peak, gpu_utilization=gpu_util, at=t)
        for gone in set(self._cpu) - set(running):
            self._cpu.pop(gone, None)
            self._peak.pop(gone, None)
            self._gpu_peak.pop(gone, None)
        self._last = out
        return out


    def before_dump(self, job: str, pid: int, incarnation: int) -> tuple[float | None, float | None]:
        """(CPU seconds used so far, cores used in the seconds before) of the job's tree, read just
        before a dump freezes it: what a move's lost progress is measured against (ferry.policy.lost).
        The cores come from the last heartbeat's sample when it is at least MIN_SPAN_S old, else
        from the rate that sample gave; None when neither is known (the job started moments ago)."""
        got = tree_usage(pid)
        if got is None:
            return None, None
        cpu_s, t = got[1], time.time()
        prev, last = self._cpu.get(job), self._last.get(job)
        if prev is not None and prev[2] == incarnation and t - prev[1] >= MIN_SPAN_S:
            return cpu_s, round(_cores(prev, cpu_s, t), 3)
        return cpu_s, last.cpu if last is not None and prev is not None and prev[2] == incarnation else None

    def _gpu(self, pids: set[int]) -> tuple[int, float]:
        if self.gpu_use is None:
            return 0, 0.0
        try:
            return self.gpu_use(pids)
        except Exception:
            return 0, 0.0


def _cores(prev: tuple[float, float, int], cpu_s: float, t: float) -> float:
    """The cores used between the sample ``prev`` (cpu seconds, at, incarnation) and now."""
    return max(0.0, (cpu_s - prev[0]) / (t - prev[1]))


def tree_usage(pid: int) -> tuple[int, float, set[int]] | None:
    """(resident bytes, cpu seconds, pids) of `pid` and every descendant; None when `pid` is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    rss, cpu = 0, 0.0
    for p in procs:
        try:
            with p.oneshot():
                rss += p.memory_info().rss
                times = p.cpu_times()
                cpu += times.user + times.system
        except psutil.Error:
            continue
    return rss, cpu, {p.pid for p in procs}
