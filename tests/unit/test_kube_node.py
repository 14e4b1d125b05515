"""The pure parts of Ferry's node side under Kubernetes: runc's command lines as the shim writes
them, the restore annotation, the overlay's upper directory in mountinfo, root filesystem changes
(whiteouts and opaque folders included) carried from one overlay to another, and what a verbose
CRI ContainerStatus tells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ferry.common.errors import UsageError
from ferry.kube.annotations import CheckpointRef, job_for, job_of, parse_restore_from
from ferry.kube.containerd import install, runtime_options, uninstall
from ferry.kube.cri import ContainerSpec, PodSpec, container_info
from ferry.kube.overlay import OPAQUE_XATTR, apply_changes, save_changes, upper_from_mountinfo
from ferry.kube.runcargs import parse, restore_argv
from ferry.v1 import cri_pb2 as cri

SHIM_CREATE = ["--root", "/run/ferry/runc/k8s.io", "--log", "/s/t/log.json", "--log-format", "json", "create",
               "--bundle", "/s/t/abc", "--pid-file", "/s/t/abc/init.pid", "--console-socket=/tmp/c.sock", "abc"]


def test_a_shim_create_is_parsed_and_becomes_a_detached_restore_with_the_same_bundle_and_pid_file() -> None:
    call = parse(SHIM_CREATE)
    assert call.command == "create" and call.container_id == "abc" and call.bundle == "/s/t/abc"
    assert call.global_value("--root") == "/run/ferry/runc/k8s.io" and call.global_value("--criu") is None
    assert call.options == {"--bundle": "/s/t/abc", "--pid-file": "/s/t/abc/init.pid",
                            "--console-socket": "/tmp/c.sock"}
    argv = restore_argv(call, images="/s/t/abc/ferry-images", work="/s/t/abc/w")
    assert argv[:6] == ["--root", "/run/ferry/runc/k8s.io", "--log", "/s/t/log.json", "--log-format", "json"]
    assert argv[6:] == ["restore", "--detach", "--bundle", "/s/t/abc", "--image-path", "/s/t/abc/ferry-images",
                        "--work-path", "/s/t/abc/w", "--pid-file", "/s/t/abc/init.pid", "--console-socket",
                        "/tmp/c.sock", "abc"]


@pytest.mark.parametrize(("argv", "command", "args"), [
    (["--root", "/r", "start", "abc"], "start", ("abc",)),
    (["--root=/r", "--debug", "delete", "--force", "abc"], "delete", ("abc",)),
    (["--version"], "", ()),
    (["kill", "abc", "9"], "kill", ("abc", "9")),
    (["kill", "--all", "abc", "SIGTERM"], "kill", ("abc", "SIGTERM")),
])
def test_other_runc_calls_are_parsed_for_what_they_name(argv: list[str], command: str, args: tuple[str, ...]) -> None:
    call = parse(argv)
    assert (call.command, call.args) == (command, args) and call.container_id == (args[0] if args else None)
    if argv[0].startswith("--root"):
        assert call.global_value("--root") == "/r"


def test_only_a_graceful_kill_of_the_init_is_a_stop_to_checkpoint_on() -> None:
    assert parse(["--root", "/r", "kill", "abc"]).stops  # runc's default signal is SIGTERM
    assert parse(["kill", "abc", "15"]).stops and parse(["kill", "abc", "TERM"]).stops
    assert parse(["kill", "abc", "SIGTERM"]).stops
    assert not parse(["kill", "abc", "SIGKILL"]).stops and not parse(["kill", "abc", "9"]).stops
    assert not parse(["kill", "--all", "abc", "SIGTERM"]).stops  # every process: not the pod going
    assert not parse(["delete", "abc"]).stops


def test_the_restore_annotation_names_a_job_and_maybe_a_checkpoint() -> None:
    assert parse_restore_from("k8s.ml.trainer.main") == CheckpointRef(job="k8s.ml.trainer.main")
    assert str(parse_restore_from(" j1/ck-12 ")) == "j1/ck-12"
    for bad in ("", "../etc", "a/b/c", "a/", "-x", "a b"):
        with pytest.raises(UsageError, match="is not JOB or JOB/CHECKPOINT"):
            parse_restore_from(bad)
    assert job_for("ml", "trainer", "main") == "k8s.ml.trainer.main"
    assert job_for("ml", "a/b c", "x") == "k8s.ml.a-b-c.x"
    cri_spec = {"io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "trainer",
                "io.kubernetes.cri.container-name": "main"}
    assert job_of(cri_spec) == "k8s.ml.trainer.main"
    assert job_of({**cri_spec, "ferry.dev/job": "mine"}) == "mine"  # the pod names its job
    indexed = {**cri_spec, "ferry.dev/job": "trainer-{index}", "batch.kubernetes.io/job-completion-index": "3"}
    assert job_of(indexed) == "trainer-3"  # an Indexed Job's pods keep their index across recreation


MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
901 22 0:77 / /tmp/ctrd/state/t/k8s.io/abc/rootfs rw,relatime - overlay overlay """ + \
    r"""rw,lowerdir=/l/1:/l/2,upperdir=/tmp/ctrd/root/snap/9/fs,workdir=/tmp/ctrd/root/snap/9/work
902 22 0:78 / /tmp/with\040space/rootfs rw - overlay overlay rw,lowerdir=/l,upperdir=/u\040p,workdir=/w
903 22 0:79 / /tmp/plain/rootfs rw - tmpfs tmpfs rw
"""


