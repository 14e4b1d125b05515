"""Where a checkpoint's upload time goes: Ferry's store write of one CRIU-sized pages file against
a plain copy of the same bytes onto the same disk, in one run.

    .venv/bin/python bench/storewrite.py [--mib 1024] [--repeat 3] [--workers 2] [--chunk-kib 512]
                                         [--layout packed,loose] [--json PATH] [--md PATH]

The file (random bytes: process memory rarely compresses) lies where Ferry's nodes dump CRIU
images, /dev/shm. For each repeat, in turn, after a ``sync`` (so that one step's dirty pages are
not written back during the next):

- **copy**: the file copied into a directory beside the store (``shutil.copyfile``): the floor
  for putting those bytes on that disk;
- **store, disk**: ``CheckpointStore.write_checkpoint`` into a sealed local store on that disk,
  cut by virtual address as a pages image is, for each ``--workers``, each ``--chunk-kib`` (the
  store's ``page_chunk``: one chunk per window of the address space) and each ``--layout``
  (``packed``: chunks appended to packs of 16 MiB, what Ferry does; ``loose``: one stored object
  per chunk, as before packs);
- **store, memory**: the same into a store in /dev/shm: the hashing, sealing and file handling
  alone, without the disk.

It reports medians with every sample and each store write as a ratio of the copy of its repeat.
The copy and the store write both leave the bytes in the page cache; neither waits for the disk
(no fsync, as Ferry's local store by default).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchkit import add_run_arguments, emit, machine, machine_line, median, run_directory, uptime

from ferry.store.keys import KeyRing
from ferry.store.local import LocalBackend
from ferry.store.packs import PACK_BYTES
from ferry.store.store import CheckpointStore

PAGES = "pages-1.img"
VADDR = 0x7F0000000000  # where the pages "were": page_maps cut them as a real dump's


def make_source(folder: Path, mib: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PAGES
    with open(path, "wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))
    return path


def settle() -> None:
    subprocess.run(["sync"], check=False)


def timed_copy(src: Path, dest_dir: Path) -> float:
    shutil.rmtree(dest_dir, ignore_errors=True)
    dest_dir.mkdir(parents=True)
    settle()
    t0 = time.monotonic()
    shutil.copyfile(src, dest_dir / PAGES)
    took = time.monotonic() - t0
    shutil.rmtree(dest_dir, ignore_errors=True)
    return took


LAYOUTS = {"packed": PACK_BYTES, "loose": 0}


def timed_store(src: Path, root: Path, kind: tuple[int, int, str], ring: KeyRing, mib: int) -> float:
    workers, chunk_kib, layout = kind
    shutil.rmtree(root, ignore_errors=True)
    settle()
    store = CheckpointStore(LocalBackend(root), workers=workers, keyring=ring, page_chunk=chunk_kib << 10,
                            pack_bytes=LAYOUTS[layout])
    t0 = time.monotonic()
    store.write_checkpoint(job="job-bench", checkpoint="ck-bench", parent=None, src_dir=src.parent,
                           page_maps={PAGES: [(VADDR, mib * 256)]})
    took = time.monotonic() - t0
    shutil.rmtree(root, ignore_errors=True)
    return took


def run(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    shm = Path("/dev/shm") / f"ferry-storewrite-{os.getpid()}"
    ring = KeyRing.generate()
    result: dict[str, Any] = {"config": {"mib": args.mib, "repeat": args.repeat, "workers": args.workers,
                                         "chunk_kib": args.chunk_kib, "layout": args.layout},
                              "machine": machine(data), "load_before": uptime()}
    kinds = [(w, k, layout) for w in args.workers for k in args.chunk_kib for layout in args.layout]
    samples: dict[str, list[float]] = {"copy": []}
    for w, k, layout in kinds:
        samples[f"store_disk_w{w}_{k}k_{layout}"] = []
        samples[f"store_memory_w{w}_{k}k_{layout}"] = []
    try:
        src = make_source(shm / "src", args.mib)
        for i in range(args.repeat):
            samples["copy"].append(timed_copy(src, data / "copy"))
            for kind in kinds:
                name = "w{}_{}k_{}".format(*kind)
                samples[f"store_disk_{name}"].append(timed_store(src, data / "store", kind, ring, args.mib))
                samples[f"store_memory_{name}"].append(timed_store(src, shm / "store", kind, ring, args.mib))
            print(f"repeat {i + 1}/{args.repeat}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples.items()),
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    result["load_after"] = uptime()
    result["samples_s"] = samples
    result["median_s"] = {k: median(v) for k, v in samples.items()}
    result["ratio_to_copy"] = {k: median([s / c for s, c in zip(v, samples["copy"], strict=True)])
                               for k, v in samples.items() if k != "copy"}
    return result


def report(r: dict[str, Any]) -> str:
    cfg = r["config"]
    lines = [f"Store write of one {cfg['mib']} MiB pages file (random bytes) from /dev/shm, "
             f"{cfg['repeat']} repeats, sealed local store:", "",
             "| step | median s | x copy (median of the paired ratios) | samples s |", "|---|---|---|---|"]
    for key, xs in r["samples_s"].items():
        ratio = r["ratio_to_copy"].get(key)
        lines.append(f"| {key} | {r['median_s'][key]:.2f} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                     f"{', '.join(f'{x:.2f}' for x in xs)} |")
    lines += ["", machine_line(r["machine"], r["load_before"], r["load_after"])]
    return "\n".join(lines)


def numbers(text: str) -> list[int]:
    """A comma-separated list of whole numbers of 1 or more (argparse names the option on error)."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"numbers separated by commas, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"numbers of 1 or more, not {text!r}")
    return values


def layouts(text: str) -> list[str]:
    """A comma-separated list of store layouts (argparse names the option on error)."""
    values = text.split(",")
    if not values or any(v not in LAYOUTS for v in values):
        raise argparse.ArgumentTypeError(f"layouts among {', '.join(LAYOUTS)}, not {text!r}")
    return values


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=1024, help="size of the pages file (default 1024)")
    p.add_argument("--repeat", type=int, default=3, help="repeats (default 3)")
    p.add_argument("--workers", type=numbers, default=[2],
                   help="the store's thread counts to measure, e.g. 2,4 (default 2)")
    p.add_argument("--chunk-kib", type=numbers, default=[512],
                   help="pages-image window sizes in KiB to measure, multiples of 4 (default 512)")
    p.add_argument("--layout", type=layouts, default=list(LAYOUTS),
                   help="store layouts to measure: packed (Ferry's), loose (a file per chunk) (default both)")
    add_run_arguments(p)
    args = p.parse_args()
    if args.mib < 1 or args.repeat < 1 or any(k % 4 for k in args.chunk_kib):
        p.error("need --mib >= 1, --repeat >= 1 and --chunk-kib in multiples of 4")
    with run_directory(args.dir, args.keep, "ferry-storewrite-") as data:
        result = run(args, data)
    emit(result, report(result), args.json, args.md)


if __name__ == "__main__":
    main()
