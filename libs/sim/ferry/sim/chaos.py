"""Fault injection for the all-in-one mode (`ferry chaos`): the API asks `ferry up`, through files
in <data-dir>/chaos/, to crash a simulated node, and arms that node's simulated metadata endpoint
for a spot interruption notice, or makes the next live move fail in a chosen phase. Real clusters
have no such thing: the call is refused there."""

import json
import time
from pathlib import Path

from ferry.common.errors import ConflictError, UsageError
from ferry.common.phases import LIVE_PHASES
from ferry.sim.faults import arm_live_fault
from ferry.sim.metadata_server import send_notice

KINDS = ("kill-node", "spot-notice", *(f"fail-live-{p}" for p in LIVE_PHASES))


def up_state(data_dir: Path) -> dict[str, object]:
    try:
        return dict(json.loads((data_dir / "up.json").read_text()))
    except (OSError, ValueError) as exc:
        raise ConflictError("chaos works only in all-in-one mode (`ferry up`), and this cluster is not one") from exc


def schedule_kill(data_dir: Path, node: str, at: float, kind: str) -> None:
    chaos = data_dir / "chaos"
    chaos.mkdir(exist_ok=True)
    tmp = chaos / f".{node}.tmp"
    tmp.write_text(json.dumps({"node": node, "kill_at": at, "kind": kind}))
    tmp.replace(chaos / f"{node}.json")


async def inject(data_dir: Path, kind: str, node: str, in_s: float) -> tuple[float, str]:
    """Performs one chaos action; returns when the node dies and a line saying what was done."""
    if kind not in KINDS:
        raise UsageError(f"unknown chaos {kind!r}: use {' or '.join(KINDS)}")
    state = up_state(data_dir)
    if kind.startswith("fail-live-"):
        phase = kind.removeprefix("fail-live-")
        arm_live_fault(data_dir, phase)
        return time.time(), f"the next live move fails in its {phase} phase"
    if node not in list(state.get("nodes", [])):  # type: ignore[call-overload]
        raise ConflictError(f"{node} is not a simulated node of this `ferry up`")
    if kind == "kill-node":
        now = time.time()
        schedule_kill(data_dir, node, now, kind)
        return now, f"{node} is being killed (services and workloads, SIGKILL)"
    if in_s < 0:
        raise UsageError("--in must not be negative")
    urls = state.get("metadata", {})
    assert isinstance(urls, dict)
    url = urls.get(node)
    if not url:
        raise ConflictError(f"{node} has no simulated metadata endpoint")
    deadline = time.time() + (in_s or 120.0)
    await send_notice(str(url), "all", "interruption", in_s=deadline - time.time())
    schedule_kill(data_dir, node, deadline, kind)
    return deadline, f"{node} announces a spot interruption; it dies in {deadline - time.time():.0f}s"
