"""A pod's container in Ferry's store: checkpointed through runc against containerd's runc state
(``checkpoint``), and fetched back into a new container's bundle before ``runc restore``
(``fetch``). The images are CRIU's, from ``runc checkpoint``, plus the root filesystem's changes
(``ferry.kube.overlay``) taken while the container is still frozen, and the spec it ran with.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from ferry.common.errors import FerryError, NotFoundError
from ferry.common.models import DEFAULT_TENANT, new_id
from ferry.criu.binary import find_criu
from ferry.criu.container import runc_bin, work_dir_of, write_criu_options
from ferry.criu.errors import DumpFailed
from ferry.criu.logs import failure_summary
from ferry.kube.annotations import CheckpointRef, job_of
from ferry.store.manifest import Manifest
from ferry.store.store import CheckpointStore

ROOTFS_CHANGES = "rootfs-changes.tar"
SPEC = "container-spec.json"
CRIU_CONF = "ferry-criu.conf"  # in the container's bundle; runc reads it through org.criu.config
CRIU_ANNOTATION = "org.criu.config"


class RuncState(BaseModel):
    """What ``runc state`` tells of a container that the agent needs."""

    id: str
    pid: int
    status: str
    bundle: str
    rootfs: str
    annotations: dict[str, str] = {}


class PodCheckpoint(BaseModel):
    job: str
    checkpoint: str
    parent: str | None
    final: bool
    wall_ms: float
    bytes_logical: int


def runc_base(root: str) -> list[str]:
    criu = find_criu("criu")
    return [runc_bin(), "--root", root, *(["--criu", criu] if criu else [])]


def runc_state(root: str, container_id: str) -> RuncState:
    done = subprocess.run([*runc_base(root), "state", container_id], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NotFoundError(f"container {container_id} is not in runc's state under {root}: "
                            f"{done.stderr.strip() or done.returncode}")
    return RuncState.model_validate_json(done.stdout)


def write_criu_conf(bundle: Path, *, action_script: str | None = None) -> Path:
    """CRIU's options for runc's dumps and restores of this container (those of Ferry's own
    containers: ``ferry.criu.container.write_criu_options``) and the post-dump action."""
    return write_criu_options(bundle / CRIU_CONF, action_script=action_script)


def open_configured_store(config: str | None = None) -> CheckpointStore:
    """The store Ferry's configuration names (``config``, else ``FERRY_CONFIG``; ``FERRY_*``)."""
    from ferry.common.config import load_settings
    from ferry.store.url import open_store

    settings = load_settings(config)
    return open_store(settings.resolved_store_url(), settings.resolved_store_key_file())


def newest(store: CheckpointStore, job: str) -> Manifest:
    manifests = [store.read_manifest(job, ck) for ck in store.list_checkpoints(job)]
    if not manifests:
        raise NotFoundError(f"job {job} has no checkpoint in the store")
    return max(manifests, key=lambda m: m.created)


def consumed_key(job: str, checkpoint: str) -> str:
    """Where the store records that a container continued from a final checkpoint."""
    return f"pods/consumed/{job}/{checkpoint}"


def mark_consumed(store: CheckpointStore, job: str, checkpoint: str) -> None:
    store.backend.put(consumed_key(job, checkpoint), b"")


def resumable_key(job: str, checkpoint: str) -> str:
    """Where the controller records that a (periodic) checkpoint may be continued from: its
    container's node was lost, so no final checkpoint will come."""
    return f"pods/resumable/{job}/{checkpoint}"


def make_resumable(store: CheckpointStore, job: str) -> str | None:
    """The job's newest checkpoint made resumable (``resumable_key``); its id, or None when it has none."""
    try:
        newest_one = newest(store, job)
    except NotFoundError:
        return None
    store.backend.put(resumable_key(job, newest_one.checkpoint), b"")
    return newest_one.checkpoint


