"""bench/jobcost.py's attribution of CPU to kinds of process (what its README table rests on)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))  # after the rest: its modules shadow nothing

from jobcost import cpu_by_kind


def test_cpu_is_counted_by_kind_and_orphans_reaped_by_init_are_the_jobs() -> None:
    before = {1: ("other", 5.0, 100.0), 10: ("zygote", 1.0, 2.0), 11: ("checkpointer", 3.0, 0.0),
              12: ("nats-server", 7.0, 0.0), 13: ("checkpointer", 1.0, 0.0)}
    after = {1: ("other", 5.5, 103.0),  # init reaped the jobs' monitors and workloads: 3 s
             10: ("zygote", 1.5, 4.0),  # the zygote reaped its starters: 2 s, and ran 0.5 s itself
             11: ("checkpointer", 4.0, 0.0), 13: ("checkpointer", 1.25, 0.0),
             12: ("nats-server", 9.0, 0.0),
             20: ("api", 0.75, 0.0)}  # started during the burst: all of its CPU counts
    spent = cpu_by_kind(before, after)
    assert spent == {"other": 0.5, "monitors and workloads": 3.0, "zygote": 2.5, "checkpointer": 1.25,
                     "nats-server": 2.0, "api": 0.75}
