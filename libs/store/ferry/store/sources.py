"""What a checkpoint write reads: its files, their modes and where each is cut into chunks."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ferry.common.errors import UsageError
from ferry.store.chunking import FILE_CHUNK, fixed_spans, page_spans
from ferry.store.manifest import check_relative_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceFile:
    rel: str
    path: Path
    size: int
    mode: int
    spans: list[tuple[int, int]]


def plan_sources(
    src_dir: Path, files: Sequence[str] | None, page_maps: Mapping[str, Sequence[tuple[int, int]]] | None,
    page_chunk: int,
) -> list[SourceFile]:
    """The files to write with their chunk spans; every regular file under src_dir by default (the
    pages images of ``page_maps`` cut in ``page_chunk`` windows of their virtual addresses)."""
    if files is None:
        if not src_dir.is_dir():
            raise UsageError(f"checkpoint source {src_dir} is not a directory")
        rels: list[str] = []
        for folder, _, names in os.walk(src_dir):
            base = Path(folder).relative_to(src_dir)
            rels.extend((base / n).as_posix() for n in names if stat.S_ISREG(os.lstat(Path(folder) / n).st_mode))
        rels.sort()
    else:
        rels = list(files)
    if len(set(rels)) != len(rels):
        raise UsageError("a file is listed twice")
    maps = dict(page_maps or {})
    if unknown := sorted(set(maps) - set(rels)):
        log.warning("ignoring page maps of files that are not written: %s", ", ".join(unknown))
    sources = []
    for rel in rels:
        try:
            check_relative_path(rel)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        path = src_dir / rel
        try:
            st = path.lstat()
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file")
        spans = _page_spans(rel, maps[rel], st.st_size, page_chunk) if rel in maps else None
        if spans is None:
            spans = fixed_spans(st.st_size, FILE_CHUNK)
        sources.append(SourceFile(rel, path, st.st_size, stat.S_IMODE(st.st_mode) & 0o777, spans))
    return sources


def _page_spans(rel: str, entries: Sequence[tuple[int, int]], size: int,
                page_chunk: int) -> list[tuple[int, int]] | None:
    """Spans by virtual address, or None (cut at fixed offsets: only dedup suffers) if the map does not fit."""
    try:
        spans = page_spans(entries, page_chunk)
    except ValueError as exc:
        log.warning("cutting %s at fixed offsets: %s", rel, exc)
        return None
    covered = sum(n for _, n in spans)
    if covered != size:
        log.warning("cutting %s at fixed offsets: its page map covers %d bytes, the file has %d", rel, covered, size)
        return None
    return spans
