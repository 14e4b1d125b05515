"""Groups of pods checkpointed together (ferry.kube.groups): the annotations that make one, the
markers members leave in the store and wait for, the group record every member writes the same,
and which record a member continues from; and the spec edit that refuses io_uring to containers."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.kube import groups
from ferry.kube.annotations import GROUP, GROUP_SIZE, GROUP_WAIT
from ferry.kube.ocispec import IO_URING, refuse_io_uring
from ferry.store.local import LocalBackend


def test_the_annotations_name_a_group_and_wrong_ones_are_refused() -> None:
    assert groups.group_of({}) is None
    assert groups.group_of({GROUP: "bert", GROUP_SIZE: "4"}) == groups.GroupSpec(name="bert", size=4, wait_s=20.0)
    assert groups.group_of({GROUP: "bert", GROUP_SIZE: "4", GROUP_WAIT: "45s"}).wait_s == 45.0  # type: ignore[union-attr]
    for bad, said in (({GROUP: "bert"}, "group-size"), ({GROUP: "bert", GROUP_SIZE: "0"}, "group-size"),
                      ({GROUP: "a/b", GROUP_SIZE: "2"}, "is not a name"),
                      ({GROUP: "bert", GROUP_SIZE: "2", GROUP_WAIT: "soon"}, "group-wait")):
        with pytest.raises(UsageError, match=said):
            groups.group_of(bad)


def marker(job: str, at: float, checkpoint: str | None = None) -> groups.Marker:
    return groups.Marker(job=job, at=at, checkpoint=checkpoint)


def test_a_group_is_gathered_when_every_member_has_spoken() -> None:
    assert groups.gathered([marker("a", 1), marker("a", 2)], 2) is None  # one member twice is one member
    assert sorted(groups.gathered([marker("a", 1), marker("b", 2)], 2) or {}) == ["a", "b"]


def test_every_member_computes_the_same_record() -> None:
    done = {"a": marker("a", 5, "ck-a"), "b": marker("b", 7, "ck-b")}
    one = groups.record_for("g", done)
    other = groups.record_for("g", dict(reversed(list(done.items()))))
    assert one == other and one.members == {"a": "ck-a", "b": "ck-b"} and one.at == 7
    assert groups.round_of({"a": "ck-a", "b": "ck-x"}) != one.round
    with pytest.raises(ValueError):
        groups.record_for("g", {"a": marker("a", 1)})


def test_a_member_continues_from_the_newest_record_it_has_not_continued_from() -> None:
    old = groups.GroupRecord(group="g", round="r1", at=1, members={"a": "ck1", "b": "ck2"})
    new = groups.GroupRecord(group="g", round="r2", at=2, members={"a": "ck3", "b": "ck4"})
    assert groups.choose([new, old], "a", lambda ck: False) == new
    assert groups.choose([old, new], "a", lambda ck: ck == "ck3") is None  # continued already: fresh, not older
    assert groups.choose([old, new], "c", lambda ck: False) is None


def test_markers_and_records_in_the_store(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    groups.say(backend, "g", groups.FRESH, "frozen", "a")
    assert groups.wait_for(backend, "g", groups.FRESH, "frozen", 2, time.monotonic() + 0.3) is None
    late = threading.Timer(0.3, groups.say, (backend, "g", groups.FRESH, "frozen", "b"))
    late.start()
    found = groups.wait_for(backend, "g", groups.FRESH, "frozen", 2, time.monotonic() + 10)
    late.join()
    assert found is not None and sorted(found) == ["a", "b"]
    assert groups.heard(backend, "g", "r1", "frozen") == []  # another incarnation's markers are apart
    groups.unsay(backend, "g", groups.FRESH, "a")
    assert [m.job for m in groups.heard(backend, "g", groups.FRESH, "frozen")] == ["b"]
    record = groups.GroupRecord(group="g", round="r1", at=3, members={"a": "ck1", "b": "ck2"})
    groups.commit(backend, record)
    groups.commit(backend, record)  # every member writes it: the same object
    assert groups.records(backend, "g") == [record] and groups.records(backend, "h") == []


def test_containers_get_io_uring_refused_whatever_their_filter() -> None:
    bare = {"ociVersion": "1.0.2", "linux": {"namespaces": []}}
    out = refuse_io_uring(bare)
    assert bare == {"ociVersion": "1.0.2", "linux": {"namespaces": []}}  # not changed in place
    assert out["linux"]["seccomp"] == {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": list(IO_URING), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}]}
    profile = {"linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "io_uring_setup", "io_uring_enter"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["io_uring_register"], "action": "SCMP_ACT_ALLOW"}]}}}
    rules = refuse_io_uring(profile)["linux"]["seccomp"]["syscalls"]
    assert rules == [{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                     {"names": list(IO_URING), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}]