def resumable(store: CheckpointStore, job: str) -> Manifest | None:
    """``restore-from: auto``: the job's newest checkpoint that may be continued from (a final one,
    or one the controller made resumable when its node was lost), unless a container has continued
    from it already (then the job's work went on from there and this one must start anew)."""
    candidates = [m for m in (store.read_manifest(job, ck) for ck in store.list_checkpoints(job))
                  if m.meta.get("final") or store.backend.exists(resumable_key(job, m.checkpoint))]
    if not candidates:
        return None
    newest_one = max(candidates, key=lambda m: m.created)
    return None if store.backend.exists(consumed_key(job, newest_one.checkpoint)) else newest_one


def _action_script(upper: Path | None, images: Path) -> Path:
    """A post-dump action that saves the root filesystem's changes while the container is frozen."""
    script = images.parent / f".{images.name}-post-dump.sh"
    save = (f"exec {sys.executable} -m ferry.kube.overlay save {upper} {images / ROOTFS_CHANGES}" if upper
            else "exit 0")
    script.write_text(f"#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n{save}\n")
    script.chmod(0o700)
    return script


def checkpoint(store: CheckpointStore, *, root: str, container_id: str, work: Path, job: str | None = None,
               final: bool = False, tenant: str = DEFAULT_TENANT, state: RuncState | None = None) -> PodCheckpoint:
    """``runc checkpoint`` of the running container ``container_id`` (containerd's runc state under
    ``root``; ``state`` when the caller has read it) into ``job``'s next checkpoint in the store
    (default: the job its pod names, ``job_of``). ``final``: the container ends with the dump
    (before its pod goes); otherwise it runs on (``--leave-running``)."""
    from ferry.kube.overlay import upper_dir

    state = state or runc_state(root, container_id)
    job = job or job_of(state.annotations, container_id[:12])
    if state.status not in ("running", "paused"):
        raise DumpFailed(f"container {container_id} is {state.status}, not running")
    images = work / new_id("img")
    images.mkdir(parents=True)
    upper = upper_dir(Path(state.rootfs))
    script = _action_script(upper, images)
    bundle = Path(state.bundle)
    write_criu_conf(bundle, action_script=str(script))
    work_dir = work_dir_of(images, "dump")
    started = time.monotonic()
    try:
        command = [*runc_base(root), "checkpoint", *([] if final else ["--leave-running"]), "--image-path",
                   str(images), "--work-path", str(work_dir), container_id]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        write_criu_conf(bundle)
        script.unlink(missing_ok=True)
    wall_ms = (time.monotonic() - started) * 1000
    if done.returncode != 0:
        excerpt, reason = failure_summary(work_dir / "dump.log", done.stderr or f"runc exited {done.returncode}")
        shutil.rmtree(work_dir, ignore_errors=True)
        raise DumpFailed(f"runc checkpoint {container_id} failed: {reason}", log_excerpt=excerpt)
    shutil.copyfile(bundle / "config.json", images / SPEC)
    try:
        parent: str | None = newest(store, job).checkpoint
    except NotFoundError:
        parent = None
    checkpoint_id = new_id("ck")
    written = store.write_checkpoint(job=job, tenant=tenant, checkpoint=checkpoint_id, parent=parent,
                                     src_dir=images, meta={"kind": "pod", "container": container_id,
                                                           "annotations": state.annotations, "final": final})
    shutil.rmtree(images, ignore_errors=True)
    shutil.rmtree(work_dir, ignore_errors=True)
    return PodCheckpoint(job=job, checkpoint=checkpoint_id, parent=parent, final=final, wall_ms=wall_ms,
                         bytes_logical=written.bytes_logical)


def fetch(store: CheckpointStore, ref: CheckpointRef, dest: Path) -> Manifest:
    """The checkpoint ``ref`` names (else the job's newest), verified, into ``dest``."""
    manifest = store.read_manifest(ref.job, ref.checkpoint) if ref.checkpoint else newest(store, ref.job)
    if manifest.meta.get("kind") != "pod":
        raise FerryError(f"checkpoint {manifest.checkpoint} of {ref.job} is not a pod container's")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    store.restore_files(manifest, dest)
    return manifest
