"""The node's migrator: brings a job back on this node from a checkpoint in the store.

It fetches the manifest, verifies and rebuilds every file in a scratch directory, puts the job's
logs back as they were at the checkpoint, and has a shim run `criu restore` into a new PID
namespace; the restored process writes on into this node's copies of its log files.
"""

import asyncio
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable

from ferry.common import wire
from ferry.common.errors import FerryError
from ferry.common.models import Network
from ferry.common.service import service_main
from ferry.common.tracing import tracer
from ferry.criu.container import rebuild_bundle, work_dir_of
from ferry.criu.errors import CriuError
from ferry.criu.launch import restore
from ferry.criu.runner import job_criu_args
from ferry.gpu.compat import check_restore_target, device_map
from ferry.gpu.cuda_checkpoint import default_checkpointer, resume_after_restore
from ferry.gpu.errors import GpuError
from ferry.gpu.models import GpuInfo, GpuSnapshot
from ferry.migrator.live import LiveTarget
from ferry.node.base import LOGS_DIR, META_FILE, NODE_ACK_WAIT_S, NodeService
from ferry.node.bridge import GANG_LOCK_MARKER, drop_stale_link, restore_options
from ferry.node.procs import alive, wait_for_restores_of
from ferry.store.errors import ChunkCorrupt, ManifestCorrupt, ObjectNotFound, StoreError

log = logging.getLogger(__name__)
_tracer = tracer("migrator")
ORPHAN_RESTORE_WAIT_S = 120.0



