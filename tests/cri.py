"""Real containerd (Debian's) for the tests of Ferry under Kubernetes: each instance has its own
root, state, sockets and runc root, a RuntimeClass handler ``ferry`` whose runc is
``ferry-runc``, and images built offline: a pause image and an app image of busybox, into which
the tests mount this machine's Python (its /usr, the interpreter's prefix and the virtualenv,
read-only) so that train.py runs in a container without a registry."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from ferry.kube.containerd import install
from ferry.kube.cri import ContainerInfo, ContainerSpec, CriClient, PodSpec
from ferry.store.keys import KeyRing, write_private
from tests.conftest import BIN, WORKLOADS
from tests.oci import archive, make_image

PAUSE = "ferry.local/pause:1"
APP = "ferry.local/app:1"

CONFIG = """version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"""


def require_containerd() -> None:
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "umoci"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: the Kubernetes node tests need Debian's containerd (run ./setup.sh)",
                        pytrace=False)


def build_images(folder: Path) -> dict[str, Path]:
    """oci-archives of the pause image (sleeps) and the app image (busybox, /lib -> usr/lib)."""
    out = {}
    for ref, entrypoint in ((PAUSE, ["/bin/sleep", "2147483647"]), (APP, ["/bin/sh"])):
        name = ref.split("/")[1].split(":")[0]
        layout = folder / f"{name}-layout"
        make_image(layout, "1", extra=("lib", "lib64") if ref == APP else ())
        subprocess.run(["umoci", "config", "--image", f"{layout}:1", f"--config.entrypoint={entrypoint[0]}",
                        *[f"--config.cmd={a}" for a in entrypoint[1:]]], check=True, capture_output=True)
        out[ref] = archive(layout, folder / f"{name}.tar")
    return out


class Containerd:
    """One containerd, started with ``FERRY_CONFIG`` in its environment (what the node agent's
    DaemonSet gives the host's containerd), so that ``ferry-runc`` finds Ferry's store."""

    def __init__(self, ferry_config: Path, images: dict[str, Path]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))  # short: unix socket paths
        self.socket = self.dir / "containerd.sock"
        (self.dir / "cni" / "bin").mkdir(parents=True)
        (self.dir / "cni" / "conf").mkdir(parents=True)
        # the runtime ferry, as the node agent installs it (`ferry pod install-runtime`)
        config = install(CONFIG.format(d=self.dir, pause=PAUSE), str(BIN / "ferry-runc"), str(self.dir / "runc"))
        (self.dir / "config.toml").write_text(config)
        env = {**os.environ, "FERRY_CONFIG": str(ferry_config)}
        self.log = (self.dir / "containerd.log").open("w")
        self.proc = subprocess.Popen(["containerd", "--config", str(self.dir / "config.toml")], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"containerd did not start: {(self.dir / 'containerd.log').read_text()[-2000:]}")
            time.sleep(0.05)
        for ref, tar in images.items():
            subprocess.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", "images", "import", "--base-name",
                            ref.rsplit(":", 1)[0], str(tar)], check=True, capture_output=True)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def bundle(self, container_id: str) -> Path:
        return self.dir / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / container_id

    def client(self) -> CriClient:
        return CriClient(self.endpoint)

    def start(self, pod: PodSpec, box: ContainerSpec) -> str:
        """A pod and its container, started as a kubelet starts them; the container's id."""
        async def go() -> str:
            async with self.client() as cri:
                pod_id = await cri.run_pod(pod)
                cid = await cri.create_container(pod_id, pod, box)
                await cri.start_container(cid)
                return cid

        return asyncio.run(go())

    def info(self, cid: str) -> ContainerInfo:
        async def go() -> ContainerInfo:
            async with self.client() as cri:
                return await cri.container(cid)

        return asyncio.run(go())

    def stop_container(self, cid: str, grace: int = 30) -> None:
        """As the kubelet stops it: SIGTERM, then SIGKILL after ``grace`` seconds."""
        async def go() -> None:
            async with self.client() as cri:
                await cri.stop_container(cid, timeout=grace)

        asyncio.run(go())

    def lines(self, cid: str) -> list[str]:
        """What the container wrote, from the CRI log (``TIME STREAM TAG TEXT`` per line)."""
        path = self.info(cid).log
        if not path.exists():
            return []
        return [line.split(" ", 3)[3] for line in path.read_text().splitlines() if line.count(" ") >= 3]

    def stop(self) -> None:
        async def remove_all() -> None:
            async with self.client() as cri:
                for cid in await cri.containers():
                    await cri.stop_container(cid)
                    await cri.remove_container(cid)
                for pod_id in await cri.pods():  # their pause processes too
                    await cri.stop_pod(pod_id)
                    await cri.remove_pod(pod_id)

        try:
            asyncio.run(remove_all())
        except Exception:  # the shims are killed below either way
            pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"containerd-shim-runc-v2 .*{self.socket}"], check=False)
        subprocess.run(["pkill", "-KILL", "-f", f"ferry-runc .*{self.dir}"], check=False)
        self.log.close()
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split()[4].startswith(str(self.dir))]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def two_nodes(d: Path) -> Iterator[tuple[Path, Containerd, Containerd]]:
    """Ferry's configuration (a store in ``d``) and two containerds standing for two nodes."""
    require_containerd()
    write_private(d / "store.keys", KeyRing.generate().to_json())
    config = d / "ferry.yaml"
    config.write_text(f"data_dir: {d / 'ferry'}\nstore_url: {d / 'store'}\nstore_key_file: {d / 'store.keys'}\n")
    images = build_images(d)
    a = Containerd(config, images)
    try:
        b = Containerd(config, images)
    except BaseException:
        a.stop()
        raise
    try:
        yield config, a, b
    finally:
        a.stop()
        b.stop()


def pod(name: str, annotations: Mapping[str, str], logs: Path, namespace: str = "ml") -> PodSpec:
    uid = uuid.uuid4().hex
    return PodSpec(name=name, namespace=namespace, uid=uid, log_directory=str(logs / uid), annotations=annotations)


def python_container(command: list[str], env: Mapping[str, str] | None = None) -> ContainerSpec:
    """The app image with this machine's Python mounted read-only: its /usr, prefixes, the workloads."""
    here = [str(Path(p)) for p in {sys.prefix, sys.base_prefix, str(WORKLOADS)}]
    return ContainerSpec(name="main", image=APP, command=command, env={"PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
                         mounts=[("/usr", "/usr", True), *((p, p, True) for p in here)])
