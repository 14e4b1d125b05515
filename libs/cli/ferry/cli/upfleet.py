"""`ferry up --provider local`: the all-in-one cluster's side of the local provider
(``ferry.fleet.local``): it takes the autoscaler's requests from the fleet folder, starts or stops
a node's services through the callbacks ``ferry up`` gives, and answers in the node's state file.

A launch is refused (state ``failed``, with the reason) when the cluster file lists no such
instance type, when all of that type's ``available`` nodes run already (a cloud out of capacity),
or when a node of that name runs; the cluster stays as it was.
"""

import shutil
from collections.abc import Callable
from pathlib import Path

from ferry.common.cluster import InstanceTypeSpec, NodeSpec, offer_key
from ferry.fleet.local import LocalFleetDir
from ferry.fleet.provider import InstanceType, NodeState, ProvidedNode


def type_key(spec: NodeSpec) -> str:
    return offer_key(spec.instance_type, spec.zone, spec.spot)


class LocalFleet:
    def __init__(self, folder: Path, types: list[InstanceTypeSpec]) -> None:
        self.dir = LocalFleetDir(folder)
        self.types = {t.key: t for t in types}

    def start(self, nodes: list[NodeSpec]) -> None:
        """A fresh folder: the types on offer, and the cluster file's nodes as running."""
        shutil.rmtree(self.dir.root, ignore_errors=True)
        offers = [InstanceType.of(t) for t in self.types.values()]
        self.dir.write_types(offers, {k: t.available for k, t in self.types.items()})
        for spec in nodes:
            self.answer(spec, "running")

    def answer(self, spec: NodeSpec, state: NodeState, reason: str = "") -> None:
        self.dir.set_state(ProvidedNode(id=spec.id, instance_type=spec.instance_type, zone=spec.zone, spot=spec.spot,
                                        state=state, reason=reason))

    def refusal(self, node: str, key: str, running: dict[str, NodeSpec]) -> str | None:
        kind = self.types.get(key)
        if kind is None:
            return f"the cluster file lists no instance type {key}"
        if node in running:
            return f"a node named {node} runs already"
        used = sum(1 for s in running.values() if type_key(s) == key)
        if used >= kind.available:
            return f"insufficient capacity: all {kind.available} {key} nodes of the local provider are in use"
        return None

    def serve(self, running: dict[str, NodeSpec], add: Callable[[NodeSpec], None],
              remove: Callable[[str], None]) -> None:
        """Carries out every request waiting (``running``: the nodes up now, by id)."""
        for node, action, key in self.dir.take_requests():
            if action == "launch":
                why = self.refusal(node, key, running)
                spec = self.types[key].node(node) if key in self.types else NodeSpec(id=node)
                if why is not None:
                    self.answer(spec, "failed", why)
                    continue
                self.answer(spec, "launching")
                try:
                    add(spec)
                except Exception as exc:
                    self.answer(spec, "failed", f"its services did not start: {exc}")
                    continue
                self.answer(spec, "running")
            elif action == "terminate":
                spec = running.get(node, NodeSpec(id=node))
                if node in running:
                    remove(node)
                self.answer(spec, "terminated")
