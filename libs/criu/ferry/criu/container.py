"""OCI containers as jobs (``ferry run --bundle DIR`` or ``--image oci:DIR[:TAG]|oci-archive:TAR[:TAG]``),
run and checkpointed through runc, whose CRIU integration dumps and restores the container's
namespaces and mounts as the runtime spec describes them.

Each job gets a bundle of its own in its job folder (``<job dir>/bundle``): a copy of the user's
bundle, or the image unpacked by umoci. That copy's root filesystem is the container's writable
layer; it travels with every checkpoint as ``rootfs.tar`` beside CRIU's images, with the bundle's
``config.json``, so that a restore on another node rebuilds the same bundle there. runc keeps its
state under ``<job dir>/runc``; the container's id is the job folder's name. CRIU's options that
runc does not pass (the nftables network lock, and for a final checkpoint leave-stopped) come from
a config file named by the bundle's ``org.criu.config`` annotation.

The container's stdout and stderr are pipes that the shim's monitor copies to the job's output
files; runc records them in the images and hands the new pipes over on restore.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ferry.common.errors import UsageError
from ferry.criu.binary import find_criu
from ferry.criu.errors import DumpFailed, ImageError, LaunchFailed, RestoreFailed
from ferry.criu.images import read_dump_stats
from ferry.criu.jobdir import JobDir
from ferry.criu.logs import failure_summary
from ferry.criu.runner import DumpResult
from ferry.criu.sizes import SIZES_FILE, read_sizes

__all__ = [
    "BUNDLE_CONFIG",
    "ROOTFS_TAR",
    "bundle_of",
    "check_bundle",
    "check_image",
    "checkpoint",
    "checkpoint_command",
    "container_id",
    "criu_config",
    "delete_command",
    "prepare_bundle",
    "rebuild_bundle",
    "restore_command",
    "run_command",
    "runc_error",
    "runc_root",
    "save_bundle",
    "work_dir_of",
    "write_criu_config",
    "write_criu_options",
]

BUNDLE_CONFIG = "bundle-config.json"  # the bundle's config.json, in a checkpoint's images
ROOTFS_TAR = "rootfs.tar"  # the container's root filesystem, in a checkpoint's images
CRIU_ANNOTATION = "org.criu.config"


def runc_bin() -> str:
    found = shutil.which("runc")
    if found is None:
        raise LaunchFailed("runc not found: containers need it (./setup.sh installs Debian's runc)")
    return found


def bundle_of(job_dir: JobDir) -> Path:
    return job_dir.path / "bundle"


def runc_root(job_dir: JobDir) -> Path:
    return job_dir.path / "runc"


def container_id(job_dir: JobDir) -> str:
    return job_dir.path.name


def criu_config(job_dir: JobDir) -> Path:
    return job_dir.path / "criu.conf"


# -- bad input, refused before anything starts -----------------------------------------------------


def check_bundle(path: str) -> None:
    """`path` must be an OCI runtime bundle: a folder with a config.json naming a root filesystem."""
    config = Path(path) / "config.json"
    if not Path(path).is_dir():
        raise UsageError(f"--bundle {path}: no such folder")
    try:
        spec = json.loads(config.read_text())
    except FileNotFoundError:
        raise UsageError(f"--bundle {path}: not an OCI bundle (no config.json)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--bundle {path}: config.json is not readable JSON ({exc})") from None
    root = (spec.get("root") or {}).get("path") if isinstance(spec, dict) else None
    if not root or not (Path(path) / root).is_dir():
        raise UsageError(f"--bundle {path}: config.json names no root filesystem that exists")


def _split_ref(ref: str) -> tuple[str, Path, str]:
    kind, sep, rest = ref.partition(":")
    if not sep or kind not in ("oci", "oci-archive"):
        raise UsageError(f"--image {ref}: use oci:LAYOUT_DIR[:TAG] or oci-archive:TAR[:TAG] (no registry is used)")
    path, _, tag = rest.partition(":")
    return kind, Path(path), tag or "latest"


def check_image(ref: str) -> None:
    """`ref` must name a local OCI image layout (or a tar of one) that holds the tag."""
    kind, path, tag = _split_ref(ref)
    if not path.is_absolute():
        raise UsageError(f"--image {ref}: give an absolute path")
    if not path.exists():
        raise UsageError(f"--image {ref}: {path} does not exist")
    try:
        if kind == "oci":
            index = json.loads((path / "index.json").read_text()) if (path / "oci-layout").is_file() else None
        else:
            with tarfile.open(path) as tar:
                names = {m.name.removeprefix("./") for m in tar.getmembers()}
                member = tar.extractfile("index.json") if "index.json" in names and "oci-layout" in names else None
                index = json.loads(member.read()) if member is not None else None
    except (OSError, ValueError, tarfile.TarError, KeyError) as exc:
        raise UsageError(f"--image {ref}: not an OCI image layout ({exc})") from None
    if not isinstance(index, dict):
        raise UsageError(f"--image {ref}: not an OCI image layout (no oci-layout and index.json)")
    tags = {(m.get("annotations") or {}).get("org.opencontainers.image.ref.name") for m in index.get("manifests", [])}
    if tag not in tags:
        raise UsageError(f"--image {ref}: no tag {tag!r} (it has {', '.join(sorted(t for t in tags if t)) or 'none'})")


# -- the job's own bundle ----------------------------------------------------------------------------


def prepare_bundle(job_dir: JobDir, *, bundle: str | None, image: str | None, argv: Sequence[str],
                   env: Mapping[str, str]) -> Path:
    """The job's own bundle in its folder, from the user's bundle (copied) or image (unpacked)."""
    dest = bundle_of(job_dir)
    shutil.rmtree(dest, ignore_errors=True)
    if image:
        _unpack(image, dest, job_dir)
    elif bundle:
        check_bundle(bundle)
        spec = json.loads((Path(bundle) / "config.json").read_text())
        dest.mkdir(parents=True)
        root = Path(bundle) / spec["root"]["path"]
        shutil.copytree(root, dest / "rootfs", symlinks=True)
        spec["root"]["path"] = "rootfs"
        (dest / "config.json").write_text(json.dumps(spec))
    else:
        raise LaunchFailed("a container job needs --bundle or --image")
    _configure(job_dir, dest, argv, env)
    return dest


def _unpack(image: str, dest: Path, job_dir: JobDir) -> None:
    kind, path, tag = _split_ref(image)
    umoci = shutil.which("umoci")
    if umoci is None:
        raise LaunchFailed("umoci not found: --image needs it (./setup.sh installs Debian's umoci)")
    with tempfile.TemporaryDirectory(dir=job_dir.path, prefix=".image-") as tmp:
        layout = path
        if kind == "oci-archive":
            layout = Path(tmp) / "layout"
            with tarfile.open(path) as tar:
                tar.extractall(layout, filter="data")
        done = subprocess.run([umoci, "unpack", "--image", f"{layout}:{tag}", str(dest)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise LaunchFailed(f"umoci unpack {image}: {done.stderr.strip().splitlines()[-1:] or done.returncode}")


def _configure(job_dir: JobDir, dest: Path, argv: Sequence[str], env: Mapping[str, str]) -> None:
    spec = json.loads((dest / "config.json").read_text())
    process = spec.setdefault("process", {})
    process["args"] = list(argv)
    process["terminal"] = False  # stdio are the monitor's pipes
    known = set(env)
    process["env"] = [e for e in process.get("env", []) if e.split("=", 1)[0] not in known]
    process["env"] += [f"{k}={v}" for k, v in env.items()]
    spec.setdefault("annotations", {})[CRIU_ANNOTATION] = str(criu_config(job_dir))
    (dest / "config.json").write_text(json.dumps(spec))
    write_criu_config(job_dir, final=False)


def write_criu_config(job_dir: JobDir, *, final: bool, action_script: Path | None = None) -> None:
    """CRIU's options for the next dump or restore that runc runs: the nftables network lock (its
    default, iptables, is not installed), established connections inside the container, for a
    final checkpoint leave-stopped (the job is killed once the checkpoint is committed), and the
    dump's post-dump script."""
    write_criu_options(criu_config(job_dir), final=final, action_script=action_script)


