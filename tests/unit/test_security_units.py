"""The pure parts of the security model: NATS permissions per role, tokens and tenants, sealed
environments, where the API may listen."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.api.auth import _outcome
from ferry.common import wire
from ferry.common.config import Settings
from ferry.common.errors import ConfigError, PermissionDenied, QuotaExceeded
from ferry.common.models import Job
from ferry.common.natsauth import authorization_block, node_user, permissions, read_creds, users_for
from ferry.common.sealing import SealError, new_key_pair, open_env, seal_env
from ferry.common.tenancy import OPEN, Principal, Role, Tenants, Usage, token_hash
from ferry.common.tls import is_loopback
from ferry.criu.linux import mount_points, nsfs_points, runtime_points
from ferry.node.base import hidden_from_jobs
from ferry.store.keys import write_private
from ferry.v1 import ferry_pb2 as pb


def _allowed(user: str, direction: str = "publish") -> list[str]:
    return permissions(user)[direction]["allow"]


def test_only_the_scheduler_commands_nodes_and_creates_streams() -> None:
    for user in users_for(["n1", "n2"]):
        pub = _allowed(user)
        commands_nodes = "ferry.cmd.node.>" in pub
        assert commands_nodes == (user == "scheduler"), user
        assert ("$JS.API.STREAM.CREATE.*" in pub) == (user == "scheduler"), user
        assert not any(s in pub for s in (">", "$JS.API.>", "ferry.>", "$JS.API.STREAM.DELETE.*")), user


def test_a_node_speaks_only_for_itself() -> None:
    pub = _allowed(node_user("checkpointer", "n1"))
    assert "ferry.evt.node.n1.>" in pub and "$KV.ferry_nodes.n1" in pub
    assert not [s for s in pub if "n2" in s or s in (wire.SCHEDULER_CMD, "$KV.ferry_jobs.>", "$KV.ferry_nodes.>")]
    # its commands only through its own consumer, filtered to its own subject
    assert f"$JS.API.CONSUMER.CREATE.FERRY_CMD.checkpointer-n1.{wire.node_cmd_subject('n1', 'checkpointer')}" in pub
    assert not [s for s in pub if s.startswith("$JS.API.CONSUMER.CREATE.FERRY_CMD") and "checkpointer-n1" not in s]


def test_the_api_submits_but_never_commands_a_node() -> None:
    pub = _allowed("api")
    assert wire.SCHEDULER_CMD in pub and "$KV.ferry_ops.>" in pub and wire.AUDIT_SUBJECTS in pub
    assert not [s for s in pub if s.startswith("ferry.cmd.node") or s.startswith("$KV.ferry_jobs")]


def test_the_server_configuration_names_every_user(tmp_path: Path) -> None:
    users = users_for(["n1"])
    text = authorization_block({u: f"pw-{u}" for u in users})
    for user in users:
        assert f'{{user: "{user}", password: "pw-{user}"' in text
    assert text.count("allow_responses: true") == len(users)
    with pytest.raises(ConfigError, match="no NATS role"):
        permissions("root")


def test_credentials_files_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "api.json"
    write_private(path, '{"user": "api", "password": "x"}')
    assert read_creds(path).user == "api"
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_creds(path)


def test_a_sealed_environment_opens_only_on_a_node_for_its_tenant() -> None:
    private, public = new_key_pair()
    sealed = seal_env({"API_KEY": "s3cr3t", "B": ""}, public, "acme")
    assert sealed.names == ["API_KEY", "B"] and "s3cr3t" not in sealed.model_dump_json()
    assert open_env(sealed, private, "acme") == {"API_KEY": "s3cr3t", "B": ""}
    with pytest.raises(SealError, match="tenant globex"):
        open_env(sealed, private, "globex")  # copied into another tenant's job
    with pytest.raises(SealError):
        open_env(sealed, new_key_pair()[0], "acme")  # another cluster's key
    renamed = sealed.model_copy(update={"names": ["OTHER", "B"]})
    with pytest.raises(SealError, match="names"):
        open_env(renamed, private, "acme")


def _tokens(tmp_path: Path) -> tuple[Tenants, dict[str, str]]:
    tokens = {"a": "tok-acme", "g": "tok-globex", "root": "tok-admin"}
    path = tmp_path / "tokens.yaml"
    write_private(path, f"""
