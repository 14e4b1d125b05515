"""Clusters with API tokens, for the e2e tests of security and agents: tokens made by `ferry keys
token`, and the CLI run as one of their holders."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import BIN, Cluster


def make_token(data_dir: Path, tenant: str, role: str, name: str) -> str:
    out = subprocess.run([str(BIN / "ferry"), "keys", "token", "-o", "json", "--data-dir", str(data_dir),
                          "--tenant", tenant, "--role", role, "--name", name],
                         capture_output=True, text=True, check=True, timeout=60)
    return str(json.loads(out.stdout)["token"])


class Tenants:
    """A cluster and its tokens by holder; `ferry` runs the CLI as one of them."""

    def __init__(self, cluster: Cluster, tokens: dict[str, str], timeout: float = 180) -> None:
        self.cluster = cluster
        self.tokens = tokens
        self.timeout = timeout

    def ferry(self, who: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.cluster.env, "FERRY_TOKEN": self.tokens[who]}
        result = subprocess.run([str(BIN / "ferry"), *args], env=env, capture_output=True, text=True,
                                timeout=self.timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{who}: ferry {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def json(self, who: str, *args: str) -> Any:
        return json.loads(self.ferry(who, args[0], "-o", "json", *args[1:]).stdout)
