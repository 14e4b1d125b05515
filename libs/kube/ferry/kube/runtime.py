"""``ferry-runc``: the runtime that containerd's runc shim calls for pods of the RuntimeClass
``ferry`` (the runtime's ``BinaryName``). Every call goes to Debian's runc unchanged, except:

- ``create`` of a container (not the pod's sandbox): its spec gains ``org.criu.config``, so that
  the node agent's ``runc checkpoint`` and a later ``runc restore`` use Ferry's CRIU options, and
  a seccomp rule that refuses io_uring (``ferry.kube.ocispec``), which CRIU cannot dump;
- ``create`` of a container whose pod carries ``ferry.dev/restore-from``: the checkpoint is
  fetched from Ferry's store (verified), the root filesystem's changes are laid over the new
  container's root filesystem, and ``runc restore --detach`` runs in place of ``runc create``.
  The shim then finds a running container, so the ``start`` that follows is answered here.
  When the checkpoint is missing or does not verify, the container is created fresh: the pod
  never crash-loops because of Ferry, and ``ferry-restore.json`` in the bundle says why.

- ``kill ID SIGTERM`` of a container whose pod carries ``ferry.dev/checkpoint-on-stop: "true"``:
  the kubelet is stopping it (its pod is going: a drain, a preemption, a suspended job), so the
  container is checkpointed into the store as it ends (``runc checkpoint``, which leaves it dead)
  instead of being sent SIGTERM. That happens before the pod's grace period runs out; when the
  checkpoint fails the SIGTERM is sent after all, and the container ends as it would have.
  A container of a group (``ferry.dev/group``: a distributed job's replicas) is checkpointed
  together with the others (``ferry.kube.groups``), and ``restore-from: auto`` continues it from
  the group's newest record.

The store is the one Ferry's configuration names (``FERRY_CONFIG``, ``FERRY_*``), which the node
agent's DaemonSet gives containerd's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.kube.runcargs import RuncCall, parse, restore_argv

if TYPE_CHECKING:
    from ferry.kube.groups import GroupSpec
    from ferry.kube.podimages import RuncState
    from ferry.store.store import CheckpointStore

RESTORED_MARK = "ferry-restored"  # in runc's state folder of a container that was restored
RESTORE_REPORT = "ferry-restore.json"  # in the bundle: what became of a restore-from
GROUP_FILE = "ferry-group.json"  # in the bundle of a group member: its group and incarnation


def real_runc() -> str:
    configured = os.environ.get("FERRY_RUNC")
    found = configured or shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin:/sbin")
    if not found:
        print("ferry-runc: runc not found (install Debian's runc, or set FERRY_RUNC)", file=sys.stderr)
        raise SystemExit(127)
    return found


def _mark(call: RuncCall) -> Path | None:
    root, cid = call.global_value("--root"), call.container_id
    return Path(root) / cid / RESTORED_MARK if root and cid else None


def _report(bundle: Path, **fields: Any) -> dict[str, Any]:
    (bundle / RESTORE_REPORT).write_text(json.dumps(fields) + "\n")
    return fields


def _prepare(call: RuncCall) -> tuple[list[str], dict[str, Any]] | None:
    """For a ``create``: the spec's CRIU options and io_uring refused, then the restore to run
    instead (and its report so far), if any; a group member joins its group's incarnation."""
    from ferry.kube.annotations import CRI_CONTAINER_TYPE, RESTORE_FROM, job_of
    from ferry.kube.groups import FRESH
    from ferry.kube.ocispec import refuse_io_uring
    from ferry.kube.podimages import CRIU_ANNOTATION, open_configured_store, write_criu_conf

    bundle = Path(call.bundle or ".")
    spec_path = bundle / "config.json"
    spec = json.loads(spec_path.read_text())
    if (spec.get("annotations") or {}).get(CRI_CONTAINER_TYPE) == "sandbox":
        return None
    spec = refuse_io_uring(spec)
    annotations = spec.setdefault("annotations", {})
    annotations[CRIU_ANNOTATION] = str(write_criu_conf(bundle))
    spec_path.write_text(json.dumps(spec))
    job = job_of(annotations)
    group = _group(annotations)
    value = annotations.get(RESTORE_FROM)
    fetched = None
    store: CheckpointStore | Exception | None = None
    if value or group is not None:  # opened once for the restore and the group
        try:
            store = open_configured_store()
        except Exception as exc:  # a fresh start: the restore's report says why
            store = exc
    if value:
        try:
            if isinstance(store, Exception):
                raise store
            assert store is not None
            fetched = _fetch(store, bundle, value, job, group)
        except Exception as exc:  # any failure means a fresh start, said in the report
            _report(bundle, restored=False, restore_from=value, reason=f"{type(exc).__name__}: {exc}")
            print(f"ferry-runc: not restoring from {value}: {exc}; starting fresh", file=sys.stderr)
    if group is not None:
        if isinstance(store, Exception):
            print(f"ferry-runc: could not clear {job}'s old markers in group {group.name}: {store}", file=sys.stderr)
        elif store is not None:
            _join(store, bundle, group, fetched[2] if fetched else FRESH, job)
    if fetched is None:
        return None
    images, report, _ = fetched
    return restore_argv(call, images=str(images), work=str(bundle / "ferry-restore-work")), report