def write_criu_options(path: Path, *, final: bool = False, action_script: Path | str | None = None) -> Path:
    """The CRIU config file that runc reads through a bundle's ``org.criu.config``: the nftables
    network lock, established connections, leave-stopped for a final dump, the action script."""
    lines = ["network-lock nftables", "tcp-established", *(["leave-stopped"] if final else []),
             *([f"action-script {action_script}"] if action_script else [])]
    path.write_text("\n".join(lines) + "\n")
    return path


RELAY_FILE = "relay.json"  # the monitor's pid and the read ends of the container's output pipes

_DRAIN = """#!{python}
# Generated by ferry.criu.container: on post-dump, while the container is frozen, wait until the
# monitor has copied its output pipes out, then record the output files' sizes.
import fcntl, json, os, struct, sys, termios, time
if os.environ.get("CRTOOLS_SCRIPT_ACTION") != "post-dump":
    sys.exit(0)
relay = json.load(open({relay!r}))
deadline = time.monotonic() + 5
for fd in relay["fds"]:
    pipe = os.open("/proc/%d/fd/%d" % (relay["pid"], fd), os.O_RDONLY | os.O_NONBLOCK)
    while struct.unpack("i", fcntl.ioctl(pipe, termios.FIONREAD, b"\\0" * 4))[0] and time.monotonic() < deadline:
        time.sleep(0.002)
    os.close(pipe)
time.sleep(0.02)  # what the monitor read last, written
with open({out!r}, "w") as f:
    for path in {paths!r}:
        f.write("%d %s\\n" % (os.stat(path).st_size, path))
"""


