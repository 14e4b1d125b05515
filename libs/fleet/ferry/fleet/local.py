"""The ``local`` provider: nodes of the all-in-one cluster (``ferry up --provider local``).

``ferry up`` runs the node services; this provider asks it for a node, or to end one, through a
folder both can reach (``FLEET_DIR``, under the cluster's data directory):

- ``types.json``: the instance types of the cluster file, with prices and how many of each the
  simulated provider has (``available``), written by ``ferry up`` at start;
- ``requests/<node>.json``: ``{"action": "launch", "type": KEY}`` or ``{"action": "terminate"}``,
  written here, taken and removed by ``ferry up``;
- ``nodes/<node>.json``: a ``ProvidedNode``, written by ``ferry up`` as the node starts, runs,
  fails to launch or ends.

Every file is written to a temporary name and renamed, so neither side reads half of one. The
provider waits for ``ferry up``'s answer as it would for a cloud's: by asking again (every 0.2 s,
up to ``timeout_s``).
"""

import asyncio
import json
import time
from pathlib import Path

from pydantic import ValidationError

from ferry.fleet.provider import InstanceType, LaunchRefused, ProvidedNode, ProviderError

POLL_S = 0.2


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


class LocalFleetDir:
    """The folder ``ferry up`` and the local provider share (both sides' reads and writes)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.types_file = root / "types.json"
        self.requests = root / "requests"
        self.states = root / "nodes"

    def write_types(self, types: list[InstanceType], available: dict[str, int]) -> None:
        doc = [{**t.model_dump(), "available": available.get(t.key, 0)} for t in types]
        write_atomic(self.types_file, json.dumps(doc, indent=1))

    def read_types(self) -> list[tuple[InstanceType, int]]:
        try:
            doc = json.loads(self.types_file.read_text())
            return [(InstanceType.model_validate({k: v for k, v in d.items() if k != "available"}),
                     int(d.get("available", 0))) for d in doc]
        except FileNotFoundError:
            raise ProviderError(f"no local fleet at {self.root}: start the cluster with `ferry up --provider local`"
                                ) from None
        except (OSError, ValueError, ValidationError, TypeError, AttributeError) as exc:
            raise ProviderError(f"{self.types_file}: unreadable ({exc})") from exc

    def request(self, node_id: str, action: str, type_key: str = "") -> None:
        if action == "launch":  # an answer about an earlier node of that name is not this one's
            (self.states / f"{node_id}.json").unlink(missing_ok=True)
        write_atomic(self.requests / f"{node_id}.json", json.dumps({"action": action, "type": type_key}))

    def take_requests(self) -> list[tuple[str, str, str]]:
        """(node, action, type key) of every request waiting, each removed as it is taken."""
        out = []
        for path in sorted(self.requests.glob("*.json")) if self.requests.is_dir() else []:
            try:
                doc = json.loads(path.read_text())
                out.append((path.stem, str(doc.get("action", "")), str(doc.get("type", ""))))
            except (OSError, ValueError):
                pass
            path.unlink(missing_ok=True)
        return out

    def set_state(self, node: ProvidedNode) -> None:
        write_atomic(self.states / f"{node.id}.json", node.model_dump_json())

    def state(self, node_id: str) -> ProvidedNode | None:
        try:
            return ProvidedNode.model_validate_json((self.states / f"{node_id}.json").read_text())
        except (OSError, ValidationError):
            return None

    def all_states(self) -> list[ProvidedNode]:
        found = [self.state(p.stem) for p in sorted(self.states.glob("*.json"))] if self.states.is_dir() else []
        return [n for n in found if n is not None]


class LocalProvider:
    name = "local"

    def __init__(self, root: Path, timeout_s: float = 120.0) -> None:
        self.dir = LocalFleetDir(root)
        self.timeout_s = timeout_s

    async def instance_types(self) -> list[InstanceType]:
        return [t for t, _ in await asyncio.to_thread(self.dir.read_types)]

    async def _until(self, node_id: str, done: tuple[str, ...]) -> ProvidedNode:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            state = await asyncio.to_thread(self.dir.state, node_id)
            if state is not None and state.state in done:
                return state
            await asyncio.sleep(POLL_S)
        raise ProviderError(f"ferry up did not answer for node {node_id} within {self.timeout_s:.0f}s")

    async def launch(self, node_id: str, offer: InstanceType) -> ProvidedNode:
        known = {t.key for t in await self.instance_types()}
        if offer.key not in known:
            raise LaunchRefused(f"the local provider offers no {offer.key} (the cluster file's instance_types: "
                                f"{', '.join(sorted(known)) or 'none'})")
        await asyncio.to_thread(self.dir.request, node_id, "launch", offer.key)
        state = await self._until(node_id, ("running", "failed"))
        if state.state == "failed":
            raise LaunchRefused(state.reason or f"the launch of {node_id} failed")
        return state

    async def terminate(self, node_id: str) -> None:
        await asyncio.to_thread(self.dir.request, node_id, "terminate")
        await self._until(node_id, ("terminated",))

    async def nodes(self) -> list[ProvidedNode]:
        return await asyncio.to_thread(self.dir.all_states)
