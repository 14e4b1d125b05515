"""Faults armed on purpose in the all-in-one mode (`ferry chaos fail-live`), to test recovery.

The API writes the fault into <data-dir>/chaos/; the scheduler takes it (once) when it starts the
next live move and names it in the node command of the phase that must fail (``NodeOptions.fail``);
the node services ask their one fault hook (``FaultHook``) at each such point."""

import json
import logging
from pathlib import Path

from ferry.common.moves import NodeOptions
from ferry.common.phases import LIVE_PHASES, FaultPhase

log = logging.getLogger(__name__)

LIVE_FAULT_FILE = "live-fault.json"


def arm_live_fault(data_dir: Path, phase: str) -> None:
    chaos = data_dir / "chaos"
    chaos.mkdir(exist_ok=True)
    tmp = chaos / f".{LIVE_FAULT_FILE}.tmp"
    tmp.write_text(json.dumps({"phase": phase}))
    tmp.replace(chaos / LIVE_FAULT_FILE)


def take_live_fault(data_dir: Path, phases: tuple[FaultPhase, ...] = LIVE_PHASES) -> FaultPhase | None:
    """The phase in which the next live move must fail, if one was armed; disarms it. `phases`:
    only a fault of one of these is taken (a gang checkpoint takes ``round``: a member's dump)."""
    path = data_dir / "chaos" / LIVE_FAULT_FILE
    try:
        phase = json.loads(path.read_text()).get("phase")
    except (OSError, ValueError, AttributeError):
        return None
    if phase not in phases:
        return None
    path.unlink(missing_ok=True)
    return next((p for p in LIVE_PHASES if p == phase), None)


class FaultHook:
    """Where node services ask whether to fail on purpose: ``hit`` is true once per command whose
    armed fault is `phase`, and says so in the log; ``raise_at`` raises what the real failure
    raises. Every fault point of the node services goes through one of the two."""

    def hit(self, options: NodeOptions, phase: FaultPhase) -> bool:
        if not options.fails_at(phase):
            return False
        log.warning("injected fault: failing the live move in its %s phase", phase)
        return True

    def raise_at(self, options: NodeOptions, phase: FaultPhase, error: type[Exception], **kw: object) -> None:
        if self.hit(options, phase):
            raise error(f"injected failure during the {PHASE_NAMES[phase]}", **kw)


PHASE_NAMES: dict[FaultPhase, str] = {"round": "pre-copy round", "freeze": "final dump", "restore": "restore",
                                      "postcopy": "post-copy", "source": "freeze (the source dies)"}
