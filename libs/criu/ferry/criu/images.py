"""Readers for the few CRIU image files Ferry looks into: pagemaps and dump statistics.

Layout (criu/image.c, criu/protobuf.c, criu/include/magic.h, CRIU 4.1): a protobuf image starts
with two little-endian u32 words, the head magic (``IMG_COMMON_MAGIC``, or ``IMG_SERVICE_MAGIC`` for
service files such as ``stats-dump``) then the image's own magic; images of the old V1 format
(and the inventory) have only the image magic. Then come entries, each a u32 length followed by
that many bytes of one protobuf message. Raw images (``pages-<id>.img``) have no magic at all.

A pagemap image (``pagemap-<pid>.img``, ``pagemap-shmem-<id>.img``) holds one ``pagemap_head``
(``pages_id``: which ``pages-<id>.img`` holds its pages) then ``pagemap_entry`` messages. An entry's
pages are stored in the pages file only when its flags have ``PE_PRESENT``; ``PE_PARENT`` pages live
in a parent snapshot and ``PE_LAZY`` ones without ``PE_PRESENT`` are served later by a page server
(criu/include/pagemap.h, page-xfer.c: ``ppb_xfer_flags``, ``dump_holes``). Entries written before
the ``flags`` field existed count as ``PE_PARENT`` when ``in_parent`` is set and as ``PE_PRESENT``
otherwise (criu/pagemap.c: ``init_compat_pagemap_entry``). Present entries are written in the same
order as their pages, so the spans in entry order lay out the pages file from offset 0.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ferry.criu.errors import ImageError
from ferry.criu.protobuf import Message

__all__ = [
    "IMG_COMMON_MAGIC",
    "IMG_SERVICE_MAGIC",
    "PAGEMAP_MAGIC",
    "PAGE_SIZE",
    "PE_LAZY",
    "PE_PARENT",
    "PE_PRESENT",
    "STATS_MAGIC",
    "DumpStats",
    "Pagemap",
    "PagemapEntry",
    "find_page_maps",
    "read_dump_stats",
    "read_image",
    "read_pagemap",
]

IMG_COMMON_MAGIC = 0x54564319
IMG_SERVICE_MAGIC = 0x55105940
PAGEMAP_MAGIC = 0x56084025
STATS_MAGIC = 0x57093306

PE_PARENT = 1 << 0
PE_LAZY = 1 << 1
PE_PRESENT = 1 << 2

PAGE_SIZE = 4096

_U32 = struct.Struct("<I")
_PAGEMAP_NAME = re.compile(r"pagemap-(?:shmem-)?\d+\.img")


def read_image(path: Path, magic: int) -> list[Message]:
    """Check the magic words of a protobuf image and return its entries, decoded lazily per field."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read CRIU image {path}: {exc.strerror}") from exc
    pos = 0

    def word() -> int:
        nonlocal pos
        if pos + 4 > len(data):
            raise ImageError(f"{path.name}: truncated image (at byte {pos})")
        (value,) = _U32.unpack_from(data, pos)
        pos += 4
        return int(value)

    first = word()
    if first in (IMG_COMMON_MAGIC, IMG_SERVICE_MAGIC):
        first = word()
    if first != magic:
        raise ImageError(f"{path.name}: image magic {first:#010x}, expected {magic:#010x}")
    entries = []
    view = memoryview(data)
    while pos < len(data):
        size = word()
        if pos + size > len(data):
            raise ImageError(f"{path.name}: entry of {size} bytes at byte {pos - 4} is truncated")
        entries.append(Message.parse(view[pos : pos + size]))
        pos += size
    return entries


class PagemapEntry(BaseModel):
    """One run of pages; ``flags`` are the effective PE_* flags (old images normalised)."""

    model_config = ConfigDict(frozen=True)

    vaddr: int
    nr_pages: int
    flags: int

    @property
    def in_pages_file(self) -> bool:
        return bool(self.flags & PE_PRESENT)


class Pagemap(BaseModel):
    """A decoded ``pagemap-*.img``."""

    model_config = ConfigDict(frozen=True)

    pages_id: int
    entries: list[PagemapEntry]

    @property
    def pages_file(self) -> str:
        return f"pages-{self.pages_id}.img"

    def as_spans(self) -> list[tuple[int, int]]:
        """(vaddr, nr_pages) of the entries stored in the pages file, in file order."""
        return [(e.vaddr, e.nr_pages) for e in self.entries if e.in_pages_file]


def _entry_flags(msg: Message) -> int:
    flags = msg.optional_uint(4)
    if msg.boolean(3):
        return (flags or 0) | PE_PARENT
    return PE_PRESENT if flags is None else flags


def _nr_pages(msg: Message) -> int:
    """CRIU 4.2 writes the count to ``nr_pages`` (field 5, 64 bits) and 0 to the old 32-bit field 2,
    now ``compat_nr_pages``; older CRIUs write field 2 only."""
    wide = msg.optional_uint(5)
    return wide if wide is not None else msg.uint(2)


def read_pagemap(path: Path) -> Pagemap:
    entries = read_image(path, PAGEMAP_MAGIC)
    if not entries:
        raise ImageError(f"{path.name}: pagemap without a head entry")
    head, rest = entries[0], entries[1:]
    return Pagemap(
        pages_id=head.uint(1),
        entries=[PagemapEntry(vaddr=m.uint(1), nr_pages=_nr_pages(m), flags=_entry_flags(m)) for m in rest],
    )


class DumpStats(BaseModel):
    """``stats-dump``: times in microseconds, counts in pages."""

    model_config = ConfigDict(frozen=True)

    freezing_time_us: int
    frozen_time_us: int
    memdump_time_us: int
    memwrite_time_us: int
    pages_scanned: int
    pages_written: int
    pages_skipped_parent: int = 0
    pages_lazy: int = 0


def read_dump_stats(path: Path) -> DumpStats:
    entries = read_image(path, STATS_MAGIC)
    if len(entries) != 1:
        raise ImageError(f"{path.name}: expected one stats entry, found {len(entries)}")
    dump = entries[0].message(1)
    if dump is None:
        raise ImageError(f"{path.name}: no dump statistics (is it a restore stats file?)")
    return DumpStats(
        freezing_time_us=dump.uint(1),
        frozen_time_us=dump.uint(2),
        memdump_time_us=dump.uint(3),
        memwrite_time_us=dump.uint(4),
        pages_scanned=dump.uint(5),
        pages_skipped_parent=dump.uint(6, 0),
        pages_written=dump.uint(7),
        pages_lazy=dump.uint(9, 0),
    )


def find_page_maps(images_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Map each ``pages-<id>.img`` name to the spans of the pagemap that points at it."""
    result: dict[str, list[tuple[int, int]]] = {}
    for path in sorted(images_dir.iterdir()):
        if not _PAGEMAP_NAME.fullmatch(path.name):
            continue
        pagemap = read_pagemap(path)
        if pagemap.pages_file in result:
            raise ImageError(f"{path.name}: a second pagemap points at {pagemap.pages_file}")
        result[pagemap.pages_file] = pagemap.as_spans()
    return result
