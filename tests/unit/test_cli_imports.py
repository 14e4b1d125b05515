"""What a ``ferry`` command imports before it calls the API (issue 18's CLI floor: each of these
took 10 to 150 ms of every command). A call in the clear needs neither TLS nor grpcio, nor the
settings' pydantic models."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("grpc", "ssl", "pydantic", "pydantic_settings", "ferry.common.config", "nats")


def imported_by(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_a_command_in_the_clear_imports_none_of_the_heavy_modules() -> None:
    # what `ferry nodes -o json` imports, up to the call: the channel to loopback (nothing listens on
    # port 1: it is refused after the choice of TLS or not) goes without TLS
    loaded = imported_by("import ferry.cli.main, ferry.cli.commands, ferry.cli.client\n"
                         "from ferry.common.errors import FerryError\n"
                         "try:\n    ferry.cli.client.Client('127.0.0.1:1')\n"
                         "except FerryError:\n    pass")
    assert "ferry.cli.h2call" in loaded  # the probe did import the call path
    assert sorted(m for m in HEAVY if m in loaded) == []


def test_a_tls_context_still_imports_ssl_where_it_is_made() -> None:
    loaded = imported_by("from ferry.common.tls import client_context\nclient_context(None)")
    assert "ssl" in loaded
