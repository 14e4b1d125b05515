"""What each running job uses, sampled on its node for its heartbeat (``Node.usage``): the resident
memory of its whole process tree, the peak of that since the job started or was restored here, and
the cores it used since the last sample. psutil reads /proc; a tree that ends meanwhile is skipped.
"""

import time
from dataclasses import dataclass, field

import psutil

from ferry.common.models import JobUsage
from ferry.criu.jobdir import ShimInfo


@dataclass
class UsageSampler:
    every_s: float = 2.0  # a sample at most this often (each heartbeat reuses the last in between)
    _cpu: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # job -> (cpu s, at, incarnation)
    _peak: dict[str, tuple[int, int]] = field(default_factory=dict)  # job -> (peak rss, incarnation)
    _last: dict[str, JobUsage] = field(default_factory=dict)
    _at: float = 0.0

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
            rss, cpu_s = got
            prev = self._cpu.get(job)
            cores = 0.0
            if prev is not None and prev[2] == info.incarnation and t > prev[1]:
                cores = max(0.0, (cpu_s - prev[0]) / (t - prev[1]))
            self._cpu[job] = (cpu_s, t, info.incarnation)
            peak, inc = self._peak.get(job, (0, info.incarnation))
            peak = max(rss, peak if inc == info.incarnation else 0)
            self._peak[job] = (peak, info.incarnation)
            out[job] = JobUsage(rss_bytes=rss, peak_rss_bytes=peak, cpu=round(cores, 3), at=t)
        for gone in set(self._cpu) - set(running):
            self._cpu.pop(gone, None)
            self._peak.pop(gone, None)
        self._last = out
        return out


def tree_usage(pid: int) -> tuple[int, float] | None:
    """(resident bytes, cpu seconds) of `pid` and every descendant; None when `pid` is gone."""
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
    return rss, cpu