def _drain_script(job_dir: JobDir, images: Path) -> Path:
    script = job_dir.path / ".ferry-drain.py"
    script.write_text(_DRAIN.format(python=sys.executable, relay=str(job_dir.path / RELAY_FILE),
                                    out=str(images / SIZES_FILE), paths=[str(job_dir.stdout), str(job_dir.stderr)]))
    script.chmod(0o700)
    return script


def save_bundle(job_dir: JobDir, images: Path) -> None:
    """The bundle's config and root filesystem (the writable layer) into a checkpoint's images."""
    bundle = bundle_of(job_dir)
    shutil.copyfile(bundle / "config.json", images / BUNDLE_CONFIG)
    try:
        with tarfile.open(images / ROOTFS_TAR, "w") as tar:
            tar.add(bundle / "rootfs", arcname="rootfs")
    except OSError as exc:
        raise DumpFailed(f"cannot archive the container's root filesystem: {exc}") from exc


def rebuild_bundle(job_dir: JobDir, images: Path) -> Path:
    """The job's bundle on this node from a checkpoint's images (``save_bundle``)."""
    dest = bundle_of(job_dir)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        with tarfile.open(images / ROOTFS_TAR) as tar:
            tar.extractall(dest, filter="fully_trusted")  # the job's own files, device nodes and owners included
        spec = json.loads((images / BUNDLE_CONFIG).read_text())
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise RestoreFailed(f"the checkpoint holds no usable container bundle: {exc}") from exc
    spec.setdefault("annotations", {})[CRIU_ANNOTATION] = str(criu_config(job_dir))
    (dest / "config.json").write_text(json.dumps(spec))
    write_criu_config(job_dir, final=False)
    return dest


# -- a checkpoint ------------------------------------------------------------------------------------


