"""The one fault hook the node services ask at every fault point (ferry.sim.faults)."""

import pytest

from ferry.common.moves import NodeOptions
from ferry.common.phases import LIVE_PHASES
from ferry.criu.lazy_common import LiveMoveFailed
from ferry.sim.faults import PHASE_NAMES, FaultHook


def test_only_the_armed_phase_fails_and_it_fails_as_the_real_failure_would() -> None:
    hook = FaultHook()
    armed = NodeOptions(fail="freeze")
    assert hook.hit(armed, "freeze") and not hook.hit(armed, "restore") and not hook.hit(NodeOptions(), "freeze")
    hook.raise_at(armed, "restore", LiveMoveFailed, source_running=True)  # another phase: nothing happens
    with pytest.raises(LiveMoveFailed, match="injected failure during the final dump") as err:
        hook.raise_at(armed, "freeze", LiveMoveFailed, source_running=True)
    assert err.value.source_running


def test_every_phase_that_can_be_armed_has_a_name() -> None:
    assert set(PHASE_NAMES) == set(LIVE_PHASES)
