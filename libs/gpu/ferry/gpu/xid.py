"""Watching for XID errors: NVML's event API in a background thread, the kernel log as a fallback.

``XidWatcher`` registers every GPU for ``nvmlEventTypeXidCriticalError`` in one NVML event set and
blocks in ``nvmlEventSetWait`` (``wait_ms`` at a time, so that ``stop`` is prompt). When no GPU accepts
the registration, or the wait keeps failing, it falls back to polling the kernel log (``/dev/kmsg``) for
the driver's ``NVRM: Xid (PCI:0000:65:00): 79, ...`` lines and maps the PCI address to the GPU.
Either way ``recent()`` gives the XIDs seen per GPU UUID, for ``read_inventory(xids=...)``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import NamedTuple

from ferry.gpu.errors import NvmlError, NvmlUnavailable
from ferry.gpu.nvml import EVENT_TYPE_XID_CRITICAL, Nvml, NvmlCode

__all__ = ["KernelLog", "XidRecord", "XidWatcher", "parse_xid_line", "pci_key"]

log = logging.getLogger(__name__)

_PCI = re.compile(r"^\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)")
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
_KMSG_PREFIX = re.compile(r"^\d+,\d+,\d+,[^;]*;")  # /dev/kmsg: "priority,sequence,microseconds,flags;"
_MAX_WAIT_FAILURES = 5


class XidRecord(NamedTuple):
    uuid: str | None
    gpu_index: int | None
    xid: int
    time: float


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of NVML's "00000000:65:00.0" or the kernel log's "0000:65:00"."""
    m = _PCI.match(bus_id)
    if m is None:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)


def parse_xid_line(line: str) -> tuple[tuple[int, int, int], int] | None:
    """The GPU's PCI key and the XID of an ``NVRM: Xid (PCI:...): N, ...`` kernel log line, else None."""
    m = _XID_LINE.search(line)
    if m is None:
        return None
    key = pci_key(m.group(1))
    return (key, int(m.group(2))) if key is not None else None