async def checkpoint(job_dir: JobDir, images: Path, *, final: bool) -> DumpResult:
    """``runc checkpoint --leave-running`` of the job's container into `images` (a final one is left
    stopped: the job is killed once it is committed), then its bundle (``save_bundle``).

    runc hands CRIU the output pipes as external, so what they hold is not in the images: while the
    container is frozen a post-dump script waits until the monitor has copied them out, then
    records the output files' sizes (``ferry.criu.sizes``), which then hold everything the
    container wrote before the freeze."""
    images.mkdir(parents=True, exist_ok=True)
    script = _drain_script(job_dir, images)
    write_criu_config(job_dir, final=final, action_script=script)
    command = checkpoint_command(job_dir, images)
    try:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(*command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
        try:
            rc = await proc.wait()
        except asyncio.CancelledError:
            await proc.wait()  # never leave runc's CRIU half done
            raise
        wall_ms = (time.monotonic() - started) * 1000
    finally:
        write_criu_config(job_dir, final=False)
        script.unlink(missing_ok=True)
    work = work_dir_of(images, "dump")
    if rc != 0:
        excerpt, reason = failure_summary(work / "dump.log", runc_error(job_dir, f"runc exited {rc}"))
        shutil.rmtree(work, ignore_errors=True)
        raise DumpFailed(f"runc checkpoint failed: {reason}", log_excerpt=excerpt)
    shutil.rmtree(work, ignore_errors=True)
    sizes = read_sizes(images, [job_dir.stdout, job_dir.stderr])
    await asyncio.to_thread(save_bundle, job_dir, images)
    try:
        stats = read_dump_stats(images / "stats-dump")
    except ImageError:
        stats = None
    return DumpResult(wall_ms=wall_ms, frozen_ms=stats.frozen_time_us / 1000 if stats else None,
                      freezing_ms=stats.freezing_time_us / 1000 if stats else None,
                      memdump_ms=stats.memdump_time_us / 1000 if stats else None,
                      memwrite_ms=stats.memwrite_time_us / 1000 if stats else None,
                      pages_written=stats.pages_written if stats else None, file_sizes=sizes,
                      images_dir=str(images))


# -- runc's command lines ----------------------------------------------------------------------------


def _runc(job_dir: JobDir) -> list[str]:
    """runc with the job's state folder, a log of its own messages (the container's stderr is not
    the place for them) and Ferry's CRIU."""
    criu = find_criu("criu")
    return [runc_bin(), "--root", str(runc_root(job_dir)), "--log", str(runc_log(job_dir)), "--log-format", "json",
            *(["--criu", criu] if criu else [])]


def runc_log(job_dir: JobDir) -> Path:
    return job_dir.path / "runc.log"


def work_dir_of(images: Path, what: str) -> Path:
    """CRIU's logs of a runc dump or restore: beside the images, so that they never travel."""
    return images.with_name(f"{images.name}-{what}")


def run_command(job_dir: JobDir, pidfile: Path) -> list[str]:
    return [*_runc(job_dir), "run", "--detach", "--bundle", str(bundle_of(job_dir)), "--pid-file", str(pidfile),
            container_id(job_dir)]


def restore_command(job_dir: JobDir, images: Path, pidfile: Path) -> list[str]:
    return [*_runc(job_dir), "restore", "--detach", "--bundle", str(bundle_of(job_dir)), "--image-path", str(images),
            "--work-path", str(work_dir_of(images, "restore")), "--pid-file", str(pidfile), container_id(job_dir)]


def checkpoint_command(job_dir: JobDir, images: Path) -> list[str]:
    return [*_runc(job_dir), "checkpoint", "--leave-running", "--image-path", str(images), "--work-path",
            str(work_dir_of(images, "dump")), container_id(job_dir)]


def delete_command(job_dir: JobDir) -> list[str]:
    return [*_runc(job_dir), "delete", "--force", container_id(job_dir)]


def runc_error(job_dir: JobDir, fallback: str) -> str:
    """The last error runc logged (its log is JSON lines or text), or `fallback`."""
    try:
        lines = runc_log(job_dir).read_text(errors="replace").strip().splitlines()
    except OSError:
        return fallback
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = {"msg": line}
        if isinstance(entry, dict) and entry.get("level", "error") == "error" and entry.get("msg"):
            return str(entry["msg"])
    return fallback
