"""The node agent (the "checkpointer" service): starts and supervises workloads, reports their
exits, serves their logs, fences stale copies, keeps the node's record fresh, watches for cloud
interruption notices, and runs the checkpoint pipeline (``ferry.checkpointer.pipeline``) and the
source half of live moves (``ferry.checkpointer.live``).

Workloads run under a per-job shim (ferry.criu.shim) that outlives this service, so killing and
restarting the checkpointer loses nothing: exit codes wait on disk until they are reported.
"""

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
from nats.aio.msg import Msg

from ferry.checkpointer.exits import MonitorWatch
from ferry.checkpointer.gang import GangMember
from ferry.checkpointer.hold import JobHolds, Lease
from ferry.checkpointer.live import LiveSource
from ferry.checkpointer.pipeline import CheckpointPipeline
from ferry.checkpointer.settled import SettledDirs
from ferry.common import wire
from ferry.common.bus import CasConflict
from ferry.common.cluster import NodeSpec
from ferry.common.errors import ConfigError, FerryError, UsageError
from ferry.common.mirror import Mirror
from ferry.common.models import BUSY_STATES, TERMINAL_STATES, Job, JobState, Node, NodeState
from ferry.common.sealing import SealError, open_env, read_key
from ferry.common.service import service_main
from ferry.criu.container import prepare_bundle
from ferry.criu.errors import LaunchFailed
from ferry.criu.jobdir import JobDir, ShimInfo
from ferry.criu.launch import adopt, launch
from ferry.criu.lazy_common import ensure_pipe_limits
from ferry.criu.runner import CriuRunner
from ferry.criu.treekill import kill_tree
from ferry.criu.zygote import ZygoteProcess
from ferry.gpu.models import GpuInfo, GpuReport
from ferry.gpu.monitor import GpuMonitor
from ferry.gpu.nvml import Nvml, RealNvml
from ferry.gpu.xid import XidWatcher
from ferry.node.adopt import adopt_problem
from ferry.node.base import (
    NODE_ACK_WAIT_S,
    NodeService,
    hidden_from_jobs,
    read_meminfo_bytes,
    workload_env,
)
from ferry.node.bridge import NodeNetwork, job_link, port_taken
from ferry.node.interruptions import AwsImds, AzureScheduledEvents, GcpMetadata, NoticeSource, close_client, watch
from ferry.node.procs import alive
from ferry.node.usage import UsageSampler, nvml_gpu_use
from ferry.policy.netplan import node_net_state
from ferry.store.errors import ObjectNotFound
from ferry.store.manifest import DEFAULT_TENANT
from ferry.store.retention import awaiting_expiry, awaiting_expiry_on, expiring
from ferry.store.store import CheckpointStore

log = logging.getLogger(__name__)
_ON_NODE = frozenset({JobState.RUNNING, *BUSY_STATES})  # a job whose monitor runs on its node
EXIT_SWEEP_S = 2.0  # the look at every job folder that the monitors' pidfds leave (ferry.checkpointer.exits)
EXPIRY_RETRY_S = 60.0  # after the store refused to delete an ended job's checkpoints
# a pass over every job follows a burst of changes this long after it began (not one per change)
EXPIRY_SETTLE_S = 2.0  # the checkpoints of ended jobs: days of keeping, seconds do not matter
JOBNET_SETTLE_S = 0.05  # routes to new bridge-network jobs: soon
# a pass that failed is tried again after 0.5 s, doubling to 8 s, until one succeeds: a job moved
# while its routes could not be written must not wait for the next record change (the other
# nodes' heartbeats are such changes, but a node alone, or with peers that beat rarely, has few)
JOBNET_RETRY_S = (0.5, 8.0)


