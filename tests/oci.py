"""OCI bundles and images for the container tests, built offline: a root filesystem of Debian's
busybox-static, the runtime spec `runc spec` writes, and for images umoci's layout."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

TOOLS = ("sh", "echo", "sleep", "cat", "wc", "seq", "ls", "head", "tr")


def make_rootfs(rootfs: Path, links: tuple[str, ...] = ()) -> None:
    """busybox's tools in /bin; each of ``links`` (lib, lib64) a link to usr/NAME, for a /usr mounted
    from the host."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for tool in TOOLS:
        (rootfs / "bin" / tool).symlink_to("busybox")
    for folder in ("proc", "dev", "sys", "tmp", "data"):
        (rootfs / folder).mkdir(exist_ok=True)
    for link in links:
        (rootfs / link).symlink_to(f"usr/{link}")


def make_bundle(bundle: Path) -> Path:
    """A runnable bundle: busybox, a writable root, no terminal (what `ferry run --bundle` takes)."""
    make_rootfs(bundle / "rootfs")
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["readonly"] = False
    config["process"]["terminal"] = False
    config["process"]["args"] = ["sh", "-c", "echo set by ferry run"]
    (bundle / "config.json").write_text(json.dumps(config, indent=1))
    return bundle


def make_image(layout: Path, tag: str = "latest", extra: tuple[str, ...] = ()) -> Path:
    """An OCI image layout holding one busybox image under `tag` (umoci, no registry)."""
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:{tag}"], check=True)
    work = layout.with_name(layout.name + "-unpacked")
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(work)], check=True, capture_output=True)
    make_rootfs(work / "rootfs", extra)
    subprocess.run(["umoci", "repack", "--image", f"{layout}:{tag}", str(work)], check=True, capture_output=True)
    shutil.rmtree(work)
    return layout


def archive(layout: Path, tar_path: Path) -> Path:
    """The layout as an oci-archive (a tar of the layout's files)."""
    with tarfile.open(tar_path, "w") as tar:
        for item in sorted(layout.iterdir()):
            tar.add(item, arcname=item.name)
    return tar_path