class Migrator(LiveTarget, NodeService):
    """Restores checkpoints onto this node."""

    name = "migrator"

    async def start(self) -> None:
        await super().start()
        self.prepared = {}
        self.adopted = set()
        self.adopt_orphans()

    async def run(self) -> None:
        assert self.bus is not None
        await self.bus.consume(stream=wire.CMD_STREAM, durable=f"migrator-{self.node_id}",
                               subject=wire.node_cmd_subject(self.node_id, "migrator"),
                               handler=self.on_command, concurrency=2, ack_wait=NODE_ACK_WAIT_S, stop=self.stopping,
                               drain_s=self.settings.drain_timeout_s)

    def handlers(self) -> dict[str, Callable[[wire.NodeCommand], Awaitable[None]]]:
        return {"restore": self.restore, "live_restore": self.live_restore,
                "live_prepare": self.live_prepare}

    async def restore(self, cmd: wire.NodeCommand) -> None:
        job, jd = cmd.job, self.job_dir(cmd.job.id)
        assert cmd.checkpoint
        # A redelivery after this service was killed midway: the shim it started outlives it and may
        # still be restoring. Let it end rather than start a second copy beside it.
        if not await asyncio.to_thread(wait_for_restores_of, jd.path, cmd.incarnation, ORPHAN_RESTORE_WAIT_S):
            raise FerryError(f"a restore of {job.name} begun before a restart still runs after "
                             f"{ORPHAN_RESTORE_WAIT_S:.0f}s")  # redelivered later
        shim = jd.read_shim()
        if shim is not None and shim.incarnation == cmd.incarnation:
            if jd.read_exit() is None and alive(shim.pid):  # restored before a restart of this service
                await self.report(wire.NodeEvent(kind="restored", node=self.node_id, job=job.id,
                                                 incarnation=cmd.incarnation, op=cmd.op, pid=shim.pid))
            return
        t0 = time.monotonic()
        images = self.scratch_dir / f"restore-{job.id}-{cmd.checkpoint}-{cmd.incarnation}"
        shutil.rmtree(images, ignore_errors=True)
        try:
            with _tracer.start_as_current_span("store.fetch"):
                manifest = await asyncio.to_thread(self.store.read_manifest, job.id, cmd.checkpoint, job.tenant)
                gpu = await self.gpu_target(manifest.meta.get("gpu"), job.gpu_uuids)  # refuses before touching
                images.mkdir(parents=True)
                await asyncio.to_thread(self.store.restore_files, manifest, images,
                                        self.progress_reporter(cmd.op, "download"),
                                        reserve=int(self.settings.disk_reserve))
            meta = json.loads((images / META_FILE).read_text())
            jd.path.mkdir(parents=True, exist_ok=True)
            jd.clear_run_state()
            for name in ("stdout", "stderr"):
                shutil.copyfile(images / LOGS_DIR / name, jd.path / name)
            if job.container:  # its bundle as it was at the checkpoint, writable layer included
                await asyncio.to_thread(rebuild_bundle, jd, images)
            # a gang member comes back with its port blocked until every member is back (gang_release)
            held = cmd.hold and job.network == Network.BRIDGE
            if held:
                (jd.path / GANG_LOCK_MARKER).write_text(cmd.op or "")
            net_args, node_netns = restore_options(job, self.settings.node_netns,
                                                   blocked_in=jd.path if held else None)
            await asyncio.to_thread(drop_stale_link, job, self.settings.node_netns)
            with _tracer.start_as_current_span("criu.restore"):
                info = await restore(jd, images, inherit={"stdout": meta["stdout_path"], "stderr": meta["stderr_path"]},
                                     incarnation=cmd.incarnation, criu_bin=self.settings.criu_bin,
                                     criu_args=(*job_criu_args(cmd.job.network, cmd.options.criu_args,
                                                               adopted=cmd.job.adopted), *net_args),
                                     container=job.container, here=job.name if job.here else None,
                                     node_netns=node_netns, zygote=self.zygote)
            if gpu is not None:
                with _tracer.start_as_current_span("cuda.restore"):
                    await resume_after_restore(info.pid, default_checkpointer(), device_map(gpu[0].uuids, gpu[1]))
            running_at = time.time()  # it runs again: a move's lost progress ends here (ferry.policy.lost)
        except (StoreError, CriuError, GpuError, OSError, ValueError, KeyError) as exc:
            error = f"restore of {cmd.checkpoint} on {self.node_id} failed: {exc}"
            log.warning("%s", error)
            if (images / "restore.log").exists():
                shutil.copyfile(images / "restore.log", jd.path / f"restore-{cmd.checkpoint}.log")
            unverifiable = isinstance(exc, (ChunkCorrupt, ManifestCorrupt, ObjectNotFound))
            await self.report(wire.NodeEvent(kind="restore_failed", node=self.node_id, job=job.id,
                                             incarnation=cmd.incarnation, op=cmd.op, error=error,
                                             unverifiable=unverifiable))
            return
        finally:
            shutil.rmtree(images, ignore_errors=True)
            shutil.rmtree(work_dir_of(images, "restore"), ignore_errors=True)  # a container's (runc's CRIU logs)
        restore_ms = (time.monotonic() - t0) * 1000
        await self.report(wire.NodeEvent(kind="restored", node=self.node_id, job=job.id, incarnation=cmd.incarnation,
                                         op=cmd.op, pid=info.pid, restore_ms=restore_ms, time=running_at))


    async def gpu_target(self, snapshot: object, assigned: list[str]) -> tuple[GpuSnapshot, list[GpuInfo]] | None:
        """For a checkpoint taken with GPU state: the GPUs assigned here, checked against the ones it
        ran on (model, count, driver); GpuMismatch before anything is fetched or touched."""
        if not snapshot:
            return None
        assert self.bus is not None
        source = GpuSnapshot.model_validate(snapshot)
        node = await self.bus.nodes.get(self.node_id)
        here = [GpuInfo.model_validate(g) for g in (node.gpu_list if node else [])]
        target = [g for g in here if g.uuid in assigned] if assigned else here[: source.count]
        check_restore_target(source, target, node.gpu_driver if node else None)
        return source, target


def main() -> None:
    service_main(Migrator, node=True)


if __name__ == "__main__":
    main()