def _group(annotations: dict[str, str]) -> GroupSpec | None:
    """The container's group, if its pod names one; a wrong one is said and ignored."""
    from ferry.kube.groups import group_of

    try:
        return group_of(annotations)
    except Exception as exc:
        print(f"ferry-runc: {exc}; checkpointed on its own", file=sys.stderr)
        return None


def _join(store: CheckpointStore, bundle: Path, group: GroupSpec, base: str, job: str) -> None:
    """Record which incarnation of the group this container is (``base``) and clear its markers
    of that incarnation left by an earlier container of the job."""
    from ferry.kube.groups import unsay

    (bundle / GROUP_FILE).write_text(json.dumps({"group": group.name, "base": base}) + "\n")
    try:
        unsay(store.backend, group.name, base, job)
    except Exception as exc:
        print(f"ferry-runc: could not clear {job}'s old markers in group {group.name}: {exc}", file=sys.stderr)


def _fetch(store: CheckpointStore, bundle: Path, value: str, job: str, group: GroupSpec | None
           ) -> tuple[Path, dict[str, Any], str] | None:
    """The checkpoint's images in the bundle and its root filesystem changes applied, with the
    report so far and the group record it belongs to (``FRESH`` for none); None for ``auto`` with
    nothing to continue from (a first start, or its last stop was continued)."""
    from ferry.kube.annotations import AUTO, CheckpointRef, parse_restore_from
    from ferry.kube.groups import FRESH
    from ferry.kube.overlay import apply_changes
    from ferry.kube.podimages import ROOTFS_CHANGES, consumed_key, fetch, resumable

    base = FRESH
    if value.strip() == AUTO and group is not None:
        from ferry.kube.groups import choose, records

        record = choose(records(store.backend, group.name), job,
                        lambda ck: store.backend.exists(consumed_key(job, ck)))
        if record is None:
            _report(bundle, restored=False, restore_from=value, job=job, group=group.name,
                    reason=f"nothing to continue from: group {group.name} has no checkpoint of {job} that "
                           "was not continued already")
            return None
        ref, base = CheckpointRef(job=job, checkpoint=record.members[job]), record.round
    elif value.strip() == AUTO:
        found = resumable(store, job)
        if found is None:
            _report(bundle, restored=False, restore_from=value, job=job,
                    reason="nothing to continue from: no final checkpoint that was not continued already")
            return None
        ref = CheckpointRef(job=job, checkpoint=found.checkpoint)
    else:
        ref = parse_restore_from(value)
    images = bundle / "ferry-images"
    manifest = fetch(store, ref, images)
    if (images / ROOTFS_CHANGES).exists():
        apply_changes(images / ROOTFS_CHANGES, bundle / "rootfs")
    report = _report(bundle, restored=None, restore_from=value, checkpoint=manifest.checkpoint, job=manifest.job,
                     **({"group": group.name, "round": base} if base != FRESH and group else {}))
    return images, report, base


