"""Faults armed on purpose in the all-in-one mode (`ferry chaos fail-live`), to test recovery.

The API writes the fault into <data-dir>/chaos/; the scheduler takes it (once) when it starts the
next live move and tells the node service that must fail in that phase."""

import json
from pathlib import Path
from typing import get_args

from ferry.common.moves import FaultPhase

LIVE_FAULT_FILE = "live-fault.json"
LIVE_PHASES: tuple[FaultPhase, ...] = get_args(FaultPhase)


def arm_live_fault(data_dir: Path, phase: str) -> None:
    chaos = data_dir / "chaos"
    chaos.mkdir(exist_ok=True)
    tmp = chaos / f".{LIVE_FAULT_FILE}.tmp"
    tmp.write_text(json.dumps({"phase": phase}))
    tmp.replace(chaos / LIVE_FAULT_FILE)


def take_live_fault(data_dir: Path) -> FaultPhase | None:
    """The phase in which the next live move must fail, if one was armed; disarms it."""
    path = data_dir / "chaos" / LIVE_FAULT_FILE
    try:
        phase = json.loads(path.read_text()).get("phase")
    except (OSError, ValueError, AttributeError):
        return None
    path.unlink(missing_ok=True)
    return next((p for p in LIVE_PHASES if p == phase), None)