def test_the_upper_directory_of_a_containers_overlay_is_read_from_mountinfo() -> None:
    assert upper_from_mountinfo(MOUNTINFO, "/tmp/ctrd/state/t/k8s.io/abc/rootfs") == "/tmp/ctrd/root/snap/9/fs"
    assert upper_from_mountinfo(MOUNTINFO, "/tmp/with space/rootfs") == "/u p"
    assert upper_from_mountinfo(MOUNTINFO, "/tmp/plain/rootfs") is None  # not an overlay: nothing to carry
    assert upper_from_mountinfo(MOUNTINFO, "/nowhere") is None


def test_root_filesystem_changes_travel_with_their_deletions_and_opaque_folders(tmp_path: Path) -> None:
    upper, rootfs = tmp_path / "upper", tmp_path / "rootfs"
    (upper / "data").mkdir(parents=True)
    (upper / "data" / "log").write_text("0\n1\n")
    (upper / "etc").mkdir()
    os.mknod(upper / "etc" / "gone.conf", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout
    (upper / "cache").mkdir()
    os.setxattr(upper / "cache", OPAQUE_XATTR, b"y")
    (upper / "cache" / "new").write_text("n")
    (upper / "link").symlink_to("/data/log")
    # the same image's fresh root filesystem on the other node
    for folder in ("etc", "cache", "data"):
        (rootfs / folder).mkdir(parents=True)
    (rootfs / "etc" / "gone.conf").write_text("from the image")
    (rootfs / "etc" / "kept.conf").write_text("kept")
    (rootfs / "cache" / "old").write_text("from the image")

    changes = save_changes(upper, tmp_path / "changes.tar")
    assert changes.deleted == ["etc/gone.conf"] and changes.opaque == ["cache"]
    apply_changes(tmp_path / "changes.tar", rootfs)
    assert (rootfs / "data" / "log").read_text() == "0\n1\n"
    assert not (rootfs / "etc" / "gone.conf").exists() and (rootfs / "etc" / "kept.conf").read_text() == "kept"
    assert sorted(p.name for p in (rootfs / "cache").iterdir()) == ["new"]
    assert os.readlink(rootfs / "link") == "/data/log"


def test_changes_that_name_a_path_outside_the_root_are_refused(tmp_path: Path) -> None:
    import io
    import tarfile

    body = json.dumps({"deleted": ["../../outside"], "opaque": []}).encode()
    with tarfile.open(tmp_path / "evil.tar", "w") as tar:
        info = tarfile.TarInfo(".ferry-changes.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    (tmp_path / "rootfs").mkdir()
    (tmp_path / "outside").write_text("safe")
    with pytest.raises(ValueError, match="leaves the root filesystem"):
        apply_changes(tmp_path / "evil.tar", tmp_path / "rootfs")
    assert (tmp_path / "outside").read_text() == "safe"


def test_a_verbose_container_status_names_runc_root_and_pid() -> None:
    status = cri.ContainerStatusResponse(
        status=cri.ContainerStatus(id="abc", metadata=cri.ContainerMetadata(name="main"), state=cri.CONTAINER_RUNNING,
                                   log_path="/l/main.log", annotations={"a": "b"}),
        info={"info": json.dumps({"pid": 42, "runtimeOptions": {"binary_name": "/x/ferry-runc", "root": "/r"}})})
    got = container_info(status)
    assert (got.id, got.name, got.state, got.pid, got.runc_root) == ("abc", "main", "running", 42, "/r/k8s.io")
    plain = container_info(cri.ContainerStatusResponse(status=cri.ContainerStatus(id="x", state=cri.CONTAINER_EXITED)))
    assert plain.runc_root == "/run/containerd/runc/k8s.io" and plain.pid is None and plain.state == "exited"


def test_pods_and_containers_are_described_as_a_kubelet_describes_them() -> None:
    pod = PodSpec(name="p", namespace="ml", uid="u", log_directory="/logs", annotations={"ferry.dev/job": "j"})
    config = pod.config()
    assert config.metadata.namespace == "ml" and config.annotations["ferry.dev/job"] == "j"
    assert config.linux.security_context.namespace_options.network == cri.NODE
    box = ContainerSpec(name="main", image="i:1", command=["sh"], env={"A": "1"}, mounts=[("/usr", "/usr", True)])
    c = box.config(pod)
    assert c.log_path == "main.log" and c.envs[0].key == "A" and c.mounts[0].readonly


DEFAULT_V2 = """version = 2
root = "/var/lib/containerd"
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def test_the_runtime_is_added_to_containerds_configuration_once_and_removed_exactly() -> None:
    once = install(DEFAULT_V2, "/opt/ferry/bin/ferry-runc")
    assert install(once, "/opt/ferry/bin/ferry-runc") == once
    options = runtime_options(once)
    assert options["runtime_type"] == "io.containerd.runc.v2"
    assert options["pod_annotations"] == ["ferry.dev/*", "batch.kubernetes.io/job-completion-index"]
    assert options["options"] == {"BinaryName": "/opt/ferry/bin/ferry-runc", "Root": "/run/ferry/runc"}
    assert tomllib.loads(once)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert uninstall(once) == DEFAULT_V2
    moved = install(once, "/usr/local/bin/ferry-runc")  # a new path replaces the old section
    assert runtime_options(moved)["options"]["BinaryName"] == "/usr/local/bin/ferry-runc"  # type: ignore[index]
    v3 = install('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n', "/b")
    assert tomllib.loads(v3)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["ferry"]


@pytest.mark.parametrize(("config", "says"), [
    ("version = 1\n", "configuration version 1"),
    ("version = = 2", "not valid TOML"),
    (DEFAULT_V2 + '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.ferry]\nruntime_type = "x"\n',
     "already defines a runtime 'ferry'"),
])
def test_a_containerd_configuration_ferry_cannot_safely_change_is_refused(config: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        install(config, "/b")


def test_install_runtime_from_the_cli_is_idempotent_and_refuses_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(DEFAULT_V2)
    ferry = [sys.executable, "-m", "ferry.cli.main", "pod", "install-runtime", "--containerd-config", str(config)]
    first = subprocess.run([*ferry, "-o", "json"], capture_output=True, text=True, check=False)
    assert first.returncode == 0 and json.loads(first.stdout)["changed"] is True, first.stderr
    second = subprocess.run([*ferry, "-o", "json"], capture_output=True, text=True, check=False)
    assert json.loads(second.stdout)["changed"] is False
    config.write_text("version = 7\n")
    bad = subprocess.run(ferry, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "version 7" in bad.stderr
    assert config.read_text() == "version = 7\n"  # left as it was