def _checkpoint_on_stop(call: RuncCall) -> bool:
    """For a stopping ``kill``: True when the container ended with a final checkpoint instead."""
    from ferry.kube.annotations import CHECKPOINT_ON_STOP, CRI_CONTAINER_TYPE, is_true
    from ferry.kube.podimages import checkpoint, open_configured_store, runc_state

    root, cid = call.global_value("--root"), call.container_id
    if not root or not cid:
        return False
    try:
        state = runc_state(root, cid)
    except Exception:  # not ours to judge: runc's own kill says what is wrong
        return False
    if not is_true(state.annotations.get(CHECKPOINT_ON_STOP)) or state.status != "running" or \
            state.annotations.get(CRI_CONTAINER_TYPE) == "sandbox":
        return False
    group = _group(state.annotations)
    try:
        store = open_configured_store()
        if group is not None:
            return _group_stop(store, root, state, group)
        done = checkpoint(store, root=root, container_id=cid, state=state, work=Path(state.bundle) / "ferry-stop",
                          final=True)
    except Exception as exc:  # the SIGTERM after all: the container ends as it would have
        print(f"ferry-runc: checkpoint on stop of {cid} failed, sending SIGTERM: {exc}", file=sys.stderr)
        return False
    print(json.dumps({"checkpoint_on_stop": done.model_dump()}), file=sys.stderr)
    return True


def _group_stop(store: CheckpointStore, root: str, state: RuncState, group: GroupSpec) -> bool:
    """A group member's final checkpoint (``ferry.kube.groups``): frozen, every member frozen,
    dumped, every member dumped, the group's record. False (the SIGTERM after all, unfrozen) when
    the others were not all frozen in time or the dump failed."""
    import time

    from ferry.kube import groups
    from ferry.kube.annotations import job_of
    from ferry.kube.podimages import checkpoint, runc_base

    cid, bundle = state.id, Path(state.bundle)
    job = job_of(state.annotations, cid[:12])
    try:
        base = json.loads((bundle / GROUP_FILE).read_text())["base"]
    except (OSError, ValueError, KeyError):
        base = groups.FRESH
    backend = store.backend
    subprocess.run([*runc_base(root), "pause", cid], check=True, capture_output=True)
    try:
        groups.say(backend, group.name, base, "frozen", job)
        if groups.wait_for(backend, group.name, base, "frozen", group.size, time.monotonic() + group.wait_s) is None:
            raise TimeoutError(f"not every member of group {group.name} ({group.size}) stopped within "
                               f"{group.wait_s:g} s")
        done = checkpoint(store, root=root, container_id=cid, state=state, work=bundle / "ferry-stop", final=True)
    except Exception as exc:
        groups.unsay(backend, group.name, base, job)
        subprocess.run([*runc_base(root), "resume", cid], check=False, capture_output=True)
        print(f"ferry-runc: no group checkpoint of {group.name}: {exc}; sending SIGTERM", file=sys.stderr)
        return False
    groups.say(backend, group.name, base, "done", job, done.checkpoint)
    everyone = groups.wait_for(backend, group.name, base, "done", group.size, time.monotonic() + group.wait_s)
    if everyone is None:
        print(f"ferry-runc: {job} checkpointed, but not every member of group {group.name} was: the group's "
              "last checkpoint stands", file=sys.stderr)
        return True
    record = groups.record_for(group.name, everyone)
    groups.commit(backend, record)
    print(json.dumps({"checkpoint_on_stop": done.model_dump(), "group": record.model_dump()}), file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    call = parse(args)
    runc = real_runc()
    if call.command == "start":
        mark = _mark(call)
        if mark is not None and mark.exists():
            return 0  # restored: already running
    if call.stops and _checkpoint_on_stop(call):
        return 0
    if call.command != "create":
        os.execv(runc, [runc, *args])
    prepared = _prepare(call)
    if prepared is None:
        os.execv(runc, [runc, *args])
    restore, report = prepared
    bundle = Path(call.bundle or ".")
    done = subprocess.run([runc, *restore], check=False)
    if done.returncode != 0:  # a fresh start instead (with the checkpoint's root filesystem changes)
        _report(bundle, **{**report, "restored": False, "reason": f"runc restore exited {done.returncode}"})
        subprocess.run([runc, *call.globals, "delete", "--force", *call.args[:1]], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.execv(runc, [runc, *args])
    mark = _mark(call)
    if mark is not None:
        mark.write_text("")
    _report(bundle, **{**report, "restored": True})
    try:
        from ferry.kube.podimages import mark_consumed, open_configured_store

        mark_consumed(open_configured_store(), report["job"], report["checkpoint"])
    except Exception as exc:  # the container runs; a later auto restore may pick the same checkpoint
        print(f"ferry-runc: could not record that {report['checkpoint']} was continued: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
