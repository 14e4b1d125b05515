"""Ferry under Kubernetes' own pods, measured against real containerd (Debian's, through its CRI
as a kubelet drives it; the same testbed as tests/integration/test_kube_node.py):

- **checkpoint**: ``ferry pod checkpoint`` of a running container (``runc checkpoint
  --leave-running`` plus the overlay's changes, into the store) against a raw ``runc checkpoint
  --leave-running`` of the same container to a local folder, alternating which goes first;
- **warm start** (KServe's warm checkpoints): a model server's time from StartContainer to its
  first answer, started cold (import torch, build and warm up the model) against restored from a
  checkpoint of a ready replica (``ferry.dev/restore-from: JOB/CHECKPOINT``), checking that both
  give the same answer.

    python bench/kube.py [--mib 256] [--repeat 3] [--json out.json] [--md out.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from benchkit import emit, machine, median, run_directory, uptime, wait_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry.kube.annotations import RESTORE_FROM  # noqa: E402
from ferry.kube.cri import ContainerSpec, PodSpec  # noqa: E402
from ferry.kube.podimages import checkpoint, runc_base  # noqa: E402
from ferry.store.keys import KeyRing, write_private  # noqa: E402
from ferry.store.url import open_store  # noqa: E402
from tests.cri import APP, Containerd, build_images  # noqa: E402

HOLDER = """
import os, sys, time
held = [os.urandom(1 << 20) for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
while True:
    time.sleep(1)
"""

SERVER = """
import http.server, os, sys, torch
torch.set_num_threads(1)
torch.manual_seed(0)
width, layers = int(sys.argv[2]), int(sys.argv[3])
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])  # loading the model
x = torch.randn(8, width)
with torch.no_grad():
    for _ in range(10):  # warm-up
        model(x)
    answer = f"{float(model(x).sum()):.6f}".encode()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def mounts() -> list[tuple[str, str, bool]]:
    here = {sys.prefix, sys.base_prefix}
    return [("/usr", "/usr", True), *((p, p, True) for p in sorted(here))]


def start(c: Containerd, name: str, command: list[str], annotations: dict[str, str], logs: Path) -> str:
    pod = PodSpec(name=name, namespace="bench", uid=uuid.uuid4().hex, log_directory=str(logs / name),
                  annotations=annotations)
    return c.start(pod, ContainerSpec(name="main", image=APP, command=command, env={"PYTHONDONTWRITEBYTECODE": "1"},
                                      mounts=mounts()))


def checkpoint_part(node: Containerd, store: Any, mib: int, repeat: int, run: Path) -> dict[str, Any]:
    cid = start(node, f"hold-{uuid.uuid4().hex[:6]}", [sys.executable, "-c", HOLDER, str(mib)], {}, run / "logs")
    wait_for(lambda: "ready" in node.lines(cid), 120, "the holder to fill its memory")
    root = node.info(cid).runc_root
    raw_ms: list[float] = []
    ferry_ms: list[float] = []
    for i in range(repeat):
        for which in (("raw", "ferry") if i % 2 == 0 else ("ferry", "raw")):
            if which == "raw":
                images = Path(tempfile.mkdtemp(prefix="raw-", dir=run))
                started = time.monotonic()
                subprocess.run([*runc_base(root), "checkpoint", "--leave-running", "--image-path", str(images),
                                "--work-path", str(images) + "-work", cid], check=True, capture_output=True)
                raw_ms.append((time.monotonic() - started) * 1000)
                shutil.rmtree(images)
                shutil.rmtree(str(images) + "-work", ignore_errors=True)
            else:
                started = time.monotonic()
                checkpoint(store, root=root, container_id=cid, job="bench.hold", work=run / "work")
                ferry_ms.append((time.monotonic() - started) * 1000)
    node.stop_container(cid, grace=1)
    return {"mib": mib, "raw_ms": raw_ms, "ferry_ms": ferry_ms, "raw_median_ms": median(raw_ms),
            "ferry_median_ms": median(ferry_ms), "ratio": median(ferry_ms) / median(raw_ms)}


def answer(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=0.5) as reply:
            return str(reply.read().decode())
    except OSError:
        return None


