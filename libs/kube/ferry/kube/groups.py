"""Groups of pods checkpointed together: the replicas of a PyTorchJob or TrainJob, whose ranks hold
TCP connections to one another and step in lockstep, so that a checkpoint of one replica is only
worth restoring with checkpoints of every other one taken at the same moment.

A pod joins a group with ``ferry.dev/group: NAME`` and ``ferry.dev/group-size: N`` (the job's
replica count) next to ``ferry.dev/checkpoint-on-stop: "true"``. When the job is suspended (or
Kueue preempts it, or its nodes drain) the kubelets stop every replica at about the same time, and
each replica's runtime, instead of dumping at once:

1. freezes its container (``runc pause``) and says so in the store (``frozen``);
2. waits until every member of the group is frozen (at most ``ferry.dev/group-wait``, 20 s by
   default, less than the pod's default 30 s grace), so no rank runs on while another is dumped;
3. dumps (``runc checkpoint`` of the frozen container, its established connections included) and
   says so (``done``, with the checkpoint's id);
4. once every member is done, records the group's checkpoint (``committed``: each member's job
   and checkpoint). Every member writes the same record under the same name, so it does not
   matter which writes first.

When a member is not frozen in time, nobody dumps: each unfreezes and ends as it would have
(SIGTERM), and the group's last record stands. A replica created with ``restore-from: auto``
restores its part of the group's newest record, so all replicas continue from one moment; a
record that a member continued from already is not used again by it (it starts fresh, as every
other member does, since they read the same records).

The markers live in the store under ``pods/groups/GROUP/BASE/``, where BASE is the record the
group's current incarnation continued from (``fresh`` for none): each incarnation has its own
markers, and a member clears its own markers of its incarnation as it is created.

Established connections are restored only where the addresses are the same: pods on the node's
network (``hostNetwork``, common for training), not pod IPs, which a CNI hands out anew.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel

from ferry.common.errors import UsageError
from ferry.common.units import parse_duration
from ferry.kube.annotations import GROUP, GROUP_SIZE, GROUP_WAIT
from ferry.store.backend import Backend

FRESH = "fresh"  # the base of an incarnation that continued from no record
DEFAULT_WAIT_S = 20.0
MAX_SIZE = 4096
Phase = Literal["frozen", "done"]


class GroupSpec(BaseModel):
    """A container's group, from its pod's annotations."""

    name: str
    size: int
    wait_s: float = DEFAULT_WAIT_S


class Marker(BaseModel):
    """A member's word in the store: it is frozen, or its dump is done (and which checkpoint)."""

    job: str
    at: float
    checkpoint: str | None = None


class GroupRecord(BaseModel):
    """A group checkpoint: every member's job and checkpoint, taken while all were frozen."""

    group: str
    round: str
    at: float
    members: dict[str, str]  # job -> checkpoint


def group_of(annotations: Mapping[str, str]) -> GroupSpec | None:
    """The group a container's annotations name, or None; UsageError when they are wrong."""
    name = annotations.get(GROUP)
    if name is None:
        return None
    if not name or len(name) > 63 or not all(c.isalnum() or c in "-._" for c in name):
        raise UsageError(f"{GROUP}: {name!r} is not a name (letters, digits, '-', '.', '_'; up to 63)")
    raw = annotations.get(GROUP_SIZE, "")
    if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_SIZE:
        raise UsageError(f"{GROUP_SIZE}: {raw!r} is not the group's number of pods (1 to {MAX_SIZE}); "
                         f"a pod of {GROUP} needs it")
    wait = annotations.get(GROUP_WAIT)
    try:
        wait_s = parse_duration(wait) if wait else DEFAULT_WAIT_S
    except Exception as exc:
        raise UsageError(f"{GROUP_WAIT}: {wait!r} is not a duration such as 20s") from exc
    return GroupSpec(name=name, size=int(raw), wait_s=wait_s)


# -- pure decisions ------------------------------------------------------------------------------------


def gathered(markers: list[Marker], size: int) -> dict[str, Marker] | None:
    """The members' markers once there are ``size`` distinct members, else None."""
    by_job = {m.job: m for m in markers}
    return by_job if len(by_job) >= size else None


def round_of(members: Mapping[str, str]) -> str:
    """A group record's name: the same for the same members' checkpoints, whoever computes it."""
    text = json.dumps(dict(sorted(members.items())), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record_for(group: str, done: Mapping[str, Marker]) -> GroupRecord:
    members = {job: m.checkpoint or "" for job, m in done.items()}
    if not all(members.values()):
        raise ValueError("a done marker without its checkpoint")
    return GroupRecord(group=group, round=round_of(members), at=max(m.at for m in done.values()), members=members)


def choose(records: list[GroupRecord], job: str, consumed: Callable[[str], bool]) -> GroupRecord | None:
    """The record ``job`` continues from: the group's newest that has it, unless it continued from
    that one already (``consumed(checkpoint)``); None means a fresh start."""
    mine = [r for r in records if job in r.members]
    if not mine:
        return None
    newest = max(mine, key=lambda r: (r.at, r.round))
    return None if consumed(newest.members[job]) else newest


# -- the store -------------------------------------------------------------------------------------------


def _prefix(group: str) -> str:
    return f"pods/groups/{group}/"


def marker_key(group: str, base: str, phase: Phase, job: str) -> str:
    return f"{_prefix(group)}{base}/{phase}/{job}"


def record_key(group: str, round_: str) -> str:
    return f"{_prefix(group)}records/{round_}.json"


def say(backend: Backend, group: str, base: str, phase: Phase, job: str, checkpoint: str | None = None) -> None:
    marker = Marker(job=job, at=time.time(), checkpoint=checkpoint)
    backend.put(marker_key(group, base, phase, job), marker.model_dump_json().encode())


def unsay(backend: Backend, group: str, base: str, job: str) -> None:
    for phase in ("frozen", "done"):
        backend.delete(marker_key(group, base, phase, job))


def heard(backend: Backend, group: str, base: str, phase: Phase) -> list[Marker]:
    prefix = f"{_prefix(group)}{base}/{phase}/"
    found = []
    for key in list(backend.list(prefix)):
        try:
            found.append(Marker.model_validate_json(backend.get(key)))
        except Exception:
            continue  # deleted meanwhile, or not ours
    return found


def records(backend: Backend, group: str) -> list[GroupRecord]:
    found = []
    for key in list(backend.list(f"{_prefix(group)}records/")):
        try:
            found.append(GroupRecord.model_validate_json(backend.get(key)))
        except Exception:
            continue
    return found


def commit(backend: Backend, record: GroupRecord) -> None:
    backend.put(record_key(record.group, record.round), record.model_dump_json().encode())


def wait_for(backend: Backend, group: str, base: str, phase: Phase, size: int, deadline: float,
             every_s: float = 0.1) -> dict[str, Marker] | None:
    """Every member's ``phase`` marker, or None when ``deadline`` (monotonic) passes first."""
    while True:
        found = gathered(heard(backend, group, base, phase), size)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(every_s)
