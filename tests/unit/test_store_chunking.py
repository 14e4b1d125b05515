"""Chunk boundaries: fixed spans, page spans by virtual address, and the dedup they buy."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.store.chunking import FILE_CHUNK, PAGE_CHUNK, PAGE_SIZE, fixed_spans, page_spans
from ferry.store.local import LocalBackend
from ferry.store.store import CheckpointStore

MiB = 1024 * 1024


def _covers(spans: list[tuple[int, int]], size: int) -> None:
    offset = 0
    for start, length in spans:
        assert start == offset and length > 0
        offset += length
    assert offset == size


def _page_addresses(entries: list[tuple[int, int]]) -> list[int]:
    return [vaddr + i * PAGE_SIZE for vaddr, n in entries for i in range(n)]


def test_constants() -> None:
    assert PAGE_CHUNK == 512 * 1024 and MiB == FILE_CHUNK


@pytest.mark.parametrize("size", [0, 1, 4095, MiB, MiB + 1, 5 * MiB - 3])
def test_fixed_spans_cover_the_file(size: int) -> None:
    spans = fixed_spans(size, MiB)
    _covers(spans, size)
    assert all(length == MiB for _, length in spans[:-1])


def test_fixed_spans_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        fixed_spans(10, 0)
    with pytest.raises(ValueError):
        fixed_spans(-1, 10)


def test_page_spans_cut_exactly_where_the_window_changes() -> None:
    rng = random.Random(7)
    chunk = 16 * PAGE_SIZE
    for _ in range(200):
        entries, vaddr = [], rng.randrange(0, 64) * PAGE_SIZE
        for _ in range(rng.randrange(0, 12)):
            if rng.random() < 0.2:  # addresses may go backwards
                vaddr = rng.randrange(0, 64) * PAGE_SIZE
            n = rng.randrange(0, 40)
            entries.append((vaddr, n))
            vaddr += (n + rng.randrange(0, 20)) * PAGE_SIZE
        pages = _page_addresses(entries)
        spans = page_spans(entries, chunk)
        _covers(spans, len(pages) * PAGE_SIZE)
        cuts = {start // PAGE_SIZE for start, _ in spans}
        for i, address in enumerate(pages):
            window_changed = i == 0 or address // chunk != pages[i - 1] // chunk
            if window_changed:
                assert i in cuts
        for start, length in spans:
            first, last = start // PAGE_SIZE, (start + length) // PAGE_SIZE - 1
            assert pages[first] // chunk == pages[last] // chunk
            assert length <= chunk


def test_page_spans_examples() -> None:
    chunk = 4 * PAGE_SIZE
    # one mapping from page 2 to page 9: windows [0,4) [4,8) [8,12)
    assert page_spans([(2 * PAGE_SIZE, 8)], chunk) == [
        (0, 2 * PAGE_SIZE),
        (2 * PAGE_SIZE, 4 * PAGE_SIZE),
        (6 * PAGE_SIZE, 2 * PAGE_SIZE),
    ]
    # two entries in the same window stay one chunk; an empty entry changes nothing
    assert page_spans([(0, 1), (5 * PAGE_SIZE, 0), (2 * PAGE_SIZE, 1)], chunk) == [(0, 2 * PAGE_SIZE)]
    # going back to an earlier window cuts
    assert page_spans([(4 * PAGE_SIZE, 1), (0, 1)], chunk) == [(0, PAGE_SIZE), (PAGE_SIZE, PAGE_SIZE)]
    # a repeated address never makes a span longer than a chunk
    assert page_spans([(0, 4), (0, 4)], chunk) == [(0, 4 * PAGE_SIZE), (4 * PAGE_SIZE, 4 * PAGE_SIZE)]
    assert page_spans([], chunk) == []
    with pytest.raises(ValueError):
        page_spans([(0, -1)], chunk)


def _pages_file(memory: dict[int, bytes], entries: list[tuple[int, int]]) -> bytes:
    return b"".join(memory[a] for a in _page_addresses(entries))


def _new_fraction(old: bytes, new: bytes, old_spans: list[tuple[int, int]], new_spans: list[tuple[int, int]]) -> float:
    mv_old, mv_new = memoryview(old), memoryview(new)
    known = {hashlib.sha256(mv_old[o : o + n]).digest() for o, n in old_spans}
    fresh = sum(n for o, n in new_spans if hashlib.sha256(mv_new[o : o + n]).digest() not in known)
    return fresh / len(new)


def test_page_spans_dedup_in_place_changes_and_shifts() -> None:
    """64 MiB of pages; 5% rewritten in 1 MiB runs; one page inserted near the start."""
    rng = random.Random(2024)
    sizes = [3000, 5000, 1, 4000, 4383]  # pages per mapping, 16384 in all = 64 MiB
    entries, vaddr = [], 0x7F0000001000
    for n in sizes:
        entries.append((vaddr, n))
        vaddr += (n + rng.randrange(1, 300)) * PAGE_SIZE
    pages = _page_addresses(entries)
    memory = {a: rng.randbytes(PAGE_SIZE) for a in pages}
    old = _pages_file(memory, entries)
    assert len(old) == 64 * MiB

    changed = dict(memory)
    runs = -(-len(pages) * 5 // 100 // 256)  # 1 MiB = 256 pages, at least 5% in all
    for _ in range(runs):
        first = rng.randrange(0, len(pages) - 256)  # a 4 KiB-aligned file offset
        for a in pages[first : first + 256]:
            changed[a] = rng.randbytes(PAGE_SIZE)
    extra = entries[0][0] + (sizes[0] + 1) * PAGE_SIZE  # in the gap after the first mapping
    changed[extra] = rng.randbytes(PAGE_SIZE)
    new_entries = [entries[0], (extra, 1), *entries[1:]]
    new = _pages_file(changed, new_entries)
    assert len(new) == len(old) + PAGE_SIZE

    by_address = _new_fraction(old, new, page_spans(entries, PAGE_CHUNK), page_spans(new_entries, PAGE_CHUNK))
    by_offset = _new_fraction(old, new, fixed_spans(len(old), FILE_CHUNK), fixed_spans(len(new), FILE_CHUNK))
    assert by_address < 0.10, by_address
    assert by_offset > 0.50, by_offset


def test_a_store_cuts_pages_images_in_its_own_windows(tmp_path: Path) -> None:
    """``page_chunk`` sets the window (bench/storewrite.py compares sizes); a size that is not a
    whole number of pages is refused."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "pages-1.img").write_bytes(bytes(300 * PAGE_SIZE))
    maps = {"pages-1.img": [(0x7F0000000000, 300)]}
    sizes = {}
    for kib in (256, 512):
        store = CheckpointStore(LocalBackend(tmp_path / f"store-{kib}"), page_chunk=kib << 10)
        result = store.write_checkpoint(job="j", checkpoint="c", parent=None, src_dir=src, page_maps=maps)
        sizes[kib] = [c.size // PAGE_SIZE for c in result.manifest.files[0].chunks]
    assert sizes == {256: [64, 64, 64, 64, 44], 512: [128, 128, 44]}
    with pytest.raises(UsageError, match="multiple of 4096"):
        CheckpointStore(LocalBackend(tmp_path / "bad"), page_chunk=1000)