tokens:
  - {{sha256: {token_hash(tokens['a'])}, tenant: acme, name: ci}}
  - {{sha256: {token_hash(tokens['g'])}, tenant: globex, role: user}}
  - {{sha256: {token_hash(tokens['root'])}, tenant: ops, role: admin, name: alice}}
tenants:
  acme: {{quota: {{cpus: 4, memory: 1GiB, jobs: 2}}}}
""")
    return Tenants(path), tokens


def test_tokens_map_to_tenants_and_roles(tmp_path: Path) -> None:
    tenants, tokens = _tokens(tmp_path)
    assert tenants.principal(tokens["a"]) == Principal(tenant="acme", role=Role.USER, who="ci")
    assert tenants.principal(tokens["root"]).admin  # type: ignore[union-attr]
    assert tenants.principal("guess") is None and tenants.principal("") is None
    assert not tenants.open and Tenants(None).open and Tenants(None).principal("") == OPEN
    with_admin = Tenants(None, "adm")
    assert with_admin.principal("adm").admin and with_admin.principal("x") is None  # type: ignore[union-attr]


def test_a_revoked_token_stops_working_without_a_restart(tmp_path: Path) -> None:
    tenants, tokens = _tokens(tmp_path)
    path = tmp_path / "tokens.yaml"
    text = "\n".join(line for line in path.read_text().splitlines() if "globex" not in line)
    write_private(path, text)
    import os

    os.utime(path, (1, 1))  # a different mtime, as a later write has
    assert tenants.principal(tokens["g"]) is None and tenants.principal(tokens["a"]) is not None


def test_quotas_and_admin_only_calls(tmp_path: Path) -> None:
    tenants, _ = _tokens(tmp_path)
    running = [Job(id="j1", name="a", argv=["x"], tenant="acme", cpus=3, memory_bytes=512 << 20)]
    usage = Usage.of(running)
    tenants.check_quota("acme", usage, cpus=1, memory=0, gpus=0)
    with pytest.raises(QuotaExceeded, match="would use 5 cpus, over its quota of 4"):
        tenants.check_quota("acme", usage, cpus=2, memory=0, gpus=0)
    with pytest.raises(QuotaExceeded, match="memory"):
        tenants.check_quota("acme", usage, cpus=0, memory=600 << 20, gpus=0)
    tenants.check_quota("globex", usage, cpus=1000, memory=0, gpus=8)  # no quota: no limit
    # what the API asks before it counts a tenant's jobs: only a tenant with a limit pays for that
    assert tenants.quota("acme").limited and not tenants.quota("globex").limited
    user = Principal(tenant="acme", role=Role.USER, who="ci")
    with pytest.raises(PermissionDenied, match="draining a node is for admins"):
        user.require_admin("draining a node")
    assert user.may_see(running[0]) and not Principal(tenant="globex", role=Role.USER).may_see(running[0])


def test_a_bad_tokens_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    write_private(path, "tokens: [{sha256: nothex, tenant: a}]")
    with pytest.raises(ConfigError, match=r"tokens\.0\.sha256"):
        Tenants(path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        Tenants(path)


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("[::1]", True),
                                                ("0.0.0.0", False), ("10.0.0.5", False), ("ferry.example", False)])
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_api_refuses_to_listen_beyond_loopback_in_the_clear(tmp_path: Path) -> None:
    from ferry.api.listen import Listener

    Listener.from_settings(Settings(addr="127.0.0.1:7070")).refuse_if_open(True)  # all-in-one: allowed
    with pytest.raises(ConfigError, match="plain text: beyond loopback it needs TLS"):
        Listener.from_settings(Settings(addr="0.0.0.0:7070")).refuse_if_open(False)
    from ferry.common.certs import make_tls

    tls = make_tls(tmp_path / "tls", ["127.0.0.1"])
    secure = Listener.from_settings(Settings(addr="0.0.0.0:7070", tls_cert=tls.cert, tls_key=tls.key))
    with pytest.raises(ConfigError, match="without tokens"):
        secure.refuse_if_open(True)
    secure.refuse_if_open(False)
    with pytest.raises(ConfigError, match="both FERRY_TLS_CERT and FERRY_TLS_KEY"):
        Listener.from_settings(Settings(tls_cert=tls.cert))


def test_jobs_are_kept_from_the_data_dir_and_every_folder_holding_a_key(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    keys = tmp_path / "etc-ferry-keys"
    settings = Settings(data_dir=data, node_id="n1", nats_creds=keys / "nats-checkpointer.json",
                        env_key_file=keys / "env.key", page_tls_ca=Path("/etc/ca.pem"))
    monkeypatch.setenv("FERRY_CONFIG", str(tmp_path / "conf" / "ferry.yaml"))
    hidden = hidden_from_jobs(settings, Path("/dev/shm/ferry/n1-0123456789ab"))
    # the work dir and store keys sit in the data dir: folded into it; /etc is never hidden
    assert hidden == sorted([data.resolve(), keys.resolve(), (tmp_path / "conf").resolve(), Path("/dev/shm/ferry")])
    monkeypatch.delenv("FERRY_CONFIG")
    elsewhere = hidden_from_jobs(Settings(data_dir=data, node_id="n1"), data / "nodes" / "n1" / "scratch")
    assert elsewhere == [data.resolve()]


def test_the_mount_points_of_a_mountinfo_text_are_unescaped() -> None:
    text = ("22 1 0:21 / / rw - ext4 /dev/vda1 rw\n"
            "23 22 0:22 / /var/lib/my\\040data rw - tmpfs tmpfs rw\n")
    assert mount_points(text) == ["/", "/var/lib/my data"]


def test_the_pinned_namespaces_a_job_leaves_behind_are_the_nsfs_mounts() -> None:
    text = ("22 1 0:21 / / rw - ext4 /dev/vda1 rw\n"
            "129 22 0:25 /netns /run/netns rw shared:5 - tmpfs tmpfs rw\n"
            "130 129 0:4 net:[4026532] /run/netns/ferry-0ce1-n1 rw shared:6 - nsfs nsfs rw\n"
            "131 129 0:4 net:[4026533] /run/netns/ferry-0ce1-auto\\040x rw - nsfs nsfs rw\n")
    assert nsfs_points(text) == ["/run/netns/ferry-0ce1-n1", "/run/netns/ferry-0ce1-auto x"]


def test_other_containers_mounts_are_the_runtimes_and_the_nodes_own_are_not() -> None:
    task = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/5f15"
    text = ("22 1 0:21 / / rw - ext4 /dev/vda1 rw\n"
            f"40 22 0:30 / {task}/rootfs rw - overlay overlay rw\n"
            "41 22 0:31 / /run/containerd/io.containerd.grpc.v1.cri/sandboxes/5f15/shm rw - tmpfs shm rw\n"
            "42 22 0:32 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~secret/token rw - tmpfs tmpfs rw\n"
            "43 22 0:33 / /var/lib/docker/overlay2/ab12/merged rw - overlay overlay rw\n"
            "44 22 0:34 / /var/lib/containers/storage/overlay/cd34/merged rw - overlay overlay rw\n"
            "45 22 0:35 / /var/lib/kubelet rw - ext4 /dev/vdb rw\n"  # the node's own disk, not a container's
            "46 22 0:36 / /srv/io.containerd.notes rw - ext4 /dev/vdc rw\n")
    assert runtime_points(text) == [f"{task}/rootfs", "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/5f15/shm",
                                    "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~secret/token",
                                    "/var/lib/docker/overlay2/ab12/merged",
                                    "/var/lib/containers/storage/overlay/cd34/merged"]


def test_an_operation_that_fails_after_it_streamed_is_audited_as_failed() -> None:
    class Ok:
        def code(self) -> None:
            return None

    failed = pb.OpUpdate(op="op-1", done=True, error_code=1, error="criu dump failed: Connected TCP socket")
    assert _outcome(Ok(), None, failed) == ("FAILED", "criu dump failed: Connected TCP socket")
    assert _outcome(Ok(), None, pb.OpUpdate(op="op-1", done=True)) == ("ok", "")
    assert _outcome(Ok(), None, pb.OpUpdate(op="op-1", phase="upload")) == ("ok", "")
