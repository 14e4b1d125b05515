"""The node's checkpointer: starts and supervises workloads, checkpoints them with CRIU into the
store, reports their exits, serves their logs, and keeps the node's record fresh.

Workloads run under a per-job shim (ferry.criu.shim) that outlives this service, so killing and
restarting the checkpointer loses nothing: exit codes wait on disk until they are reported.
"""

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.msg import Msg

from ferry.checkpointer.live import LiveSource
from ferry.common import wire
from ferry.common.bus import CasConflict
from ferry.common.cluster import NodeSpec
from ferry.common.errors import FerryError
from ferry.common.models import TERMINAL_STATES, CheckpointRecord, Node, NodeState
from ferry.common.service import service_main
from ferry.common.tracing import tracer
from ferry.criu.errors import CriuError, DumpFailed, LaunchFailed
from ferry.criu.images import find_page_maps
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import launch
from ferry.criu.lazy_common import ensure_pipe_limits
from ferry.criu.runner import CriuRunner, DumpResult, kill_tree
from ferry.gpu.compat import snapshot_of
from ferry.gpu.cuda_checkpoint import (
    CudaCheckpointer,
    cuda_processes,
    default_checkpointer,
    resume_after_dump,
    suspend_for_dump,
)
from ferry.gpu.errors import GpuError
from ferry.gpu.models import GpuDumpStats, GpuInfo, GpuReport
from ferry.gpu.monitor import GpuMonitor
from ferry.gpu.nvml import RealNvml
from ferry.gpu.xid import XidWatcher
from ferry.node.base import (
    LOGS_DIR,
    META_FILE,
    NODE_ACK_WAIT_S,
    NodeService,
    kernel_release,
    read_meminfo_bytes,
    snapshot_logs,
    workload_env,
)
from ferry.node.interruptions import AwsImds, AzureScheduledEvents, GcpMetadata, NoticeSource, watch
from ferry.node.procs import alive, signal_tree, wait_for_dumps_of
from ferry.node.space import space_problem, tree_rss
from ferry.store.errors import StoreError
from ferry.store.local import LocalBackend
from ferry.store.manifest import manifest_key
from ferry.store.store import CheckpointStore

log = logging.getLogger(__name__)
_tracer = tracer("checkpointer")
ORPHAN_DUMP_WAIT_S = 120.0  # a 4 GiB dump takes about 10 s here



