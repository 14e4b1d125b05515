"""What the node services (checkpointer, migrator) share: their work directory, the store, job
directories, progress reporting and event publishing."""

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import tenacity
from nats.aio.msg import Msg

from ferry.common import wire
from ferry.common.bus import keep_alive
from ferry.common.config import Settings
from ferry.common.errors import ConfigError
from ferry.common.service import Service
from ferry.common.tracing import extract, tracer
from ferry.criu.jobdir import JobDir
from ferry.criu.lazy_common import tls_args
from ferry.criu.zygote import ZygoteClient
from ferry.sim.faults import FaultHook
from ferry.store.url import open_store

log = logging.getLogger(__name__)

LOGS_DIR = "ferry-logs"
"""In a checkpoint's files: the job's stdout and stderr as they were when it was frozen."""
META_FILE = "ferry.json"
"""In a checkpoint's files: the job, its argv and where its output files were on the source node."""
NODE_ACK_WAIT_S = 12.0
"""A node command a dead service held goes to its successor after this long; handlers that work
longer tell JetStream so every third of it (keep_alive)."""
REPORT_FIRST_WAIT_S = 0.2  # after a report NATS did not take; then doubling, to 5 s

# Variables of the node service that a workload must not inherit.
_PRIVATE_ENV_PREFIXES = ("FERRY_", "NATS_", "OTEL_")


class NodeService(Service):
    """A service that runs on one node and owns that node's work directory."""

    async def start(self) -> None:
        if not self.settings.node_id:
            raise ConfigError("no node id: pass --node or set FERRY_NODE_ID")
        self.node_id = self.settings.node_id
        self.work_dir = self.settings.node_work_dir().resolve()
        self.jobs_dir = self.work_dir / "jobs"  # canonical: its job folders are named without lookups
        self.scratch_dir = scratch_dir(self.settings.scratch_dir, self.work_dir, self.node_id)
        for d in (self.jobs_dir, self.scratch_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.store = open_store(self.settings.resolved_store_url(), self.settings.resolved_store_key_file())
        self.job_locks: dict[str, asyncio.Lock] = {}
        self.faults = FaultHook()  # the one place fault points ask (tests, `ferry chaos fail-live`)
        # the shim's zygote, which the checkpointer runs (ferry.criu.zygote): launches and restores
        # fork from it; without it they start a new interpreter
        self.zygote = ZygoteClient(self.work_dir / "zygote.sock")
        await self.connect()

    async def on_command(self, msg: Msg) -> None:
        """Runs one node command: one at a time per job, in the trace of whoever sent it, telling
        JetStream it is still being worked on (a dump or restore can outlast the ack wait)."""
        cmd = wire.decode(wire.NodeCommand, msg.data)
        handler = self.handlers().get(cmd.kind)
        if handler is None:
            log.error("%s cannot %s; dropping the command", self.name, cmd.kind)
            return
        lock = self.job_locks.setdefault(cmd.job.id, asyncio.Lock())
        with tracer(self.name).start_as_current_span(f"{self.name}.{cmd.kind}", context=extract(msg.headers)) as span:
            span.set_attribute("ferry.job", cmd.job.id)
            span.set_attribute("ferry.node", self.node_id)
            span.set_attribute("ferry.checkpoint", cmd.checkpoint or "")
            alive_task = asyncio.create_task(keep_alive(msg, every=NODE_ACK_WAIT_S / 3))
            try:
                async with lock:
                    await handler(cmd)
            finally:
                alive_task.cancel()

    def handlers(self) -> dict[str, Callable[[wire.NodeCommand], Awaitable[None]]]:
        """The node commands this service carries out, by kind."""
        return {}

    def job_dir(self, job_id: str) -> JobDir:
        wire.token(job_id)
        return JobDir(self.jobs_dir / job_id, canonical=True)  # a token's folder in the resolved work dir

    async def report(self, event: wire.NodeEvent) -> None:
        """Publishes a node event; retried until NATS takes it (the scheduler must hear it)."""
        bus = self.bus
        assert bus is not None

        def log_retry(state: tenacity.RetryCallState) -> None:
            log.warning("cannot report %s yet: %s", event.kind, state.outcome.exception() if state.outcome else "")

        async def publish() -> None:
            await bus.publish(wire.node_event_subject(self.node_id, event.kind), event, msg_id=event.id)

        # the first try without tenacity, whose machinery cost more CPU than the publish itself
        try:
            await publish()
            return
        except Exception as exc:  # as tenacity would retry it
            log.warning("cannot report %s yet: %s", event.kind, exc)
        await asyncio.sleep(REPORT_FIRST_WAIT_S)
        # a draining service gives up once the waits reached their longest (about 10 s in all)
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=2 * REPORT_FIRST_WAIT_S, max=5.0), reraise=True,
            before_sleep=log_retry, stop=lambda state: self.stopping.is_set() and state.attempt_number > 5)
        await retrying(publish)

    def progress_reporter(self, op: str | None, phase: str) -> Callable[[int, int], None]:
        """A thread-safe callback(done, total) that publishes throttled progress for `op`."""
        if not op or self.bus is None:
            return lambda done, total: None
        loop = asyncio.get_running_loop()
        bus = self.bus
        last = [0.0]

        def report(done: int, total: int) -> None:
            t = time.monotonic()
            if t - last[0] < 0.1 and done < total:
                return
            last[0] = t
            msg = wire.Progress(op=op, phase=phase, done=done, total=total)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: loop.create_task(bus.publish_core(wire.progress_subject(op), msg)))

        return report


