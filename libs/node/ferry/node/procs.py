"""Small helpers over /proc for a workload's process tree."""

import contextlib
import os
import signal
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants (read from /proc/<pid>/task/*/children), parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return out


def signal_tree(pid: int, sig: signal.Signals) -> None:
    for p in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)
