"""Who a caller is: API tokens, the tenants they belong to, their roles and quotas.

The tokens file (FERRY_TOKENS_FILE, YAML or JSON, mode 0600; a Kubernetes Secret) holds hashes,
never tokens::

    tokens:
      - {sha256: 9f86d0..., tenant: acme, role: user, name: ci-bot}
      - {sha256: 2c26b4..., tenant: ops, role: admin, name: alice}
      - {sha256: 4e07f8..., tenant: acme, role: agent, name: openclaw}
    tenants:
      acme: {quota: {cpus: 8, memory: 16GiB, gpus: 1, jobs: 10},
             agent_limits: {moves_per_hour: 6, drains_per_hour: 1, cost_per_hour: 20}}

An agent is a user of its tenant (it sees and acts on that tenant's jobs only) that may also drain
nodes, and whose every mutating call must give a reason and stays within its tenant's hourly
``agent_limits`` (ferry.common.guardrails).

`ferry keys token --tenant acme` makes a token and adds its hash. The file is read again when it
changes, so a token is added or revoked (its line deleted) without a restart. FERRY_TOKEN, where
set, is one more token: the admin of the tenant ``default``. With neither, the API is open: every
caller is the admin of ``default``, which the API allows only on loopback (and says so at start).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError

from ferry.common.errors import ConfigError, PermissionDenied, QuotaExceeded
from ferry.common.guardrails import AgentLimits
from ferry.common.models import DEFAULT_TENANT, Job
from ferry.common.wire import is_token


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"
    AGENT = "agent"  # a user of its tenant whose actions need a reason and stay within hourly limits


class Quota(BaseModel):
    """A tenant's limits over its jobs that have not ended; unset is no limit."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = Field(default=None, ge=0)
    memory: ByteSize | None = None
    gpus: int | None = Field(default=None, ge=0)
    jobs: int | None = Field(default=None, ge=0)

    @property
    def limited(self) -> bool:
        """Whether any limit is set (a submit then counts the tenant's jobs that have not ended)."""
        return any(v is not None for v in (self.cpus, self.memory, self.gpus, self.jobs))


class Usage(BaseModel):
    cpus: float = 0.0
    memory: int = 0
    gpus: int = 0
    jobs: int = 0

    @classmethod
    def of(cls, jobs: list[Job]) -> Usage:
        live = [j for j in jobs if not j.terminal]
        return cls(cpus=sum(j.cpus for j in live), memory=sum(j.memory_bytes for j in live),
                   gpus=sum(j.gpus for j in live), jobs=len(live))


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str
    role: Role = Role.USER
    name: str = ""


class TenantConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quota: Quota = Field(default_factory=Quota)
    agent_limits: AgentLimits = Field(default_factory=AgentLimits)


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry] = Field(default_factory=list)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)


class Principal(BaseModel):
    """The caller of one request."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    role: Role
    who: str = ""

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def agent(self) -> bool:
        return self.role is Role.AGENT

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise PermissionDenied(f"{what} is for admins; the token of {self.who or 'this caller'} is a user of "
                                   f"tenant {self.tenant}")

    def may_see(self, job: Job) -> bool:
        return self.admin or job.tenant == self.tenant


OPEN = Principal(tenant=DEFAULT_TENANT, role=Role.ADMIN, who="anyone (no tokens)")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens_file(path: Path) -> TokensFile:
    try:
        st = path.stat()
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the tokens file {path}: {exc}") from exc
    if st.st_mode & 0o007:  # others; a group (a pod's fsGroup) may read
        raise ConfigError(f"the tokens file {path} is readable by others: chmod 600 {path}")
    try:
        tokens = TokensFile.model_validate(loaded)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"tokens file {path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    for entry in tokens.tokens:
        if not is_token(entry.tenant):
            raise ConfigError(f"tokens file {path}: tenant {entry.tenant!r}: use letters, digits, '-' and '_'")
    return tokens


class Tenants:
    """Maps a bearer token to its Principal; re-reads the tokens file when it changes."""

    def __init__(self, tokens_file: Path | None, admin_token: str = "") -> None:
        self._path = tokens_file
        self._admin_token = admin_token
        self._mtime: float | None = None
        self._table = TokensFile()
        self.reload()

    @property
    def open(self) -> bool:
        return self._path is None and not self._admin_token

    def reload(self) -> None:
        if self._path is None:
            return
        mtime = os.stat(self._path).st_mtime if self._path.exists() else None
        if mtime is None:
            raise ConfigError(f"the tokens file {self._path} does not exist: `ferry keys token` makes it")
        if mtime != self._mtime:
            self._table = load_tokens_file(self._path)
            self._mtime = mtime

    def principal(self, token: str) -> Principal | None:
        """Who ``token`` is, or None when it is no token of this cluster."""
        if self.open:
            return OPEN
        if self._admin_token and hmac.compare_digest(token.encode(), self._admin_token.encode()):
            return Principal(tenant=DEFAULT_TENANT, role=Role.ADMIN, who="FERRY_TOKEN")
        if not token:
            return None
        try:
            self.reload()
        except ConfigError:
            pass  # keep the table last read: a half-written file must not lock everyone out
        digest = token_hash(token)
        for entry in self._table.tokens:
            if hmac.compare_digest(entry.sha256, digest):
                return Principal(tenant=entry.tenant, role=entry.role, who=entry.name or entry.sha256[:8])
        return None

    def agent_limits(self, tenant: str) -> AgentLimits:
        config = self._table.tenants.get(tenant)
        return config.agent_limits if config else AgentLimits()

    def quota(self, tenant: str) -> Quota:
        config = self._table.tenants.get(tenant)
        return config.quota if config else Quota()

    def check_quota(self, tenant: str, usage: Usage, *, cpus: float, memory: int, gpus: int) -> None:
        """Refuses a job of that size when it and the tenant's jobs that have not ended would
        exceed a limit."""
        quota = self.quota(tenant)
        wanted = {"cpus": (usage.cpus + cpus, quota.cpus), "memory": (usage.memory + memory, quota.memory),
                  "gpus": (usage.gpus + gpus, quota.gpus), "jobs": (usage.jobs + 1, quota.jobs)}
        for what, (total, limit) in wanted.items():
            if limit is not None and total > limit:
                raise QuotaExceeded(f"tenant {tenant} would use {total:g} {what}, over its quota of {limit:g}: "
                                    "end or park one of its jobs, or ask an admin for more")
