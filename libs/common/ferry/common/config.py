"""Settings shared by every service and the CLI: a YAML file plus FERRY_* environment variables.

Precedence, lowest first: defaults, the file named by FERRY_CONFIG (or --config), FERRY_* variables,
command-line flags (services apply those last).
"""

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ByteSize, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ferry.common.cluster import InstanceTypeSpec, NodeSpec
from ferry.common.errors import ConfigError, UsageError
from ferry.common.jobnet import DEFAULT_RANGE, check_range

NoticeProvider = Literal["aws", "gcp", "azure"]
ProviderName = Literal["", "local", "aws", "gcp", "azure", "slurm", "kubernetes"]


class Settings(BaseSettings):
    """Every knob of Ferry; each maps to FERRY_<NAME> (FERRY_NATS_URL, FERRY_STORE_URL, ...)."""

    model_config = SettingsConfigDict(env_prefix="FERRY_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"  # several servers of one cluster: comma-separated
    nats_creds: Path | None = None  # this service's NATS user (ferry.common.natsauth); unset: connect without one
    nats_ca: Path | None = None  # TLS to NATS: the CA that signed its certificate (tls:// URLs)
    nats_replicas: int = Field(default=1, ge=1, le=5)  # copies of each stream and KV bucket (3 on a 3-server cluster)
    store_url: str = ""  # empty: <data_dir>/store
    store_key_file: Path | None = None  # the store's keyring (ferry.store.keys); unset: <data_dir>/secrets/store.keys
    data_dir: Path = Path("/var/lib/ferry")
    addr: str = "127.0.0.1:7070"  # the gRPC admin API
    token: str = ""  # when set, one more API token: the admin of the tenant "default"
    tokens_file: Path | None = None  # the API's tokens (hash -> tenant, role) and tenants' quotas (ferry.api.tenants)
    tls_cert: Path | None = None  # the API: its certificate (PEM); with tls_key, it serves only TLS
    tls_key: Path | None = None
    tls_ca: Path | None = None  # the API: clients must present a certificate this CA signed (mutual TLS)
    env_key_file: Path | None = None  # nodes: opens jobs' sealed environments; unset: <data_dir>/secrets/env.key
    env_public_key_file: Path | None = None  # the API: seals them; unset: <data_dir>/secrets/env.pub
    node_id: str = ""
    work_dir: Path | None = None  # node services: <data_dir>/nodes/<node_id> when unset
    criu_bin: str = "criu"
    postcopy: bool = True  # node services: false keeps live moves from this node to pre-copy rounds
    node_ip: str = "127.0.0.1"  # node services: where other nodes reach this one (a live move's page server)
    # node services: the page server of live moves speaks TLS with these (PEM; all three, or none)
    page_tls_cert: Path | None = None
    page_tls_key: Path | None = None
    page_tls_ca: Path | None = None
    # bridge-network jobs (ferry.common.jobnet): the cluster's address range (the scheduler allocates
    # from it; every node's bridge carries its first address), the network namespace that holds a
    # node's bridge (empty: the node service's own; `ferry up` gives each simulated node one), and
    # the address the other nodes route this node's jobs to (empty: node_ip)
    job_network: str = DEFAULT_RANGE
    node_netns: str = ""
    net_ip: str = ""
    # Kubernetes: the node agent's containerd CRI socket, and the kubeconfig of the controller and
    # agents (empty: the pod's service account, in the cluster)
    cri_endpoint: str = "unix:///run/containerd/containerd.sock"
    kubeconfig: str = ""
    keep_checkpoints: int = Field(default=0, ge=0)  # per job, newest kept; 0 keeps all (then unused chunks go)
    # node services: the checkpoints of a job that ended (succeeded, failed, killed) are deleted this
    # long after it ended, by its last node's checkpointer; 0 keeps them
    keep_ended_s: float = Field(default=7 * 86400.0, ge=0)
    scratch_dir: str = ""  # node services: where images are staged (default: /dev/shm if tmpfs, else work dir)
    disk_reserve: ByteSize = ByteSize(256 << 20)  # node services: kept free in scratch and a local store

    # node services: this node's labels, capacity and price (JSON of ferry.common.cluster.NodeSpec;
    # unset: this machine's CPUs and memory)
    node_spec: NodeSpec | None = None
    # node services: interruption notice sources, "aws=URL,gcp=URL,azure=URL" or a mapping (empty: none)
    interruption_sources: dict[NoticeProvider, str] = Field(default_factory=dict)
    notice_poll_s: float = Field(default=1.0, gt=0)
    # pricing: feed files (spot history JSON, catalog CSV, on-prem YAML): a list, or comma-separated
    price_feeds: list[Path] = Field(default_factory=list)
    price_poll_s: float = Field(default=10.0, gt=0)
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_timeout_s: float = Field(default=5.0, gt=0)
    drain_timeout_s: float = Field(default=20.0, gt=0)
    api_timeout_s: float = Field(default=120.0, gt=0)
    rebalance_every_s: float = Field(default=30.0, gt=0)  # how often each running job is reviewed
    rebalance_horizon_s: float = Field(default=3600.0, gt=0)  # remaining time assumed without a deadline
    kill_grace_s: float = Field(default=5.0, ge=0)
    # the autoscaler: where nodes come from ("": nowhere, it only watches; "local": `ferry up
    # --provider local`; aws, gcp, azure: the clouds' APIs; slurm: power saving; kubernetes: node
    # groups), see ferry.fleet.providers
    provider: ProviderName = ""
    fleet_dir: Path | None = None  # the local provider's folder; unset: <data_dir>/fleet
    # what the other providers offer (the local one takes the cluster file's): a list in the config
    # file, or JSON in FERRY_INSTANCE_TYPES; `group` names a type's SLURM nodes or Kubernetes node group
    instance_types: list[InstanceTypeSpec] = Field(default_factory=list)
    cluster_name: str = Field(default="ferry", pattern=r"^[a-z][a-z0-9-]{0,40}$")  # the tag on the nodes it launches
    provider_region: str = ""  # aws: the region
    provider_project: str = ""  # gcp: the project; azure: the subscription
    provider_group: str = ""  # azure: the resource group; kubernetes: the node groups' namespace
    provider_endpoint: str = ""  # the API's URL; empty: the cloud's own (set: a private endpoint, a local double)
    provider_image: str = ""  # aws: the AMI; gcp: the source image; azure: the image's id
    provider_network: str = ""  # aws: the subnet; gcp: the network; azure: the subnet's id
    provider_user_data: Path | None = None  # the script a new node boots with ({node_id} is its id)
    provider_token_file: Path | None = None  # gcp, azure, kubernetes: the API's bearer token
    autoscale_every_s: float = Field(default=5.0, gt=0)  # plans at least this often (underused time runs out)
    autoscale_drain_timeout_s: float = Field(default=600.0, gt=0)  # a retiring node's jobs must be gone by then
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    otel_endpoint: str = ""
    log_level: str = "INFO"

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any) -> tuple[Any, ...]:
        """Only what the caller passes: load_settings reads the file and the FERRY_* variables
        itself, with the forms a variable takes ("aws=URL,gcp=URL", comma-separated lists, JSON)."""
        return (init_settings,)

    @field_validator("job_network")
    @classmethod
    def _job_network(cls, value: str) -> str:
        try:
            return str(check_range(value))
        except UsageError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("node_spec", mode="before")
    @classmethod
    def _node_spec_json(cls, value: object) -> object:
        if isinstance(value, str):
            return NodeSpec.model_validate_json(value) if value.strip() else None
        return value

    @field_validator("instance_types", mode="before")
    @classmethod
    def _types_json(cls, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("interruption_sources", mode="before")
    @classmethod
    def _sources(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        sources: dict[str, str] = {}
        for item in filter(None, (s.strip() for s in value.split(","))):
            provider, sep, url = item.partition("=")
            if not sep or not url.startswith(("http://", "https://")):
                raise ValueError(f"{item!r} is not PROVIDER=URL (aws=http://..., gcp=..., azure=...)")
            sources[provider.strip()] = url.strip()
        return sources

    @field_validator("interruption_sources")
    @classmethod
    def _urls(cls, value: dict[str, str]) -> dict[str, str]:
        for provider, url in value.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{provider}: {url!r} is not an http(s) URL")
        return value

    @field_validator("price_feeds", mode="before")
    @classmethod
    def _feeds(cls, value: object) -> object:
        return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value

    def resolved_store_url(self) -> str:
        return self.store_url or str(self.data_dir / "store")

    def resolved_env_key_file(self, *, public: bool) -> Path:
        if public:
            return self.env_public_key_file or self.data_dir / "secrets" / "env.pub"
        return self.env_key_file or self.data_dir / "secrets" / "env.key"

    def resolved_store_key_file(self) -> Path:
        return self.store_key_file or self.data_dir / "secrets" / "store.keys"

    def node_work_dir(self) -> Path:
        if self.work_dir is not None:
            return self.work_dir
        if not self.node_id:
            raise ConfigError("no node id: set FERRY_NODE_ID or pass --node")
        return self.data_dir / "nodes" / self.node_id


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Reads the YAML file (argument, else FERRY_CONFIG), then FERRY_* variables, then overrides."""
    path = config_file or os.environ.get("FERRY_CONFIG")
    file_values: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping of settings at the top level")
        file_values = {k.replace("-", "_"): v for k, v in loaded.items()}
        unknown = set(file_values) - set(Settings.model_fields)
        if unknown:
            raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(sorted(unknown))}")
    env_values = {
        name: os.environ[f"FERRY_{name.upper()}"]
        for name in Settings.model_fields
        if f"FERRY_{name.upper()}" in os.environ
    }
    values = {**file_values, **env_values, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid setting {field}: {first['msg']}") from exc
