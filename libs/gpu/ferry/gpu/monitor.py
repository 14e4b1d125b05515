"""A node's GPU monitor: samples NVML, keeps recent samples, and says what is wrong, for each heartbeat.

    monitor = GpuMonitor(RealNvml(), watcher=XidWatcher(RealNvml()))
    monitor.start()                                  # the XID watcher's thread
    report = await asyncio.to_thread(monitor.sample) # GpuReport: annotated inventory + conditions
    monitor.stop()

``sample`` never raises: no driver gives an empty inventory, a driver error a "driver" condition.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ferry.gpu.health import HealthPolicy, annotate, evaluate
from ferry.gpu.models import GpuInventory, GpuReport
from ferry.gpu.nvml import Nvml, read_inventory
from ferry.gpu.xid import XidWatcher

__all__ = ["GpuMonitor"]


class GpuMonitor:
    def __init__(
        self,
        nvml: Nvml,
        *,
        watcher: XidWatcher | None = None,
        policy: HealthPolicy | None = None,
        history_s: float | None = None,
    ) -> None:
        self.nvml = nvml
        self.watcher = watcher
        self.policy = policy or HealthPolicy()
        # keep enough samples to see a sustained condition, with room to spare
        self.history_s = history_s if history_s is not None else 2 * self.policy.thermal_sustained_s + 60
        self._history: deque[GpuInventory] = deque()
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def sample(self, now: float | None = None) -> GpuReport:
        """Reads the GPUs now and evaluates them against the recent samples."""
        at = time.time() if now is None else now
        xids = self.watcher.recent() if self.watcher is not None else None
        with self._lock:
            previous = self._history[-1] if self._history else None
            inventory = read_inventory(self.nvml, xids=xids, previous=previous, now=at)
            conditions = evaluate(inventory, list(self._history), self.policy)
            self._history.append(inventory)
            while self._history and self._history[0].sampled_at < at - self.history_s:
                self._history.popleft()
        mode = self.watcher.mode if self.watcher is not None else "off"
        return GpuReport(inventory=annotate(inventory, conditions), conditions=conditions, xid_mode=mode)
