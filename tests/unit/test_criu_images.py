"""CRIU image readers on hand-built bytes: the protobuf wire decoder, pagemaps, dump stats.

Also the other pure helpers of ferry.criu (log excerpts, the restore command line).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ferry.criu.errors import ImageError
from ferry.criu.images import (
    IMG_COMMON_MAGIC,
    IMG_SERVICE_MAGIC,
    PAGEMAP_MAGIC,
    PE_LAZY,
    PE_PARENT,
    PE_PRESENT,
    STATS_MAGIC,
    find_page_maps,
    read_dump_stats,
    read_image,
    read_pagemap,
)
from ferry.criu.logs import first_error, log_excerpt
from ferry.criu.protobuf import Message, read_varint
from ferry.criu.runner import CriuRunner
from ferry.criu.sockets import FILES_MAGIC, read_sockets

# -- a tiny protobuf encoder, written for these tests ---------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def f_varint(number: int, value: int) -> bytes:
    return varint(number << 3 | 0) + varint(value)


def f_fixed64(number: int, value: int) -> bytes:
    return varint(number << 3 | 1) + struct.pack("<Q", value)


def f_fixed32(number: int, value: int) -> bytes:
    return varint(number << 3 | 5) + struct.pack("<I", value)


def f_bytes(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def image(*entries: bytes, magic: int, head: int | None = IMG_COMMON_MAGIC) -> bytes:
    words = ([head] if head is not None else []) + [magic]
    out = b"".join(struct.pack("<I", w) for w in words)
    return out + b"".join(struct.pack("<I", len(e)) + e for e in entries)


def pagemap_entry(vaddr: int, nr_pages: int, *, flags: int | None = None, in_parent: bool | None = None) -> bytes:
    msg = f_varint(1, vaddr) + f_varint(2, nr_pages)
    if in_parent is not None:
        msg += f_varint(3, int(in_parent))
    if flags is not None:
        msg += f_varint(4, flags)
    return msg


# -- protobuf ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32 - 1, 2**63, 2**64 - 1])
def test_varint_round_trip(value: int) -> None:
    data = varint(value) + b"\xff"
    assert read_varint(data, 0) == (value, len(data) - 1)


def test_varint_errors() -> None:
    with pytest.raises(ImageError, match="truncated"):
        read_varint(b"\x80\x80", 0)
    with pytest.raises(ImageError, match="10 bytes"):
        read_varint(b"\xff" * 11, 0)


def test_message_all_wire_types_and_nesting() -> None:
    inner = f_varint(1, 42) + f_bytes(2, b"hi")
    data = (
        f_varint(1, 7)
        + f_fixed64(2, 0x1122334455667788)
        + f_fixed32(3, 0xDEADBEEF)
        + f_bytes(4, inner)
        + f_bytes(5, b"")
        + f_varint(6, 1)
        + f_varint(6, 2)
        + f_varint(1000, 5)  # an unknown, large field number is kept and ignored
    )
    msg = Message.parse(data)
    assert msg.uint(1) == 7
    assert msg.uint(2) == 0x1122334455667788
    assert msg.uint(3) == 0xDEADBEEF
    nested = msg.message(4)
    assert nested is not None and nested.uint(1) == 42 and nested.raw(2) == b"hi"
    assert msg.raw(5) == b""
    assert msg.fields[6] == [1, 2] and msg.uint(6) == 2  # last one wins
    assert msg.uint(9, 11) == 11 and msg.optional_uint(9) is None and msg.message(9) is None
    assert msg.boolean(6) and not msg.boolean(9)
    with pytest.raises(ImageError, match="required field 9"):
        msg.uint(9)
    with pytest.raises(ImageError, match="expected a number"):
        msg.uint(4)
    with pytest.raises(ImageError, match="expected a message"):
        msg.message(1)


def test_repeated_messages_merge_or_list() -> None:
    msg = Message.parse(f_bytes(1, f_varint(1, 1)) + f_bytes(1, f_varint(2, 2)))
    merged = msg.message(1)
    assert merged is not None and merged.uint(1) == 1 and merged.uint(2) == 2
    assert [m.fields for m in msg.messages(1)] == [{1: [1]}, {2: [2]}]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (varint(1 << 3 | 1) + b"\x00" * 7, "64-bit"),
        (varint(1 << 3 | 5) + b"\x00" * 3, "32-bit"),
        (varint(1 << 3 | 2) + varint(5) + b"abc", "length-delimited"),
        (varint(1 << 3 | 3), "wire type 3"),
        (varint(0 << 3 | 0) + varint(1), "field number 0"),
    ],
)
def test_message_rejects_bad_input(data: bytes, match: str) -> None:
    with pytest.raises(ImageError, match=match):
        Message.parse(data)


# -- image framing ----------------------------------------------------------------------------------


def test_read_image_with_and_without_head_magic(tmp_path: Path) -> None:
    entries = [f_varint(1, 3), f_varint(1, 4)]
    new = tmp_path / "new.img"
    new.write_bytes(image(*entries, magic=PAGEMAP_MAGIC))
    old = tmp_path / "old.img"  # images version 1: no head magic
    old.write_bytes(image(*entries, magic=PAGEMAP_MAGIC, head=None))
    for path in (new, old):
        assert [m.uint(1) for m in read_image(path, PAGEMAP_MAGIC)] == [3, 4]


def test_read_image_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.img"
    path.write_bytes(image(magic=STATS_MAGIC))
    with pytest.raises(ImageError, match="expected 0x56084025"):
        read_image(path, PAGEMAP_MAGIC)
    path.write_bytes(image(f_varint(1, 1), magic=PAGEMAP_MAGIC)[:-1])
    with pytest.raises(ImageError, match="truncated"):
        read_image(path, PAGEMAP_MAGIC)
    path.write_bytes(b"\x19\x43")
    with pytest.raises(ImageError, match="truncated"):
        read_image(path, PAGEMAP_MAGIC)
    with pytest.raises(ImageError, match="cannot read"):
        read_image(tmp_path / "absent.img", PAGEMAP_MAGIC)


# -- pagemaps ---------------------------------------------------------------------------------------


def test_pagemap_spans_keep_only_pages_stored_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pagemap-1.img"
    path.write_bytes(
        image(
            f_varint(1, 9),  # pagemap_head.pages_id
            pagemap_entry(0x1000, 2, flags=PE_PRESENT),
            pagemap_entry(0x5000, 1, flags=PE_PARENT),  # in the parent snapshot
            pagemap_entry(0x7000, 3, flags=PE_LAZY),  # served later by a page server
            pagemap_entry(0xA000, 4, flags=PE_LAZY | PE_PRESENT),  # lazy, but also written
            pagemap_entry(0x20000, 1, in_parent=True),  # old image: in_parent, no flags
            pagemap_entry(0x30000, 5),  # old image: no flags at all -> present
            pagemap_entry(0x7FFF_FFFF_F000, 1, in_parent=False),  # old image, in_parent false
            magic=PAGEMAP_MAGIC,
        )
    )
    pm = read_pagemap(path)
    assert pm.pages_id == 9 and pm.pages_file == "pages-9.img"
    assert [e.flags for e in pm.entries] == [
        PE_PRESENT,
        PE_PARENT,
        PE_LAZY,
        PE_LAZY | PE_PRESENT,
        PE_PARENT,
        PE_PRESENT,
        PE_PRESENT,
    ]
    assert pm.as_spans() == [(0x1000, 2), (0xA000, 4), (0x30000, 5), (0x7FFF_FFFF_F000, 1)]


def test_pagemap_of_criu_4_2_counts_pages_in_its_64_bit_field(tmp_path: Path) -> None:
    path = tmp_path / "pagemap-2.img"
    wide = f_varint(1, 0x40000) + f_varint(2, 0) + f_varint(4, PE_PRESENT) + f_varint(5, 2**33)
    path.write_bytes(image(f_varint(1, 2), wide, pagemap_entry(0x9000, 7, flags=PE_PRESENT), magic=PAGEMAP_MAGIC))
    assert read_pagemap(path).as_spans() == [(0x40000, 2**33), (0x9000, 7)]  # 4.2's nr_pages; 4.1's field 2


def test_pagemap_needs_a_head(tmp_path: Path) -> None:
    path = tmp_path / "pagemap-1.img"
    path.write_bytes(image(magic=PAGEMAP_MAGIC))
    with pytest.raises(ImageError, match="head"):
        read_pagemap(path)


def test_find_page_maps(tmp_path: Path) -> None:
    (tmp_path / "pagemap-1.img").write_bytes(
        image(f_varint(1, 1), pagemap_entry(0x1000, 1, flags=PE_PRESENT), magic=PAGEMAP_MAGIC)
    )
    (tmp_path / "pagemap-shmem-77.img").write_bytes(
        image(f_varint(1, 2), pagemap_entry(0, 3, flags=PE_PRESENT), magic=PAGEMAP_MAGIC)
    )
    (tmp_path / "pagemap-2.img").write_bytes(image(f_varint(1, 3), magic=PAGEMAP_MAGIC))
    (tmp_path / "pages-1.img").write_bytes(b"\0" * 4096)
    (tmp_path / "core-1.img").write_bytes(b"not a pagemap")
    assert find_page_maps(tmp_path) == {
        "pages-1.img": [(0x1000, 1)],
        "pages-2.img": [(0, 3)],
        "pages-3.img": [],
    }
    (tmp_path / "pagemap-9.img").write_bytes(image(f_varint(1, 1), magic=PAGEMAP_MAGIC))
    with pytest.raises(ImageError, match="second pagemap"):
        find_page_maps(tmp_path)


# -- dump stats -------------------------------------------------------------------------------------


def test_read_dump_stats(tmp_path: Path) -> None:
    dump = (
        f_varint(1, 410)
        + f_varint(2, 44_000)
        + f_varint(3, 1600)
        + f_varint(4, 350)
        + f_varint(5, 2**33)
        + f_varint(6, 0)
        + f_varint(7, 60)
        + f_varint(8, 0)
        + f_varint(9, 5)
        + f_varint(10, 2)
    )
    path = tmp_path / "stats-dump"
    path.write_bytes(image(f_bytes(1, dump), magic=STATS_MAGIC, head=IMG_SERVICE_MAGIC))
    stats = read_dump_stats(path)
    assert stats.freezing_time_us == 410
    assert stats.frozen_time_us == 44_000
    assert stats.memdump_time_us == 1600
    assert stats.memwrite_time_us == 350
    assert stats.pages_scanned == 2**33
    assert stats.pages_written == 60
    assert stats.pages_lazy == 5


def test_read_dump_stats_of_a_restore_file(tmp_path: Path) -> None:
    path = tmp_path / "stats-restore"
    path.write_bytes(image(f_bytes(2, f_varint(1, 0)), magic=STATS_MAGIC, head=IMG_SERVICE_MAGIC))
    with pytest.raises(ImageError, match="no dump statistics"):
        read_dump_stats(path)


# -- other pure helpers -----------------------------------------------------------------------------


def test_log_excerpt_keeps_errors_warnings_and_tail() -> None:
    lines = [f"(00.{i:06d}) line {i}" for i in range(100)]
    lines[5] = "(00.000005) Warn  (criu/kerndat.c:1): something odd"
    lines[50] = "(00.000050) Error (criu/cr-dump.c:2): it broke"
    excerpt = log_excerpt(lines)
    assert excerpt == [lines[5], lines[50], *lines[90:]]
    assert first_error(excerpt) == lines[50]
    assert first_error(["fine"]) is None


def test_log_excerpt_is_bounded() -> None:
    lines = [f"Error {i}" for i in range(100)] + [f"tail {i}" for i in range(10)]
    excerpt = log_excerpt(lines)
    assert len(excerpt) == 30
    assert excerpt[-10:] == lines[-10:]
    assert excerpt[0] == "Error 80"  # the errors nearest the end are kept


def test_restore_command() -> None:
    argv = CriuRunner("/opt/criu/bin/criu").restore_command(
        Path("/imgs"), Path("/jobs/j/restore.pid"), {7: "/jobs/a/stderr", 5: "/jobs/a/stdout"}, ["--tcp-close"]
    )
    assert argv == [
        "/opt/criu/bin/criu",
        "restore",
        "-D",
        "/imgs",
        "-o",
        "restore.log",
        "-v4",
        "-d",
        "--pidfile",
        "/jobs/j/restore.pid",
        "--inherit-fd",
        "fd[5]:jobs/a/stdout",
        "--inherit-fd",
        "fd[7]:jobs/a/stderr",
        "--root",  # the job's own mount namespace, built over this host's root (runner.RESTORE_MOUNTS)
        "/",
        "--external",
        "mnt[]",
        "--tcp-close",
    ]


def test_restore_command_hands_over_external_files_by_their_key() -> None:
    argv = CriuRunner("criu").restore_command(Path("/imgs"), Path("/p"), {5: "file[1b:3f2]", 7: "/jobs/a/stderr"})
    assert argv[argv.index("fd[5]:file[1b:3f2]") - 1] == "--inherit-fd"
    assert "fd[7]:jobs/a/stderr" in argv


# -- sockets ----------------------------------------------------------------------------------------


def inet_sk(*, family: int, proto: int, state: int, src: tuple[list[int], int], dst: tuple[list[int], int],
            packed: bool = False) -> bytes:
    msg = f_varint(1, 7) + f_varint(2, 99) + f_varint(3, family) + f_varint(4, 1) + f_varint(5, proto)
    msg += f_varint(6, state) + f_varint(7, src[1]) + f_varint(8, dst[1])
    for number, words in ((11, src[0]), (12, dst[0])):
        if packed:
            msg += f_bytes(number, b"".join(varint(w) for w in words))
        else:
            msg += b"".join(f_varint(number, w) for w in words)
    return msg


def test_the_sockets_of_a_dump_are_read_from_its_files_image(tmp_path: Path) -> None:
    loopback = struct.unpack("<I", bytes([127, 0, 0, 1]))[0]
    v6 = list(struct.unpack("<4I", bytes(15) + b"\x01"))
    listen = inet_sk(family=2, proto=6, state=10, src=([loopback], 8080), dst=([0], 0))
    conn = inet_sk(family=2, proto=6, state=1, src=([loopback], 8080), dst=([loopback], 40112), packed=True)
    udp6 = inet_sk(family=10, proto=17, state=7, src=(v6, 53), dst=([0, 0, 0, 0], 0))
    reg = f_varint(1, 1) + f_varint(2, 3)  # a regular file: not a socket
    entries = [f_varint(1, 4) + f_varint(2, i) + f_bytes(4, sk) for i, sk in enumerate((listen, conn, udp6))]
    (tmp_path / "files.img").write_bytes(image(reg, *entries, magic=FILES_MAGIC))
    assert [str(s) for s in read_sockets(tmp_path)] == [
        "tcp 127.0.0.1:8080 listen", "tcp 127.0.0.1:8080 <-> 127.0.0.1:40112 established", "udp [::1]:53 close"]
    assert read_sockets(tmp_path / "none") == []