class KernelLog:
    """New kernel log messages from ``/dev/kmsg`` (or a plain file, for tests), without blocking."""

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path
        self._fd: int | None = None

    def open(self) -> None:
        """Opens the log and skips what it already holds: only messages from now on count."""
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self._fd, 0, os.SEEK_END)

    def read_new(self) -> list[str]:
        if self._fd is None:
            return []
        out: list[str] = []
        while True:
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # /dev/kmsg: records were overwritten before we read them
                continue
            if not chunk:
                break
            for raw in chunk.decode(errors="replace").splitlines():
                if not raw or raw[0].isspace():  # /dev/kmsg continuation lines (KEY=value)
                    continue
                m = _KMSG_PREFIX.match(raw)
                out.append(raw[m.end():] if m else raw)
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class XidWatcher:
    """Collects XID events per GPU in a daemon thread; ``mode`` says how: "events", "polling" or "off"."""

    def __init__(
        self,
        nvml: Nvml,
        *,
        wait_ms: int = 500,
        keep: int = 256,
        kernel_log: str | None = "/dev/kmsg",
        poll_interval_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.wait_ms = wait_ms
        self.kernel_log = kernel_log
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self.mode = "off"
        self.error: str | None = None
        self._records: deque[XidRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._uuids: dict[int, str] = {}
        self._by_pci: dict[tuple[int, int, int], int] = {}

    # -- public -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, name="ferry-xid-watcher", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float = 10.0) -> str:
        """Waits until the watcher knows how it watches, and returns that mode."""
        self._ready.wait(timeout_s)
        return self.mode

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> XidWatcher:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def records(self) -> list[XidRecord]:
        with self._lock:
            return list(self._records)

    def recent(self) -> dict[str, list[int]]:
        """The XIDs seen since start (or the last ``clear``), per GPU UUID, oldest first."""
        out: dict[str, list[int]] = {}
        for rec in self.records():
            if rec.uuid is not None:
                out.setdefault(rec.uuid, []).append(rec.xid)
        return out

    def clear(self, uuid: str | None = None) -> None:
        """Forgets the XIDs of one GPU (after it was reset, say), or of all."""
        with self._lock:
            kept = [r for r in self._records if uuid is not None and r.uuid != uuid]
            self._records.clear()
            self._records.extend(kept)

    def record(self, xid: int, *, index: int | None = None, uuid: str | None = None) -> None:
        if uuid is None and index is not None:
            uuid = self._uuids.get(index)
        with self._lock:
            self._records.append(XidRecord(uuid=uuid, gpu_index=index, xid=xid, time=self.clock()))
        log.warning("XID %d on GPU %s (index %s)", xid, uuid or "?", index if index is not None else "?")

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.nvml.init()
        except NvmlUnavailable:
            self.mode, self.error = "off", None  # no driver: nothing to watch
            self._ready.set()
            return
        except Exception as exc:
            self.mode, self.error = "off", f"NVML could not start: {exc}"
            self._ready.set()
            return
        try:
            event_set = self._register()
            if event_set is not None:
                self.mode = "events"
                self._ready.set()
                failed = self._event_loop(event_set)
                try:
                    self.nvml.event_set_free(event_set)
                except Exception:
                    pass
                if not failed:
                    return
            self._poll_loop()
        except Exception as exc:
            self.mode, self.error = "off", f"XID watcher failed: {exc}"
            log.exception("XID watcher failed")
        finally:
            self._ready.set()
            try:
                self.nvml.shutdown()
            except Exception:
                pass

    def _register(self) -> object | None:
        count = self.nvml.device_count()
        for i in range(count):
            try:
                self._uuids[i] = self.nvml.uuid(i)
                key = pci_key(self.nvml.pci_bus_id(i))
                if key is not None:
                    self._by_pci[key] = i
            except NvmlError:
                pass
        if count == 0:
            return None
        event_set = self.nvml.event_set_create()
        registered = 0
        for i in range(count):
            try:
                self.nvml.register_xid_events(i, event_set)
                registered += 1
            except NvmlError as exc:
                log.info("GPU %d does not deliver XID events (%s)", i, exc)
        if registered == 0:
            self.nvml.event_set_free(event_set)
            return None
        return event_set

    def _event_loop(self, event_set: object) -> bool:
        """Waits for events until stopped (returns False) or the wait keeps failing (returns True)."""
        failures = 0
        while not self._stop.is_set():
            try:
                event = self.nvml.event_set_wait(event_set, self.wait_ms)
            except NvmlError as exc:
                failures += 1
                if exc.code == NvmlCode.GPU_IS_LOST:
                    log.warning("waiting for GPU events: a GPU is lost")
                if failures >= _MAX_WAIT_FAILURES:
                    self.error = f"NVML event wait keeps failing ({exc}); polling the kernel log instead"
                    log.warning("%s", self.error)
                    return True
                self._stop.wait(self.wait_ms / 1000)
                continue
            failures = 0
            if event is not None and event.event_type & EVENT_TYPE_XID_CRITICAL:
                self.record(event.data, index=event.gpu_index, uuid=event.uuid)
        return False

    def _poll_loop(self) -> None:
        if self.kernel_log is None:
            self.mode = "off"
            self._ready.set()
            return
        source = KernelLog(self.kernel_log)
        try:
            source.open()
        except OSError as exc:
            self.mode = "off"
            self.error = f"no XID events from NVML and the kernel log is unreadable: {exc}"
            self._ready.set()
            return
        self.mode = "polling"
        self._ready.set()
        try:
            while not self._stop.is_set():
                for line in source.read_new():
                    parsed = parse_xid_line(line)
                    if parsed is not None:
                        key, xid = parsed
                        self.record(xid, index=self._by_pci.get(key))
                self._stop.wait(self.poll_interval_s)
        finally:
            source.close()
