"""The phases of a live move, as `ferry chaos fail-live` names them (an armed fault makes the
move fail in one). Kept free of imports beyond typing: the CLI's start-up reads them."""

from typing import Literal, get_args

FaultPhase = Literal["round", "freeze", "restore", "postcopy", "source"]
"""Where an armed fault makes a live move fail (``ferry.sim.faults``)."""

LIVE_PHASES: tuple[FaultPhase, ...] = get_args(FaultPhase)
