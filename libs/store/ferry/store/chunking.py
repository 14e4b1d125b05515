"""Where files are cut into chunks: pure functions returning ``(offset, length)`` spans.

Ordinary files are cut at fixed offsets (``FILE_CHUNK``). CRIU ``pages-*.img`` files are cut by
*virtual address* instead (``PAGE_CHUNK``-aligned windows of the process's address space):

* a page changed in place only changes the chunk of its own window;
* a page added or removed elsewhere shifts every later byte of the file, which would change every
  later fixed-offset chunk, but leaves the content of every other window, and so its chunk and
  hash, as it was: shifted regions still deduplicate.

``tests/unit/test_store_chunking.py`` measures both effects on a synthetic 64 MiB pages file.
"""

from __future__ import annotations

from collections.abc import Sequence

PAGE_SIZE = 4096
PAGE_CHUNK = 512 * 1024  # half the files of 256 KiB on a local store (bench/storewrite.py)
FILE_CHUNK = 1024 * 1024


def fixed_spans(size: int, chunk_size: int) -> list[tuple[int, int]]:
    """Cut ``size`` bytes every ``chunk_size`` bytes; the last span may be shorter."""
    if size < 0 or chunk_size <= 0:
        raise ValueError(f"need size >= 0 and chunk_size > 0, got {size} and {chunk_size}")
    return [(off, min(chunk_size, size - off)) for off in range(0, size, chunk_size)]


def page_spans(
    entries: Sequence[tuple[int, int]], chunk_size: int, page_size: int = PAGE_SIZE
) -> list[tuple[int, int]]:
    """Cut a pages file whose content is the pages of ``entries`` = ``(vaddr, nr_pages)`` in order.

    A cut falls wherever the virtual address of consecutive bytes moves into another
    ``chunk_size``-aligned window, and at the file's start and end. Entries whose addresses go
    backwards are cut by the same rule. As a guard against repeated addresses a span never grows
    past ``chunk_size`` (never reached while addresses increase).
    """
    if chunk_size <= 0 or page_size <= 0:
        raise ValueError(f"need chunk_size > 0 and page_size > 0, got {chunk_size} and {page_size}")
    spans: list[tuple[int, int]] = []
    start = pos = 0
    window = -1
    for vaddr, nr_pages in entries:
        if vaddr < 0 or nr_pages < 0:
            raise ValueError(f"invalid pagemap entry ({vaddr:#x}, {nr_pages})")
        v, end = vaddr, vaddr + nr_pages * page_size
        while v < end:
            w = v // chunk_size
            seg = min(end, (w + 1) * chunk_size) - v
            if w != window or pos - start + seg > chunk_size:
                if pos > start:
                    spans.append((start, pos - start))
                start, window = pos, w
            pos += seg
            v += seg
    if pos > start:
        spans.append((start, pos - start))
    return spans