def scratch_dir(configured: str, work_dir: Path, node_id: str) -> Path:
    """Where CRIU images are written before upload and rebuilt before restore: FERRY_SCRATCH_DIR,
    else a directory in /dev/shm when that is a tmpfs (images in memory: dump and restore do not
    wait for a disk), else the node's work directory. Per cluster and node: the name carries a
    digest of the node's work directory, so two clusters on one host never share it."""
    own = f"{node_id}-{hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]}"
    if configured:
        return Path(configured) / own
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        if shm.is_dir() and any(line.split()[1:3] == ["/dev/shm", "tmpfs"]
                                for line in Path("/proc/mounts").read_text().splitlines()):
            return shm / "ferry" / own
    return work_dir / "scratch"


SHARED_FOLDERS = frozenset({"/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib64", "/mnt",
                            "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var",
                            "/var/lib", "/var/tmp"})
"""Folders that hold what workloads need too: never hidden, even where a secret file sits in one
(that file is then left to its own mode, and ``ferry up`` never puts one there)."""


def hidden_from_jobs(settings: Settings, scratch: Path) -> list[Path]:
    """The folders a workload on this node must not see (``ferry.criu.shim --hide``): the data
    dir (other jobs' output, a local store, NATS' files), the node's work and scratch folders (raw
    images: other jobs' memory), and each folder holding one of this node's credentials or keys
    (NATS user, TLS, store keyring, environment key, configuration). The most general of nested
    ones only; ``SHARED_FOLDERS`` never."""
    config = os.environ.get("FERRY_CONFIG")
    files = [settings.nats_creds, settings.nats_ca, settings.resolved_store_key_file(),
             settings.resolved_env_key_file(public=False), settings.tokens_file, settings.tls_cert, settings.tls_key,
             settings.tls_ca, settings.page_tls_cert, settings.page_tls_key, settings.page_tls_ca,
             Path(config) if config else None]
    scratch_root = scratch.parent if scratch.parent.name == "ferry" else scratch
    found = {Path(os.path.realpath(p)) for p in (settings.data_dir, settings.node_work_dir(), scratch_root)}
    found |= {Path(os.path.realpath(f)).parent for f in files if f is not None}
    kept = sorted(p for p in found if str(p) not in SHARED_FOLDERS)
    return [p for p in kept if not any(other != p and p.is_relative_to(other) for other in kept)]


def page_tls(settings: Settings) -> tuple[str, ...]:
    """CRIU's TLS flags for the page server of live moves (FERRY_PAGE_TLS_CERT/_KEY/_CA), or ()."""
    given = [settings.page_tls_cert, settings.page_tls_key, settings.page_tls_ca]
    if any(given) and not all(given):
        raise ConfigError("the page server's TLS needs FERRY_PAGE_TLS_CERT, FERRY_PAGE_TLS_KEY and "
                          "FERRY_PAGE_TLS_CA together")
    return tls_args(settings.page_tls_ca, settings.page_tls_cert, settings.page_tls_key)


def workload_env(job_env: dict[str, str]) -> dict[str, str]:
    """The environment a workload starts with: the node's, minus Ferry's own, plus the job's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV_PREFIXES)}
    base.update(job_env)
    return base


def kernel_release() -> str:
    return os.uname().release


def read_meminfo_bytes() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def snapshot_logs(jd: JobDir, dest: Path, sizes: dict[str, int]) -> None:
    """Copies the job's logs as they were when it was frozen (their sizes then, from the dump)."""
    dest.mkdir()
    for name, src in (("stdout", jd.stdout), ("stderr", jd.stderr)):
        size = sizes.get(str(src), src.stat().st_size)
        with open(src, "rb") as fin, open(dest / name, "wb") as fout:
            fout.write(fin.read(size))
