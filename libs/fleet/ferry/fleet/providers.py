"""The provider the settings name (``FERRY_PROVIDER``), or None."""

from ferry.common.config import Settings
from ferry.fleet.local import LocalProvider
from ferry.fleet.provider import Provider


def make_provider(settings: Settings) -> Provider | None:
    if settings.provider == "local":
        return LocalProvider(settings.fleet_dir or settings.data_dir / "fleet")
    return None
