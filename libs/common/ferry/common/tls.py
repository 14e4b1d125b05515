"""TLS contexts from settings, and which addresses may go without TLS.

Ferry listens beyond loopback only with TLS: ``is_loopback`` decides, and every listener asks it
before it binds in the clear.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

from ferry.common.errors import ConfigError

if TYPE_CHECKING:  # the CLI imports this module for is_loopback: not the settings (pydantic-settings, 150 ms)
    import ssl  # nor ssl, which a call in the clear does not need (3 to 10 ms of every command)

    from ferry.common.config import Settings


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, brackets allowed) only reaches this machine."""
    host = host.strip("[]")
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_context(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (else the system's CAs), presenting ``cert`` if given."""
    import ssl

    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files ({ca}, {cert}): {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def nats_tls(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for NATS: with FERRY_NATS_CA, or for tls:// URLs (the system's CAs)."""
    if settings.nats_ca is None and "tls://" not in settings.nats_url:
        return None
    return client_context(settings.nats_ca)