class Checkpointer(GangMember, LiveSource, NodeService):
    """The node agent: runs, supervises and checkpoints the workloads of one node."""

    name = "checkpointer"

    async def start(self) -> None:
        await super().start()
        self.settled = SettledDirs(self.jobs_dir)  # the folders of jobs that ended: skipped by the scans
        self.monitors = MonitorWatch()  # the running jobs' monitors: their ends wake the exit reports
        self.criu = CriuRunner(self.settings.criu_bin)
        self.zygote_proc = ZygoteProcess(self.zygote.path)
        try:
            self.zygote_proc.start()  # from this thread: the zygote ends when the thread that started it does
        except OSError as exc:  # launches still work, each with an interpreter of its own
            log.warning("%s; jobs start without it", exc)
        # post-copy (live moves) needs bigger pipes than the kernel's default allows
        self.lazy_pages_problem = (await asyncio.to_thread(ensure_pipe_limits) if self.settings.postcopy
                                   else "post-copy is turned off here (FERRY_POSTCOPY=0)")
        self.criu_status = await asyncio.to_thread(self.criu.check)
        self.pipeline = CheckpointPipeline(self, self.criu, self.criu_status.version or "")
        self.recover_live_moves()
        # the node's lease on its jobs: each beat that lands renews it (ferry.checkpointer.hold)
        lease = Lease(self.settings.heartbeat_timeout_s, self.settings.heartbeat_interval_s)
        self.holds = JobHolds(self.work_dir, lease)
        await self.pipeline.recover_interrupted_stops()
        if not self.criu_status.ok:
            log.error("CRIU is not usable on this node: %s", self.criu_status.error)
        self.spec = self.settings.node_spec or NodeSpec(id=self.node_id, cpus=os.cpu_count() or 1,
                                                        memory=read_meminfo_bytes() or 1)
        self.notice_deadline: float | None = None
        self.gpu_monitor = self.make_gpu_monitor()
        await asyncio.to_thread(self.gpu_monitor.start)
        self.gpu_report = GpuReport()
        self.usage = UsageSampler()
        self.jobs_seen: Mirror[Job] | None = None  # the jobs as run() follows them (their tenants)
        self.waiting: set[asyncio.Event] = set()  # what the loops in until_change wait on
        # the folders every launch hides from its workload: its settings' paths, resolved once
        self.hidden = hidden_from_jobs(self.settings, self.scratch_dir)
        self.jobnet = NodeNetwork(self.settings.job_network, self.settings.node_netns)
        self.net_error = await asyncio.to_thread(self.jobnet.ensure)
        if self.net_error:
            log.warning("no bridge network for jobs on this node: %s", self.net_error)
        await self.beat()

    async def run(self) -> None:
        assert self.bus is not None
        await self.bus.subscribe(wire.logs_subject(self.node_id), self.on_logs)
        # what the job network (the jobs that have not ended) and the expiry of ended jobs (those
        # waiting for it) follow: a pass reads those, not every job that ever ran (the passes ran
        # every 50 ms in a burst of submits, over all of them)
        jobs = Mirror(self.bus.jobs, live=lambda j: not j.terminal, tokens=awaiting_expiry)
        await jobs.start()
        self.jobs_seen = jobs
        await self.recover_gang_locks([JobDir(d) for d in sorted(self.jobs_dir.iterdir())],
                                      {j.id: j for j in jobs.values()})
        try:
            await asyncio.gather(
                self.pipeline.collect_garbage("a start (a crash may have left chunks of an unfinished checkpoint)"),
                self.bus.consume(stream=wire.CMD_STREAM, durable=f"checkpointer-{self.node_id}",
                                 subject=wire.node_cmd_subject(self.node_id, "checkpointer"),
                                 handler=self.on_command, concurrency=4, ack_wait=NODE_ACK_WAIT_S,
                                 stop=self.stopping, drain_s=self.settings.drain_timeout_s),
                self.heartbeat_loop(),
                self.exit_watch_loop(),
                self.notice_loop(),
                self.jobnet_loop(jobs),
                self.expiry_loop(jobs),
                self.wake_on_stop(),
            )
        finally:
            await jobs.close()

    async def until_change(self, changed: asyncio.Event, timeout: float | None = None, settle_s: float = 0.0) -> None:
        """Returns when `changed` is set, the service stops, or `timeout` seconds passed; after a
        change, `settle_s` later, so that a burst of changes (a thousand submits) costs one pass
        over every job, not one per change. The stop sets `changed` (``wake_on_stop``): waiting
        on one event makes no task (three loops wake here for every change of a job record)."""
        if self.stopping.is_set():
            return
        self.waiting.add(changed)
        try:
            async with asyncio.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            return
        finally:
            self.waiting.discard(changed)
        if settle_s > 0 and not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settle_s):
                    await self.stopping.wait()

    async def wake_on_stop(self) -> None:
        """Wakes every loop waiting in ``until_change`` when the service stops."""
        await self.stopping.wait()
        for changed in list(self.waiting):
            changed.set()

    async def expiry_loop(self, jobs: Mirror[Job]) -> None:
        """Deletes the checkpoints of the jobs that ended on this node `keep_ended_s` ago
        (``ferry.store.retention.expiring``), woken by the jobs' changes and when the next is due."""
        keep = self.settings.keep_ended_s
        if keep <= 0:
            return
        changed = jobs.listen()
        done: dict[str, float] = {}  # job id -> the record's update that was expired (until the scheduler's write)
        while not self.stopping.is_set():
            changed.clear()
            waiting = jobs.holders(awaiting_expiry_on(self.node_id))  # read only: no copies
            due, next_at = expiring(waiting, self.node_id, keep, time.time())
            for job in due:
                if done.get(job.id) == job.updated or self.stopping.is_set():
                    continue
                if await self.pipeline.expire(job.clone()):
                    done[job.id] = job.updated
                else:  # the store refused: again in a while
                    retry = time.time() + EXPIRY_RETRY_S
                    next_at = retry if next_at is None else min(next_at, retry)
            done = {j.id: done[j.id] for j in due if j.id in done}
            await self.until_change(changed, None if next_at is None else max(0.0, next_at - time.time()),
                                    settle_s=min(EXPIRY_SETTLE_S, keep / 4))

    async def jobnet_loop(self, jobs: Mirror[Job]) -> None:
        """Follows the jobs and the nodes: this node's routes to the other nodes' bridge-network
        jobs and the forwards of its own jobs' published ports (``ferry.policy.netplan``)."""
        assert self.bus is not None
        if self.net_error:
            return
        changed = jobs.listen()
        nodes = Mirror(self.bus.nodes, changed=changed)
        await nodes.start()
        retry_s: float | None = None  # after a failed pass: the next one comes by itself, not only on a change
        try:
            while not self.stopping.is_set():
                changed.clear()
                state = node_net_state(self.node_id, jobs.live(), nodes.view())  # read only: no copies
                if state != self.jobnet.applied:
                    try:
                        await asyncio.to_thread(self.jobnet.apply, state)
                        retry_s = None
                    except OSError as exc:
                        retry_s = JOBNET_RETRY_S[0] if retry_s is None else min(retry_s * 2, JOBNET_RETRY_S[1])
                        log.warning("the job network's routes and forwards (again in %.1f s): %s", retry_s, exc)
                        self.jobnet.applied = None
                await self.until_change(changed, retry_s, settle_s=JOBNET_SETTLE_S)
        finally:
            await nodes.close()

    # ---- node record -----------------------------------------------------------------------

    def running_jobs(self) -> dict[str, ShimInfo]:
        """The jobs whose workload runs on this node now, with their shims' records."""
        out = {}
        for d in self.settled.unsettled():
            jd = JobDir(d, canonical=True)
            shim = jd.read_shim()
            if shim and jd.read_exit() is None and alive(shim.pid):
                out[d.name] = shim
        return out

    async def close(self) -> None:
        self.monitors.close()
        self.settled.close()
        if hasattr(self, "zygote_proc"):  # the jobs it forked go on: their monitors are detached
            await asyncio.to_thread(self.zygote_proc.stop)
        await close_client()  # the interruption watch's connections to the metadata endpoint
        await super().close()

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
        # NVML's GPUs: the jobs' GPU memory too (simulated GPUs have no processes to read)
        self.usage.gpu_use = nvml_gpu_use(self.nvml()) if self.gpu_report.inventory.gpus else None
        try:
            usage = await asyncio.to_thread(self.usage.sample, local)
        except Exception as exc:  # /proc read trouble: this beat goes without it
            log.warning("usage sample failed: %s", exc)
            usage = {}
        node = Node(id=self.node_id, state=NodeState.READY, criu_ok=st.ok, criu_version=st.version,
                    criu_error=st.error, lazy_pages=st.lazy_pages and not self.lazy_pages_problem,
                    lazy_pages_error=self.lazy_pages_error(), cpus=spec.cpus, memory_bytes=spec.memory,
                    gpus=len(gpus), labels=spec.labels(), price_per_hour=spec.price_per_hour, spot=spec.spot,
                    jobs=list(local), address=str(self.work_dir), notice_deadline=self.notice_deadline,
                    net_ip=None if self.net_error else (self.settings.net_ip or self.settings.node_ip),
                    net_error=self.net_error,
                    gpu_list=[g.model_dump() for g in gpus], gpu_driver=inv.driver_version, gpu_error=inv.error,
                    gpu_conditions=[f"{c.kind} on GPU {c.gpu_index if c.gpu_index is not None else '-'}: {c.detail}"
                                    for c in self.gpu_report.conditions],
                    usage=usage)
        found = await self.bus.nodes.get_rev(self.node_id)
        # stamped now, not when the record was built: the read retries for seconds while the bus
        # elects a leader, and a beat that arrives already old reads to health as silence
        node.heartbeat = time.time()
        if found is None:
            with contextlib.suppress(CasConflict):
                await self.bus.nodes.create(self.node_id, node)
                self.holds.lease.renew(node.heartbeat, False, time.time())
            return
        old, rev = found
        node.started, node.preemptions = old.started, old.preemptions
        if old.state in (NodeState.DRAINING, NodeState.PREEMPTING):
            node.state = old.state
        if self.notice_deadline is not None:
            node.state = NodeState.PREEMPTING
        with contextlib.suppress(CasConflict):  # someone else wrote it meanwhile: next beat
            await self.bus.nodes.update(self.node_id, node, rev)
            self.holds.lease.renew(node.heartbeat, old.state == NodeState.LOST, time.time())

    def gpu_driver_version(self) -> str:
        return self.gpu_report.inventory.driver_version or ""

    def nvml(self) -> Nvml:
        return self.gpu_monitor.nvml

    def in_any_live_move(self, jd: JobDir) -> bool:
        return self.live_marker(jd) is not None

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
                self.holds.grant(time.time(), before_fence=True)
                await self.fence(local)
                self.holds.grant(time.time())  # only now: the fence killed what moved on
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
            if job is None or self.in_live_move(job, JobDir(self.jobs_dir / job_id, canonical=True)):
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
        """Reports each job's exit when its monitor ends (``MonitorWatch``), looks at the folders
        of this node's jobs whose monitors it does not follow yet when the jobs change (a restore
        here), and at every folder each EXIT_SWEEP_S."""
        wake = self.monitors.woken
        if self.jobs_seen is not None:
            self.jobs_seen.listen(wake)
        swept = 0.0
        while not self.stopping.is_set():
            wake.clear()
            ended = self.monitors.take()
            try:
                if time.monotonic() - swept >= EXIT_SWEEP_S:
                    swept = time.monotonic()
                    await self.report_exits()
                else:
                    for name in sorted(ended | self.unfollowed()):
                        await self.report_exit(self.jobs_dir / name)
            except Exception:
                log.exception("exit watch failed")
            await self.until_change(wake, max(0.0, swept + EXIT_SWEEP_S - time.monotonic()), settle_s=0.02)

    def unfollowed(self) -> set[str]:
        """This node's running jobs whose monitors are not followed (restored here meanwhile)."""
        if self.jobs_seen is None:
            return set()
        return {j.id for j in self.jobs_seen.live()
                if j.node == self.node_id and j.state in _ON_NODE and not self.monitors.follows(j.id)}

    async def report_exits(self) -> None:
        for d in list(self.settled.unsettled()):
            await self.report_exit(d)

    async def report_exit(self, d: Path) -> None:
        """Reports the exit in job folder ``d`` once; follows its monitor while there is none."""
        jd = JobDir(d, canonical=True)
        ex = jd.read_exit()
        if ex is None:
            shim = jd.read_shim()
            if shim is not None and not self.monitors.follow(d.name, shim.shim_pid):
                ex = jd.read_exit()  # it ended before it was followed: its exit is written by now
            if ex is None:
                return
        marker = d / f"reported-{ex.incarnation}"
        if marker.exists():
            shim = jd.read_shim()
            if shim is None or shim.incarnation <= ex.incarnation:
                self.settled.settle(d)  # ended and reported: nothing to look at until it changes
            return
        by_ckpt = (d / f"stop-{ex.incarnation}").exists()
        if not by_ckpt:
            await self.keep_output(jd)
        await self.report(wire.NodeEvent(kind="exited", node=self.node_id, job=d.name,
                                         incarnation=ex.incarnation, exit_code=ex.code, signal=ex.signal,
                                         by_checkpoint=by_ckpt, id=f"exit-{d.name}-{ex.incarnation}"))
        marker.touch()

    def stored_output(self, req: wire.LogRequest) -> bytes:
        return _stored_output(self.store, req)

    async def keep_output(self, jd: JobDir) -> None:
        """An ended job's output goes to the store (``CheckpointStore.write_output``), so that it can
        be read when this node is gone (an autoscaler retired it). Best effort: the node keeps its copy."""
        job = self.jobs_seen.peek(jd.path.name) if self.jobs_seen is not None else None
        try:
            await asyncio.to_thread(self.store.write_output, job=jd.path.name,
                                    tenant=job.tenant if job is not None else DEFAULT_TENANT, src_dir=jd.path)
        except (FerryError, OSError) as exc:
            log.warning("the output of %s stays on this node only: %s", jd.path.name, exc)

    # ---- logs ------------------------------------------------------------------------------

    async def on_logs(self, msg: Msg) -> None:
        try:
            req = wire.decode(wire.LogRequest, msg.data)
            jd = self.job_dir(req.job)
            path = jd.stdout if req.stream == "stdout" else jd.stderr
            if req.stored or not path.exists():  # its node is gone, or it never ran here: what the store kept
                data = await asyncio.to_thread(self.stored_output, req)
            else:
                data = await asyncio.to_thread(_read_at, path, req.offset, req.max_bytes)
            reply = wire.LogReply(data_hex=data.hex(), offset=req.offset + len(data))
        except (FerryError, OSError) as exc:
            reply = wire.LogReply(error=str(exc))
        await msg.respond(wire.encode(reply))

    # ---- commands --------------------------------------------------------------------------

    def handlers(self) -> dict[str, Callable[[wire.NodeCommand], Awaitable[None]]]:
        return {"launch": self.launch, "kill": self.kill, "checkpoint": self.pipeline.checkpoint,
                "live_freeze": self.live_freeze, "live_end": self.live_end, "live_resume": self.live_resume,
                "gang_lock": self.gang_lock, "gang_release": self.gang_release}

    def env_key(self) -> bytes:
        """The private key that opens jobs' environments (read when a job needs it)."""
        return read_key(self.settings.resolved_env_key_file(public=False), private=True)

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
        if job.adopt_pid is not None:
            await self.adopt(cmd, jd)
            return
        try:
            env = workload_env(open_env(job.env, self.env_key(), job.tenant))
            if job.gpu_uuids:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpu_uuids)
            # a thread only for the ports it publishes (a listing of the node's sockets)
            taken = await asyncio.to_thread(port_taken, job, self.settings.node_netns) if job.publish else None
            if taken:
                raise UsageError(taken)
            if job.container:  # the job's own bundle; the container's environment is the image's plus --env
                await asyncio.to_thread(prepare_bundle, jd, bundle=job.bundle, image=job.image, argv=job.argv,
                                        env=open_env(job.env, self.env_key(), job.tenant))
            info = await launch(jd, job.argv, cwd=job.cwd, env=env, incarnation=cmd.incarnation,
                                hide=self.hidden, network=job.network.value,
                                link=job_link(job, self.settings.job_network, self.settings.node_netns),
                                container=job.container, here=job.name if job.here else None, zygote=self.zygote)
        except (LaunchFailed, SealError, ConfigError, UsageError, OSError, ValueError) as exc:
            await self.report(wire.NodeEvent(kind="launch_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, error=str(exc)))
            return
        await self.report(wire.NodeEvent(kind="started", node=self.node_id, job=job.id,
                                         incarnation=cmd.incarnation, op=cmd.op, pid=info.pid))
        if not self.monitors.follow(job.id, info.shim_pid):  # its end wakes the exit report
            self.monitors.ended(job.id)  # ended already: reported now

    async def adopt(self, cmd: wire.NodeCommand, jd: JobDir) -> None:
        """`ferry adopt`: watch a running process where it is (``ferry.node.adopt``)."""
        job = cmd.job
        assert job.adopt_pid is not None
        callers = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        ours = {os.getpid(), *(s.pid for s in self.running_jobs().values())}
        problem = await asyncio.to_thread(adopt_problem, job.adopt_pid, ours=ours, callers=callers)
        try:
            if problem is not None:
                raise LaunchFailed(problem)
            info = await adopt(jd, job.adopt_pid, incarnation=cmd.incarnation, zygote=self.zygote)
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


def _stored_output(store: CheckpointStore, req: wire.LogRequest) -> bytes:
    try:
        return store.read_output(req.job, req.stream, req.offset, req.max_bytes)
    except ObjectNotFound:
        return b""


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
