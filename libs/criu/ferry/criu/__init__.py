"""Checkpointing Linux process trees with CRIU.

- ``runner``: ``CriuRunner`` (check, dump, restore command line); ``treekill``: ``kill_tree``
- ``launch``: start or restore a workload under its per-job shim (``python -m ferry.criu.shim``)
- ``jobdir``: the node-local directory of one job and the state its shim records
- ``images``: readers for pagemap and dump statistics images (pure code)
- ``errors``: ``CriuError`` and its subclasses
"""

from ferry.criu.errors import CriuError, CriuMissing, DumpFailed, ImageError, LaunchFailed, RestoreFailed
from ferry.criu.images import DumpStats, Pagemap, PagemapEntry, find_page_maps, read_dump_stats, read_pagemap
from ferry.criu.jobdir import ExitInfo, JobDir, ShimInfo
from ferry.criu.launch import launch, restore
from ferry.criu.runner import CriuRunner, CriuStatus, DumpResult
from ferry.criu.treekill import kill_tree

__all__ = [
    "CriuError",
    "CriuMissing",
    "CriuRunner",
    "CriuStatus",
    "DumpFailed",
    "DumpResult",
    "DumpStats",
    "ExitInfo",
    "ImageError",
    "JobDir",
    "LaunchFailed",
    "Pagemap",
    "PagemapEntry",
    "RestoreFailed",
    "ShimInfo",
    "find_page_maps",
    "kill_tree",
    "launch",
    "read_dump_stats",
    "read_pagemap",
    "restore",
]
