"""The target half of a live move, as a node command of the migrator.

    live_restore  fetch the frozen source's images (all but memory) from the store, restore them
                  at once with lazy pages from the source's page server, report ``restored``; then,
                  in the background, wait until every page is here and report ``live_local`` with
                  what was measured, or ``live_lost`` when the transfer failed (the copy here is
                  killed first, so the job never runs twice).

A migrator that died while a target's memory was still arriving left the daemon and the target
running; its successor takes them over (``adopt_orphans`` at start, or a redelivered
``live_restore``) and reports how the transfer ended, as the first would have.
"""

import asyncio
import logging
import shutil
import time
from pathlib import Path

from ferry.common import wire
from ferry.common.moves import LiveLocal, LiveRestored
from ferry.criu.errors import CriuError
from ferry.criu.jobdir import JobDir
from ferry.criu.lazy_common import PAGE_SIZE, LiveMoveFailed
from ferry.criu.lazy_record import OrphanTarget
from ferry.criu.lazy_target import LazyTarget
from ferry.criu.runner import job_criu_args
from ferry.node.base import LOGS_DIR, NodeService, page_tls
from ferry.node.bridge import drop_stale_link, restore_options
from ferry.node.procs import alive
from ferry.node.usage import tree_usage
from ferry.store.errors import StoreError

log = logging.getLogger(__name__)

FIRST_WRITE_WAIT_S = 5.0
PREPARED_TTL_S = 300.0