def time_to_answer(port: int, timeout: float = 300) -> tuple[float, str]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        got = answer(port)
        if got is not None:
            return (time.monotonic() - started) * 1000, got
        time.sleep(0.02)
    raise TimeoutError("the model server did not answer")


def warm_part(node: Containerd, store: Any, repeat: int, width: int, layers: int, run: Path) -> dict[str, Any]:
    from ferry.common.ports import free_port

    cold_ms: list[float] = []
    warm_ms: list[float] = []
    answers: set[str] = set()
    for i in range(repeat):
        port = free_port()
        command = [sys.executable, "-c", SERVER, str(port), str(width), str(layers)]
        started = time.monotonic()
        cid = start(node, f"serve-{i}", command, {}, run / "logs")
        _, got = time_to_answer(port)
        cold_ms.append((time.monotonic() - started) * 1000)
        answers.add(got)
        done = checkpoint(store, root=node.info(cid).runc_root, container_id=cid, job=f"bench.serve-{i}",
                          work=run / "w")
        node.stop_container(cid, grace=1)
        started = time.monotonic()
        restored = start(node, f"serve-{i}-warm", command, {RESTORE_FROM: f"{done.job}/{done.checkpoint}"},
                         run / "logs")
        _, got = time_to_answer(port)
        warm_ms.append((time.monotonic() - started) * 1000)
        answers.add(got)
        node.stop_container(restored, grace=1)
    if len(answers) != 1:
        raise RuntimeError(f"the restored replica answered differently: {answers}")
    return {"width": width, "layers": layers, "cold_ms": cold_ms, "warm_ms": warm_ms,
            "cold_median_ms": median(cold_ms), "warm_median_ms": median(warm_ms),
            "saved_median_ms": median(cold_ms) - median(warm_ms), "ratio": median(warm_ms) / median(cold_ms)}


def markdown(r: dict[str, Any]) -> str:
    c, w = r["checkpoint"], r["warm"]
    fmt = ", ".join
    return "\n".join([
        f"Machine: {r['machine']['cores']} cores, {r['machine']['memory_gib']} GiB, kernel {r['machine']['kernel']},"
        f" {r['machine']['criu']}; load before: {r['load_before']}; after: {r['load_after']}",
        "",
        "| metric | raw | Ferry | ratio |",
        "| --- | --- | --- | --- |",
        f"| checkpoint, leave-running, {c['mib']} MiB held (ms; samples raw {fmt(f'{x:.0f}' for x in c['raw_ms'])};"
        f" Ferry {fmt(f'{x:.0f}' for x in c['ferry_ms'])}) | {c['raw_median_ms']:.0f} | {c['ferry_median_ms']:.0f}"
        f" | {c['ratio']:.2f}x |",
        f"| model server's first answer (ms; cold {fmt(f'{x:.0f}' for x in w['cold_ms'])}; from a warm checkpoint"
        f" {fmt(f'{x:.0f}' for x in w['warm_ms'])}) | cold {w['cold_median_ms']:.0f} | warm {w['warm_median_ms']:.0f}"
        f" | {w['ratio']:.2f}x (saves {w['saved_median_ms']:.0f} ms) |",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--json")
    p.add_argument("--md")
    p.add_argument("--data-dir")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    load_before, started = uptime(), time.monotonic()
    with run_directory(args.data_dir, args.keep, "ferry-kube-") as run:
        write_private(run / "store.keys", KeyRing.generate().to_json())
        config = run / "ferry.yaml"
        config.write_text(f"data_dir: {run / 'ferry'}\nstore_url: {run / 'store'}\n"
                          f"store_key_file: {run / 'store.keys'}\n")
        store = open_store(str(run / "store"), run / "store.keys")
        containerd = Containerd(config, build_images(run))
        try:
            ckpt = checkpoint_part(containerd, store, args.mib, args.repeat, run)
            warm = warm_part(containerd, store, args.repeat, args.width, args.layers, run)
        finally:
            containerd.stop()
        mach = machine(run)
    result = {"config": vars(args), "machine": mach, "load_before": load_before, "load_after": uptime(),
              "elapsed_s": time.monotonic() - started, "checkpoint": ckpt, "warm": warm}
    emit(result, markdown(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