class Checkpointer(LiveSource, NodeService):
    """Runs, supervises and checkpoints the workloads of one node."""

    name = "checkpointer"

    async def start(self) -> None:
        await super().start()
        self.criu = CriuRunner(self.settings.criu_bin)
        # post-copy (live moves) needs bigger pipes than the kernel's default allows
        self.lazy_pages_problem = (await asyncio.to_thread(ensure_pipe_limits) if self.settings.postcopy
                                   else "post-copy is turned off here (FERRY_POSTCOPY=0)")
        self.criu_status = await asyncio.to_thread(self.criu.check)
        self.recover_live_moves()
        await self.recover_interrupted_stops()
        if not self.criu_status.ok:
            log.error("CRIU is not usable on this node: %s", self.criu_status.error)
        self.spec = self.settings.node_spec or NodeSpec(id=self.node_id, cpus=os.cpu_count() or 1,
                                                        memory=read_meminfo_bytes() or 1)
        self.notice_deadline: float | None = None
        self.gpu_monitor = self.make_gpu_monitor()
        await asyncio.to_thread(self.gpu_monitor.start)
        self.gpu_report = GpuReport()
        await self.beat()

    async def run(self) -> None:
        assert self.bus is not None
        await self.bus.subscribe(wire.logs_subject(self.node_id), self.on_logs)
        await asyncio.gather(
            self.collect_garbage("a start (a crash may have left chunks of an unfinished checkpoint)"),
            self.bus.consume(stream=wire.CMD_STREAM, durable=f"checkpointer-{self.node_id}",
                             subject=wire.node_cmd_subject(self.node_id, "checkpointer"),
                             handler=self.on_command, concurrency=4, ack_wait=NODE_ACK_WAIT_S, stop=self.stopping,
                             drain_s=self.settings.drain_timeout_s),
            self.heartbeat_loop(),
            self.exit_watch_loop(),
            self.notice_loop(),
        )

    async def recover_interrupted_stops(self) -> None:
        """After a restart: a `checkpoint --stop` (or the source half of a cold move) whose service
        died between CRIU's dump, which leaves the tree stopped, and the commit must not leave the job
        stopped forever. Its stop marker, written before the dump, names the checkpoint: committed,
        the stop is finished (the tree is killed, its exit reported as the checkpoint's); not
        committed, the tree runs on. The redelivered command then does what was asked."""
        for d in sorted(self.jobs_dir.iterdir()):
            jd = JobDir(d)
            shim = jd.read_shim()
            if shim is None or jd.read_exit() is not None or self.live_marker(jd) is not None:
                continue
            marker = jd.path / f"stop-{shim.incarnation}"
            if not marker.exists():
                continue
            # a CRIU its predecessor started may still be dumping the tree: let it end first
            if not await asyncio.to_thread(wait_for_dumps_of, shim.pid, ORPHAN_DUMP_WAIT_S):
                log.error("%s: a CRIU dump begun before the restart still runs after %.0fs", d.name,
                          ORPHAN_DUMP_WAIT_S)
            checkpoint = marker.read_text().strip()
            committed = bool(checkpoint) and await asyncio.to_thread(self._committed, d.name, checkpoint)
            if not alive(shim.pid):
                continue
            if committed:
                log.warning("%s: checkpoint %s committed before a restart; finishing the stop", d.name, checkpoint)
                signal_tree(shim.pid, signal.SIGKILL)
            else:
                log.warning("%s: its stop checkpoint %s did not commit before a restart; it runs on",
                            d.name, checkpoint or "-")
                signal_tree(shim.pid, signal.SIGCONT)
                marker.unlink(missing_ok=True)

    def space_problem(self, pid: int) -> str | None:
        """Why a checkpoint of the tree of `pid` would not fit here (ferry.node.space), or None."""
        places = {"scratch folder": self.scratch_dir}
        if isinstance(self.store.backend, LocalBackend):
            places["store"] = self.store.backend.root
        return space_problem(tree_rss(pid), places, int(self.settings.disk_reserve))

    def _committed(self, job_id: str, checkpoint: str) -> bool:
        try:
            return self.store.read_manifest(job_id, checkpoint) is not None
        except StoreError:
            return False

    # ---- node record -----------------------------------------------------------------------

    def running_jobs(self) -> dict[str, ShimInfo]:
        """The jobs whose workload runs on this node now, with their shims' records."""
        out = {}
        for d in sorted(self.jobs_dir.iterdir()):
            jd = JobDir(d)
            shim = jd.read_shim()
            if shim and jd.read_exit() is None and alive(shim.pid):
                out[d.name] = shim
        return out

    def make_gpu_monitor(self) -> GpuMonitor:
        """NVML through nvidia-ml-py; a node without the driver simply has no GPUs."""
        nvml = RealNvml()
        return GpuMonitor(nvml, watcher=XidWatcher(nvml))

    def gpus(self) -> list[GpuInfo]:
        """The node's GPUs: NVML's, or the cluster file's simulated ones where NVML has none."""
        real = self.gpu_report.inventory.gpus
        if real or not self.spec.gpus:
            return real
        return [GpuInfo(index=i, uuid=f"GPU-sim-{self.node_id}-{i}", model=self.spec.gpu_model,
                        memory_total=self.spec.gpu_memory) for i in range(self.spec.gpus)]

    async def beat(self, local: dict[str, ShimInfo] | None = None) -> None:
        """Writes this node's record (compare-and-set: the scheduler and health write its state too).
        `local`: the running jobs, when the caller has just read them."""
        assert self.bus is not None
        if local is None:
            local = self.running_jobs()
        try:
            self.gpu_report = await asyncio.to_thread(self.gpu_monitor.sample)
        except Exception as exc:  # the monitor reports driver trouble itself; anything else is a bug to log
            log.warning("GPU sample failed: %s", exc)
        st, spec, gpus, inv = self.criu_status, self.spec, self.gpus(), self.gpu_report.inventory
        node = Node(id=self.node_id, state=NodeState.READY, criu_ok=st.ok, criu_version=st.version,
                    criu_error=st.error, lazy_pages=st.lazy_pages and not self.lazy_pages_problem,
                    lazy_pages_error=self.lazy_pages_error(), cpus=spec.cpus, memory_bytes=spec.memory,
                    gpus=len(gpus), labels=spec.labels(), price_per_hour=spec.price_per_hour, spot=spec.spot,
                    jobs=list(local), address=str(self.work_dir), notice_deadline=self.notice_deadline,
                    gpu_list=[g.model_dump() for g in gpus], gpu_driver=inv.driver_version, gpu_error=inv.error,
                    gpu_conditions=[f"{c.kind} on GPU {c.gpu_index if c.gpu_index is not None else '-'}: {c.detail}"
                                    for c in self.gpu_report.conditions])
        found = await self.bus.nodes.get_rev(self.node_id)
        if found is None:
            with contextlib.suppress(CasConflict):
                await self.bus.nodes.create(self.node_id, node)
            return
        old, rev = found
        node.started, node.preemptions = old.started, old.preemptions
        if old.state in (NodeState.DRAINING, NodeState.PREEMPTING):
            node.state = old.state
        if self.notice_deadline is not None:
            node.state = NodeState.PREEMPTING
        with contextlib.suppress(CasConflict):  # someone else wrote it meanwhile: next beat
            await self.bus.nodes.update(self.node_id, node, rev)

    def lazy_pages_error(self) -> str | None:
        st = self.criu_status
        if not st.ok:
            return st.error
        if self.lazy_pages_problem:
            return self.lazy_pages_problem
        if not st.lazy_pages:
            return "`criu check --feature uffd-noncoop` fails: this kernel cannot serve memory lazily"
        return None

    async def heartbeat_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                local = self.running_jobs()  # read once for both
                await self.beat(local)
                await self.fence(local)
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.heartbeat_interval_s)

    async def fence(self, local: dict[str, ShimInfo]) -> None:
        """Kills local copies the scheduler no longer counts on (the job moved on while this node
        was cut off, say), so that a job never runs twice."""
        assert self.bus is not None
        for job_id, shim in local.items():
            job = await self.bus.jobs.get(job_id)
            if job is None or self.in_live_move(job, JobDir(self.jobs_dir / job_id)):
                continue  # a live move's frozen source waits for the target's last page
            # the incarnation is the fencing token: any start elsewhere bumped it
            if job.state in TERMINAL_STATES or job.incarnation != shim.incarnation:
                log.warning("killing stale copy of %s (incarnation %s; the job is at %s/%s)", job.name,
                            shim.incarnation, job.node, job.incarnation)
                await kill_tree(shim.pid, 0)

    # ---- interruption notices --------------------------------------------------------------

    def notice_sources(self) -> list[NoticeSource]:
        kinds: dict[str, type[AwsImds] | type[GcpMetadata] | type[AzureScheduledEvents]] = {
            "aws": AwsImds, "gcp": GcpMetadata, "azure": AzureScheduledEvents}
        return [kinds[provider](url) for provider, url in self.settings.interruption_sources.items()]

    async def notice_loop(self) -> None:
        sources = self.notice_sources()
        if not sources:
            return
        async for notice in watch(sources, self.settings.notice_poll_s, stop=self.stopping):
            if notice.kind != "interruption":
                log.info("rebalance recommendation from %s: %s", notice.provider, notice.detail)
                continue
            log.warning("interruption notice from %s: node goes away at %.0f", notice.provider, notice.deadline)
            self.notice_deadline = notice.deadline
            await self.report(wire.NodeEvent(kind="notice", node=self.node_id, job="-", incarnation=0,
                                             deadline=notice.deadline, error=notice.detail,
                                             id=f"notice-{self.node_id}-{int(notice.deadline)}"))
            with contextlib.suppress(Exception):
                await self.beat()

    # ---- exits -----------------------------------------------------------------------------

    async def exit_watch_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                await self.report_exits()
            except Exception:
                log.exception("exit watch failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.25)

    async def report_exits(self) -> None:
        for d in sorted(self.jobs_dir.iterdir()):
            jd = JobDir(d)
            ex = jd.read_exit()
            if ex is None:
                continue
            marker = d / f"reported-{ex.incarnation}"
            if marker.exists():
                continue
            by_ckpt = (d / f"stop-{ex.incarnation}").exists()
            await self.report(wire.NodeEvent(kind="exited", node=self.node_id, job=d.name,
                                             incarnation=ex.incarnation, exit_code=ex.code, signal=ex.signal,
                                             by_checkpoint=by_ckpt, id=f"exit-{d.name}-{ex.incarnation}"))
            marker.touch()

    # ---- logs ------------------------------------------------------------------------------

    async def on_logs(self, msg: Msg) -> None:
        try:
            req = wire.decode(wire.LogRequest, msg.data)
            jd = self.job_dir(req.job)
            path = jd.stdout if req.stream == "stdout" else jd.stderr
            data = await asyncio.to_thread(_read_at, path, req.offset, req.max_bytes)
            reply = wire.LogReply(data_hex=data.hex(), offset=req.offset + len(data))
        except (FerryError, OSError) as exc:
            reply = wire.LogReply(error=str(exc))
        await msg.respond(wire.encode(reply))

    # ---- commands --------------------------------------------------------------------------

    def handlers(self) -> dict[str, Callable[[wire.NodeCommand], Awaitable[None]]]:
        return {"launch": self.launch, "kill": self.kill, "checkpoint": self.checkpoint,
                "live_freeze": self.live_freeze, "live_end": self.live_end, "live_resume": self.live_resume}

    async def launch(self, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        shim = jd.read_shim()
        if shim is not None and shim.incarnation == cmd.incarnation:
            if jd.read_exit() is None:  # launched before a restart of this service: just confirm
                await self.report(wire.NodeEvent(kind="started", node=self.node_id, job=job.id,
                                                 incarnation=cmd.incarnation, op=cmd.op, pid=shim.pid))
            return
        jd.path.mkdir(parents=True, exist_ok=True)
        jd.clear_run_state()
        for f in (jd.stdout, jd.stderr):
            f.write_bytes(b"")
        env = workload_env(job.env)
        if job.gpu_uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpu_uuids)
        try:
            info = await launch(jd, job.argv, cwd=job.cwd, env=env, incarnation=cmd.incarnation)
        except LaunchFailed as exc:
            await self.report(wire.NodeEvent(kind="launch_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, error=str(exc)))
            return
        await self.report(wire.NodeEvent(kind="started", node=self.node_id, job=job.id,
                                         incarnation=cmd.incarnation, op=cmd.op, pid=info.pid))

    async def kill(self, cmd: wire.NodeCommand) -> None:
        jd = self.job_dir(cmd.job.id)
        shim = jd.read_shim()
        if shim is None or shim.incarnation != cmd.incarnation or jd.read_exit() is not None:
            return  # not running here: the exit watcher reports (or has reported) how it ended
        if alive(shim.pid):
            await kill_tree(shim.pid, cmd.grace_s)

    async def checkpoint(self, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        assert cmd.checkpoint
        record = CheckpointRecord(id=cmd.checkpoint, job=job.id, job_name=job.name, parent=cmd.parent,
                                  node=self.node_id, criu_version=self.criu_status.version or "",
                                  kernel=kernel_release(), final=cmd.stop, incarnation=cmd.incarnation)
        try:
            existing = await asyncio.to_thread(self.store.read_manifest, job.id, cmd.checkpoint)
        except StoreError:
            existing = None
        if existing is not None:  # committed before a restart of this service: report it again
            record = CheckpointRecord.model_validate(existing.meta.get("record", record.model_dump()))
            await self.report(wire.NodeEvent(kind="checkpoint_committed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, checkpoint=record))
            return
        shim = jd.read_shim()
        if shim is None or shim.incarnation != cmd.incarnation or jd.read_exit() is not None or not alive(shim.pid):
            record.state, record.error = "failed", f"job {job.name} is not running on {self.node_id}"
            await self.report(wire.NodeEvent(kind="checkpoint_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, checkpoint=record))
            return
        if (problem := await asyncio.to_thread(self.space_problem, shim.pid)) is not None:
            record.state, record.error = "failed", problem  # refused before anything froze the job
            log.warning("checkpoint %s of %s refused: %s", cmd.checkpoint, job.name, problem)
            await self.report(wire.NodeEvent(kind="checkpoint_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, checkpoint=record))
            return
        images = self.scratch_dir / f"{job.id}-{cmd.checkpoint}"
        shutil.rmtree(images, ignore_errors=True)
        images.mkdir(parents=True)
        stop_marker = jd.path / f"stop-{cmd.incarnation}"
        t0 = time.monotonic()
        try:
            await self._dump_and_upload(cmd, jd, shim.pid, images, record, stop_marker)
        except (CriuError, StoreError, GpuError, OSError) as exc:
            if cmd.stop:
                signal_tree(shim.pid, signal.SIGCONT)  # left stopped by the dump: let it run on
                stop_marker.unlink(missing_ok=True)
            record.state, record.error = "failed", str(exc)
            record.log_excerpt = list(getattr(exc, "log_excerpt", []) or [])
            if record.log_excerpt:
                record.error = f"{exc} | CRIU log: " + " / ".join(record.log_excerpt[-5:])
            record.total_ms = (time.monotonic() - t0) * 1000
            log.warning("checkpoint %s of %s failed: %s", cmd.checkpoint, job.name, record.error)
            await self.report(wire.NodeEvent(kind="checkpoint_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, checkpoint=record))
            await self.collect_garbage(f"checkpoint {cmd.checkpoint} of {job.name} failed")
        else:
            record.total_ms = (time.monotonic() - t0) * 1000
            deleted = await self.apply_retention(job.id)
            await self.report(wire.NodeEvent(kind="checkpoint_committed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, checkpoint=record,
                                             deleted_checkpoints=deleted))
        finally:
            shutil.rmtree(images, ignore_errors=True)

    async def collect_garbage(self, why: str) -> None:
        """Deletes the chunks no checkpoint uses: those a failed or crashed write left behind. Safe
        beside other writers (gc waits for them, see ferry.store.gc); a failure is only logged."""
        try:
            result = await asyncio.to_thread(self.store.gc)
        except (StoreError, OSError) as exc:
            log.warning("gc after %s failed: %s", why, exc)
            return
        if result.chunks_deleted or result.quarantined_deleted:
            log.info("gc after %s: %d orphaned chunk(s), %d bytes, %d quarantined", why, result.chunks_deleted,
                     result.bytes_freed, result.quarantined_deleted)

    async def apply_retention(self, job_id: str) -> list[str]:
        """Keeps the newest FERRY_KEEP_CHECKPOINTS checkpoints of a job (0: all); returns the rest,
        deleted. A failure here never fails the checkpoint that was just committed."""
        if not self.settings.keep_checkpoints:
            return []
        try:
            return await asyncio.to_thread(_retain, self.store, job_id, self.settings.keep_checkpoints)
        except (StoreError, OSError) as exc:
            log.warning("retention for %s failed: %s", job_id, exc)
            return []

    async def _dump_and_upload(self, cmd: wire.NodeCommand, jd: JobDir, pid: int, images: Path,
                               record: CheckpointRecord, stop_marker: Path) -> None:
        job = cmd.job
        assert cmd.checkpoint
        if cmd.options.fails_at("round"):  # fault injection (tests): a pre-copy round's dump fails
            raise DumpFailed(f"injected failure during the pre-copy round {cmd.checkpoint}")
        if cmd.stop:  # durably, before anything freezes the job (recover_interrupted_stops reads it)
            stop_marker.write_text(cmd.checkpoint)
        gpu: tuple[CudaCheckpointer, GpuDumpStats] | None = None
        cuda_pids: list[int] = await asyncio.to_thread(cuda_processes, pid) if job.gpu_uuids else []
        if cuda_pids:
            # The CUDA driver moves the job's device memory into its host memory, where CRIU sees it.
            with _tracer.start_as_current_span("cuda.suspend"):
                ckpt = default_checkpointer()
                gpu = ckpt, await suspend_for_dump(pid, ckpt, nvml=self.gpu_monitor.nvml)
        try:
            with _tracer.start_as_current_span("criu.dump") as span:
                # A final checkpoint leaves the tree stopped, not killed, until the upload committed:
                # if the upload fails the job simply continues.
                dump = await self.criu.dump(pid, images, leave_running=not cmd.stop,
                                            record_sizes=[jd.stdout, jd.stderr],
                                            extra_args=["--leave-stopped"] if cmd.stop else [])
                span.set_attribute("ferry.dump_ms", dump.wall_ms)
        except CriuError:
            if gpu is not None:  # CRIU resumed the tree: give it its GPU state back
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            raise
        if gpu is not None:
            if not cmd.stop:
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            stats = gpu[1]
            record.gpu_bytes, record.gpu_lock_ms, record.gpu_checkpoint_ms = (
                stats.gpu_bytes, stats.lock_ms, stats.checkpoint_ms)
        try:
            await self._upload(cmd, jd, pid, images, record, dump, gpu is not None)
        except (StoreError, OSError):
            if cmd.stop and gpu is not None:  # the job goes on: running again, then its GPU state back
                signal_tree(pid, signal.SIGCONT)
                await resume_after_dump(pid, gpu[0], pids=gpu[1].pids)
            raise

    async def _upload(self, cmd: wire.NodeCommand, jd: JobDir, pid: int, images: Path, record: CheckpointRecord,
                      dump: DumpResult, uses_gpu: bool) -> None:
        job = cmd.job
        assert cmd.checkpoint
        await asyncio.to_thread(snapshot_logs, jd, images / LOGS_DIR, dump.file_sizes)
        meta: dict[str, object] = {
            "job": job.id, "name": job.name, "checkpoint": cmd.checkpoint, "incarnation": cmd.incarnation,
            "argv": job.argv, "node": self.node_id,
            # what the restore hands each output file to CRIU under (ferry.criu.external)
            "stdout_path": dump.file_keys.get(str(jd.stdout), str(jd.stdout)),
            "stderr_path": dump.file_keys.get(str(jd.stderr), str(jd.stderr))}
        if uses_gpu:  # what a restore target must match
            used = [g for g in self.gpus() if g.uuid in job.gpu_uuids]
            meta["gpu"] = snapshot_of(used, self.gpu_report.inventory.driver_version or "").model_dump()
        (images / META_FILE).write_text(json.dumps(meta))
        page_maps = await asyncio.to_thread(find_page_maps, images)
        record.dump_ms = dump.wall_ms
        record.freeze_ms = dump.frozen_ms if dump.frozen_ms is not None else dump.wall_ms
        record.manifest_key = manifest_key(job.id, cmd.checkpoint)
        progress = self.progress_reporter(cmd.op, "upload")
        with _tracer.start_as_current_span("store.upload") as span:
            t0 = time.monotonic()
            # The manifest carries the record so that a restarted checkpointer can report it again.
            preview = record.model_copy()
            result = await asyncio.to_thread(
                self.store.write_checkpoint, job=job.id, checkpoint=cmd.checkpoint, parent=cmd.parent,
                src_dir=images, page_maps=page_maps, meta={**meta, "record": preview.model_dump()},
                progress=progress, verify_all=cmd.stop)  # the job is killed once a final one commits
            record.upload_ms = (time.monotonic() - t0) * 1000
            span.set_attribute("ferry.bytes_uploaded", result.bytes_uploaded)
        record.bytes_logical = result.bytes_logical
        record.bytes_stored = result.bytes_stored
        record.bytes_uploaded = result.bytes_uploaded
        if cmd.stop:
            signal_tree(pid, signal.SIGKILL)


def _retain(store: CheckpointStore, job: str, keep: int) -> list[str]:
    """The retention policy, then garbage collection of the chunks no checkpoint uses any more."""
    deleted = store.apply_retention(job, keep)
    if deleted:
        result = store.gc()
        log.info("retention removed %d checkpoint(s) of %s; gc freed %d bytes", len(deleted), job, result.bytes_freed)
    return deleted


def _read_at(path: Path, offset: int, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    except FileNotFoundError:
        return b""


def main() -> None:
    service_main(Checkpointer, node=True)


if __name__ == "__main__":
    main()