class LiveTarget(NodeService):
    """Mixed into the migrator."""

    prepared: dict[str, tuple[int, LazyTarget]]
    adopted: set[str]

    def adopt_orphans(self) -> None:
        """At start: every target a dead predecessor left with its memory still arriving."""
        if not self.jobs_dir.is_dir():
            return
        for d in sorted(self.jobs_dir.iterdir()):
            orphan = OrphanTarget.find(JobDir(d))
            if orphan is not None:
                self._adopt(d.name, orphan)

    def _adopt(self, job_id: str, orphan: OrphanTarget) -> None:
        if job_id in self.adopted:
            return
        self.adopted.add(job_id)
        log.warning("taking over the live move of %s (incarnation %d) that a previous migrator left",
                    job_id, orphan.record.incarnation)
        self.spawn(self._finish_orphan(job_id, orphan))

    async def _finish_orphan(self, job_id: str, orphan: OrphanTarget) -> None:
        r = orphan.record
        try:
            await self._report_orphan(job_id, orphan)
        except asyncio.CancelledError:  # drained: the record stays for the successor
            self.adopted.discard(job_id)
            raise
        orphan.forget()
        Path(r.exit_file).unlink(missing_ok=True)
        shutil.rmtree(r.images, ignore_errors=True)
        self.adopted.discard(job_id)

    async def _report_orphan(self, job_id: str, orphan: OrphanTarget) -> None:
        r = orphan.record
        try:
            pages = await orphan.wait_local(self.settings.api_timeout_s * 5)
        except LiveMoveFailed as exc:
            await self.report(wire.NodeEvent(kind="live_lost", node=self.node_id, job=job_id,
                                             incarnation=r.incarnation, op=r.op,
                                             error=f"the memory stopped coming from the source: {exc}"))
            return
        local_at = orphan.local_at or time.time()
        local = LiveLocal(pages_lazy=pages, bytes_lazy=pages * PAGE_SIZE if pages is not None else None,
                          degraded_ms=(local_at - r.running_at) * 1000 if r.running_at else None,
                          local_at=local_at, first_write_at=None, adopted=True)
        await self.report(wire.NodeEvent(kind="live_local", node=self.node_id, job=job_id,
                                         incarnation=r.incarnation, op=r.op, live=local))

    def live_images(self, cmd: wire.NodeCommand) -> Path:
        """Where a live move's images (all but memory) are staged here, for prepare and restore alike."""
        return self.scratch_dir / f"live-{cmd.job.id}-{cmd.incarnation}"

    async def live_prepare(self, cmd: wire.NodeCommand) -> None:
        """Before the source freezes: load the restore's Python and shim (about 0.2 s here), so that
        the downtime does not include it. The output paths come from the pre-copy checkpoint."""
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        if job.id in self.prepared or not cmd.checkpoint:
            return
        images = self.live_images(cmd)
        shutil.rmtree(images, ignore_errors=True)
        try:
            meta = (await asyncio.to_thread(self.store.read_manifest, job.id, cmd.checkpoint, job.tenant)).meta
            net_args, node_netns = restore_options(job, self.settings.node_netns)
            target = LazyTarget(jd, images, incarnation=cmd.incarnation, criu_bin=self.settings.criu_bin,
                                tls_args=page_tls(self.settings),
                                inherit={"stdout": str(meta["stdout_path"]), "stderr": str(meta["stderr_path"])},
                                extra_args=(*job_criu_args(job.network, cmd.options.criu_args,
                                                           adopted=job.adopted), *net_args),
                                op=cmd.op, node_netns=node_netns)
            await target.arm()
        except (StoreError, CriuError, OSError, KeyError, TimeoutError) as exc:
            log.warning("could not prepare the live restore of %s (it will be slower): %s", job.name, exc)
            return
        self.prepared[job.id] = (cmd.incarnation, target)
        self.spawn(self._expire(job.id, target))

    async def _expire(self, job_id: str, target: LazyTarget) -> None:
        """A prepared restore the move never used (it failed on the source) goes after a while."""
        await asyncio.sleep(PREPARED_TTL_S)
        if self.prepared.get(job_id, (0, None))[1] is target:
            del self.prepared[job_id]
            await target.kill()

    async def live_restore(self, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        shim = jd.read_shim()
        orphan = OrphanTarget.find(jd)
        if shim is not None and shim.incarnation == cmd.incarnation:
            if jd.read_exit() is None and alive(shim.pid):  # a redelivery: it runs already
                await self.report(wire.NodeEvent(kind="restored", node=self.node_id, job=job.id,
                                                 incarnation=cmd.incarnation, op=cmd.op, pid=shim.pid))
                if orphan is not None and orphan.record.incarnation == cmd.incarnation:
                    self._adopt(job.id, orphan)  # its predecessor died before the memory was all here
            return
        if orphan is not None and job.id not in self.adopted:  # a start its predecessor did not finish
            await orphan.kill()
            orphan.forget()
        pages = cmd.pages
        images = self.live_images(cmd)
        jd.path.mkdir(parents=True, exist_ok=True)
        jd.clear_run_state()
        t0 = time.monotonic()
        target: LazyTarget | None = None
        incarnation, prepared = self.prepared.pop(job.id, (0, None))
        if prepared is not None and incarnation != cmd.incarnation:
            await prepared.kill()
            prepared = None
        if prepared is None:
            shutil.rmtree(images, ignore_errors=True)
        try:
            if pages is None:
                raise ValueError("the command names no page source")
            manifest = await asyncio.to_thread(self.store.read_manifest, pages.store_job, pages.images, job.tenant)
            images.mkdir(parents=True, exist_ok=True)
            net_args, node_netns = restore_options(job, self.settings.node_netns)
            await asyncio.to_thread(drop_stale_link, job, self.settings.node_netns)
            target = prepared or LazyTarget(jd, images, incarnation=cmd.incarnation, criu_bin=self.settings.criu_bin,
                                            tls_args=page_tls(self.settings),
                                            inherit={"stdout": pages.stdout_path, "stderr": pages.stderr_path},
                                            extra_args=(*job_criu_args(job.network, cmd.options.criu_args,
                                                                       adopted=job.adopted), *net_args),
                                            op=cmd.op, node_netns=node_netns)
            fetch = asyncio.to_thread(self.store.restore_files, manifest, images,
                                      reserve=int(self.settings.disk_reserve))
            # Python's start-up for the restore while the images come, unless prepared already
            await (fetch if prepared is not None else asyncio.gather(target.arm(), fetch))
            for name in ("stdout", "stderr"):
                shutil.copyfile(images / LOGS_DIR / name, jd.path / name)
            fetch_ms = (time.monotonic() - t0) * 1000
            self.faults.raise_at(cmd.options, "restore", LiveMoveFailed, source_running=True)
            info = await target.start(pages.address, pages.port)
        except (StoreError, CriuError, OSError, ValueError, KeyError, TimeoutError) as exc:
            if target is not None:
                await target.kill()
            shutil.rmtree(images, ignore_errors=True)
            error = f"live restore on {self.node_id} failed: {exc}"
            log.warning("%s", error)
            await self.report(wire.NodeEvent(kind="restore_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, error=error))
            return
        restore_ms = (time.monotonic() - t0) * 1000
        await self.report(wire.NodeEvent(kind="restored", node=self.node_id, job=job.id, incarnation=cmd.incarnation,
                                         op=cmd.op, pid=info.pid, restore_ms=restore_ms,
                                         live=LiveRestored(fetch_ms=fetch_ms, restore_ms=target.restore_ms,
                                                           lazy_start_ms=target.lazy_start_ms,
                                                           running_at=target.running_at)))
        if self.faults.hit(cmd.options, "postcopy"):  # the memory stops coming midway
            await target.lazy.kill()
        self.spawn(self._until_local(cmd, target, images))

    async def _until_local(self, cmd: wire.NodeCommand, target: LazyTarget, images: Path) -> None:
        try:
            await self._report_local(cmd, target)
        except asyncio.CancelledError:  # drained: live-target.json stays, the successor finishes it
            raise
        except BaseException:
            target.forget()
            shutil.rmtree(images, ignore_errors=True)
            raise
        target.forget()
        shutil.rmtree(images, ignore_errors=True)

    def _tree_cpu_s(self, cmd: wire.NodeCommand) -> float | None:
        """The CPU seconds the restored job's tree used since its restore (CRIU's restore starts
        their count again), or None when it is not running here."""
        shim = self.job_dir(cmd.job.id).read_shim()
        got = tree_usage(shim.pid) if shim is not None and shim.incarnation == cmd.incarnation else None
        return got[1] if got is not None else None

    async def _report_local(self, cmd: wire.NodeCommand, target: LazyTarget) -> None:
        try:
            pages = await target.wait_local(self.settings.api_timeout_s * 5)
        except LiveMoveFailed as exc:
            await self.report(wire.NodeEvent(kind="live_lost", node=self.node_id, job=cmd.job.id,
                                             incarnation=cmd.incarnation, op=cmd.op,
                                             error=f"the memory stopped coming from the source: {exc}"))
            return
        cpu_s = await asyncio.to_thread(self._tree_cpu_s, cmd)  # its progress while degraded (ferry.policy.lost)
        if target.watch is not None and target.first_write_at is None:
            # a job that writes rarely: give it a moment to show progress
            await asyncio.to_thread(target.watch.wait, FIRST_WRITE_WAIT_S)
            if target.first_write_at is None:
                log.info("live move of %s: the job wrote nothing to its output within %.0f s of its last page, "
                         "so its downtime is not measured (null)", cmd.job.name, FIRST_WRITE_WAIT_S)
        target.close()
        assert target.running_at is not None and target.local_at is not None
        local = LiveLocal(pages_lazy=pages, bytes_lazy=pages * PAGE_SIZE if pages is not None else None,
                          degraded_ms=(target.local_at - target.running_at) * 1000, local_at=target.local_at,
                          first_write_at=target.first_write_at, cpu_s=cpu_s)
        await self.report(wire.NodeEvent(kind="live_local", node=self.node_id, job=cmd.job.id,
                                         incarnation=cmd.incarnation, op=cmd.op, live=local))
