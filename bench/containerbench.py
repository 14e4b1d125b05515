"""The container path of ``bench/checkpoint.py --containers``: ``ferry checkpoint`` of a container
(``ferry run --bundle``) against a raw ``runc checkpoint --leave-running`` of an identical one, in
one run.

Both run the same busybox bundle (``tests/oci.py``): a shell that holds MiB of memory in a
variable and then sleeps. The raw container is started the way Ferry's shim starts one (``runc
run --detach`` with its stdout and stderr on pipes that this process reads) and is checkpointed
with the same CRIU options (the nftables network lock, from an ``org.criu.config`` file). Raw and
Ferry alternate which goes first.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from benchkit import dir_bytes, median, wait_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry.criu.binary import find_criu  # noqa: E402
from tests.oci import make_bundle  # noqa: E402  (the bundle the e2e tests run)


class Cli(Protocol):
    def ferry(self, *args: str, timeout: float = 600) -> tuple[float, Any]: ...


def holder(mib: int) -> str:
    """A shell that holds `mib` MiB in a variable, says ready, then sleeps."""
    return f"x=$(head -c {mib * 1048576} /dev/zero | tr '\\\\0' a); echo ready; sleep 100000"


def _runc() -> str:
    found = shutil.which("runc")
    if found is None:
        raise RuntimeError("runc not found: run ./setup.sh")
    return found


class RawContainer:
    """A container run by runc directly, as Ferry's shim runs one."""

    def __init__(self, work: Path, bundle: Path, mib: int) -> None:
        self.work, self.id = work, work.name
        self.bundle = work / "bundle"
        shutil.copytree(bundle, self.bundle, symlinks=True)
        config = json.loads((self.bundle / "config.json").read_text())
        config["process"]["args"] = ["sh", "-c", holder(mib)]
        conf = work / "criu.conf"
        conf.write_text("network-lock nftables\ntcp-established\n")
        config.setdefault("annotations", {})["org.criu.config"] = str(conf)
        (self.bundle / "config.json").write_text(json.dumps(config))
        criu = find_criu("criu")
        self.base = [_runc(), "--root", str(work / "runc"), *(["--criu", criu] if criu else [])]
        self.out = bytearray()

    def start(self) -> None:
        r, w = os.pipe()
        subprocess.run([*self.base, "run", "--detach", "--bundle", str(self.bundle), self.id],
                       stdin=subprocess.DEVNULL, stdout=w, stderr=w, check=True)
        os.close(w)

        def read() -> None:
            while chunk := os.read(r, 65536):
                self.out.extend(chunk)
            os.close(r)

        threading.Thread(target=read, daemon=True).start()

    def checkpoint(self, images: Path) -> float:
        t0 = time.monotonic()
        subprocess.run([*self.base, "checkpoint", "--leave-running", "--image-path", str(images), "--work-path",
                        str(self.work / "dump-work"), self.id], check=True, capture_output=True)
        return time.monotonic() - t0

    def ready(self) -> bool:
        return b"ready" in self.out

    def stop(self) -> None:
        subprocess.run([*self.base, "delete", "--force", self.id], capture_output=True, check=False)


def said_ready(logs: Callable[[str], str], job: str) -> bool:
    return "ready" in logs(job)


def run(cluster: Cli, run_dir: Path, mib: int, repeat: int, logs: Callable[[str], str]) -> dict[str, Any]:
    """`repeat` pairs; returns every sample and the medians."""
    bundle = make_bundle(run_dir / "oci-bundle")
    samples = []
    for i in range(repeat):
        raw = RawContainer(run_dir / f"raw-c{i}", bundle, mib)
        name = f"bench-c{i}"
        sample: dict[str, Any] = {}
        for first in (("raw", "ferry") if i % 2 == 0 else ("ferry", "raw")):
            if first == "raw":
                raw.start()
                wait_for(raw.ready, 300, "the raw container to hold its memory")
                images = run_dir / f"raw-c{i}-images"
                sample["raw_s"] = raw.checkpoint(images)
                sample["raw_image_bytes"] = dir_bytes(images)
                raw.stop()
                shutil.rmtree(images, ignore_errors=True)
            else:
                cluster.ferry("run", "--name", name, "--bundle", str(bundle), "--node", "node-1", "--",
                              "sh", "-c", holder(mib))
                wait_for(functools.partial(said_ready, logs, name), 300, f"{name} to hold its memory")
                wall, record = cluster.ferry("checkpoint", name)
                sample.update(ferry_s=wall, ferry_dump_ms=record["dump_ms"], ferry_upload_ms=record["upload_ms"],
                              ferry_bytes_logical=record["bytes_logical"])
                cluster.ferry("kill", name)
        samples.append(sample)
        print(f"  container {i + 1}/{repeat}: runc checkpoint {sample['raw_s']:.2f} s, ferry checkpoint "
              f"{sample['ferry_s']:.2f} s", file=sys.stderr, flush=True)
    raw_med = median([s["raw_s"] for s in samples])
    ferry_med = median([s["ferry_s"] for s in samples])
    return {"mib": mib, "samples": samples, "raw_median_s": raw_med, "ferry_median_s": ferry_med,
            "ratio": ferry_med / raw_med, "paired_ratios": [s["ferry_s"] / s["raw_s"] for s in samples],
            "ferry_dump_median_ms": median([s["ferry_dump_ms"] for s in samples])}


def markdown(result: dict[str, Any]) -> list[str]:
    def samples(key: str) -> str:
        return ", ".join(f"{s[key]:.2f}" for s in result["samples"])

    return [
        "",
        f"Containers (busybox bundle holding {result['mib']} MiB; `runc checkpoint --leave-running` vs `ferry "
        f"checkpoint` of `ferry run --bundle`; median of {len(result['samples'])}):",
        "",
        "| metric | raw runc | Ferry | ratio |",
        "|---|---|---|---|",
        f"| container checkpoint, leave running: wall time | {result['raw_median_s']:.2f} s [{samples('raw_s')}] | "
        f"{result['ferry_median_s']:.2f} s [{samples('ferry_s')}] | {result['ratio']:.2f}x |",
        f"| Ferry's runc checkpoint inside it (dump_ms) | - | {result['ferry_dump_median_ms']:.0f} ms | - |",
        "",
        f"Paired ratios: {', '.join(f'{x:.2f}' for x in result['paired_ratios'])}.",
    ]
