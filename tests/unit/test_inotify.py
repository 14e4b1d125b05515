"""inotify from Python (ferry.criu.inotify): the events as the kernel queues them, parsed as bytes,
and a real instance's watches; and the first write a live move's target waits for
(ferry.criu.progress.FirstWrite), seen through it or, without it, by polling sizes."""

import struct
import time
from pathlib import Path

import pytest

from ferry.criu.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_MOVED_TO,
    Event,
    Inotify,
    parse,
)
from ferry.criu.progress import FirstWrite


def raw(wd: int, mask: int, name: bytes = b"", pad: int = 0) -> bytes:
    body = name + b"\0" * pad
    return struct.pack("iIII", wd, mask, 0, len(body)) + body


def test_parse_reads_each_event_its_name_without_padding_and_leaves_a_partial_one() -> None:
    data = raw(1, IN_CREATE, b"job-a", pad=3) + raw(2, IN_IGNORED) + raw(1, IN_DELETE, b"j\xc3\xa9", pad=1)
    assert parse(data) == [Event(1, IN_CREATE, "job-a"), Event(2, IN_IGNORED, ""), Event(1, IN_DELETE, "jé")]
    whole = raw(3, IN_MOVED_TO, b"x", pad=15)
    assert parse(whole[:-4]) == [] and parse(whole[:10]) == []


def test_a_watch_sees_entries_made_renamed_and_deleted_and_ends(tmp_path: Path) -> None:
    ino = Inotify.open()
    try:
        assert ino.read() == []  # nothing yet, and no wait
        wd = ino.add(tmp_path, IN_CREATE | IN_DELETE | IN_MOVED_TO)
        assert ino.add(tmp_path, IN_CREATE | IN_DELETE | IN_MOVED_TO) == wd  # the same folder: the same watch
        (tmp_path / "a").write_text("x")
        (tmp_path / "b.tmp").write_text("y")
        (tmp_path / "b.tmp").rename(tmp_path / "b")
        (tmp_path / "a").unlink()
        seen = [(e.wd, e.mask & (IN_CREATE | IN_DELETE | IN_MOVED_TO), e.name) for e in ino.read()]
        assert seen == [(wd, IN_CREATE, "a"), (wd, IN_CREATE, "b.tmp"), (wd, IN_MOVED_TO, "b"), (wd, IN_DELETE, "a")]
        ino.remove(wd)
        assert [e.mask & IN_IGNORED for e in ino.read()] == [IN_IGNORED]
        ino.remove(wd)  # ended already: no error
        with pytest.raises(FileNotFoundError):
            ino.add(tmp_path / "missing", IN_CREATE)
    finally:
        ino.close()


@pytest.mark.parametrize("inotify", [True, False])
def test_first_write_is_the_time_of_the_first_write_after_it_began(tmp_path: Path, inotify: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "stdout"
    out.write_text("before\n")
    if not inotify:
        monkeypatch.setattr(FirstWrite, "_inotify", lambda self: None)
    with FirstWrite([out]) as first:
        assert first.method == ("inotify" if inotify else "poll")
        assert first.wait(0.05) is None
        before = time.time()
        with open(out, "a") as f:
            f.write("after\n")
        at = first.wait(5)
        assert at is not None and before <= at <= time.time()
