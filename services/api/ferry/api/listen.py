"""Where and how the admin API listens: TLS (mutual with a client CA) or, on loopback only, plain.

Ferry listens beyond loopback only with TLS and tokens; asked to do otherwise, the API refuses to
start with one line that says what to set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from ferry.common.config import Settings
from ferry.common.errors import ConfigError
from ferry.common.tls import is_loopback


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the API's {what} {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class Listener:
    addr: str
    cert: bytes | None = None
    key: bytes | None = None
    client_ca: bytes | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Listener:
        if bool(settings.tls_cert) != bool(settings.tls_key):
            raise ConfigError("give both FERRY_TLS_CERT and FERRY_TLS_KEY (--tls-cert/--tls-key), or neither")
        if settings.tls_ca and not settings.tls_cert:
            raise ConfigError("FERRY_TLS_CA (mutual TLS) needs the API's own FERRY_TLS_CERT and FERRY_TLS_KEY")
        return cls(addr=settings.addr,
                   cert=_read(settings.tls_cert, "certificate") if settings.tls_cert else None,
                   key=_read(settings.tls_key, "key") if settings.tls_key else None,
                   client_ca=_read(settings.tls_ca, "client CA") if settings.tls_ca else None)

    @property
    def host(self) -> str:
        return self.addr.rpartition(":")[0] or self.addr

    @property
    def tls(self) -> bool:
        return self.cert is not None

    def refuse_if_open(self, open_api: bool) -> None:
        """Beyond loopback: TLS and tokens, or no start at all."""
        if is_loopback(self.host):
            return
        if not self.tls:
            raise ConfigError(f"the API would listen on {self.addr} in plain text: beyond loopback it needs TLS "
                              "(set FERRY_TLS_CERT and FERRY_TLS_KEY), or listen on 127.0.0.1")
        if open_api:
            raise ConfigError(f"the API would listen on {self.addr} without tokens: set FERRY_TOKENS_FILE "
                              "(`ferry keys token` makes one) or FERRY_TOKEN")

    def bind(self, server: grpc.aio.Server) -> int:
        if self.cert is None or self.key is None:
            return server.add_insecure_port(self.addr)
        credentials = grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.client_ca,
                                                  require_client_auth=self.client_ca is not None)
        return server.add_secure_port(self.addr, credentials)

    def describe(self) -> str:
        if not self.tls:
            return "plain text, loopback only"
        return "mutual TLS" if self.client_ca else "TLS"
