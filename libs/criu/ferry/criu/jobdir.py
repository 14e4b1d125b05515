"""The node-local directory of one job: its output files and the state its shim records.

<job dir>/stdout      the workload's stdout (appended; travels with each checkpoint)
<job dir>/stderr      the workload's stderr (likewise)
<job dir>/shim.json   ShimInfo, written once the workload runs
<job dir>/exit.json   ExitInfo, written once it ended
<job dir>/shim.log    the shim's own diagnostics (never the workload's output)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["ExitInfo", "JobDir", "ShimInfo", "write_json_atomic"]

_M = TypeVar("_M", bound=BaseModel)


class ShimInfo(BaseModel):
    """Who runs the workload: the shim (monitor) and the workload root's host PID."""

    model_config = ConfigDict(frozen=True)

    shim_pid: int
    pid: int
    incarnation: int
    started: float
    mode: Literal["launch", "restore", "adopt"]


class ExitInfo(BaseModel):
    """How the workload ended: ``code`` for an exit, ``signal`` when killed by one (both None: an
    adopted process whose parent collected its status before Ferry could read it)."""

    model_config = ConfigDict(frozen=True)

    code: int | None
    signal: int | None
    finished: float
    incarnation: int


def write_json_atomic(path: Path, model: BaseModel) -> None:
    """Write ``model`` as JSON to ``path`` so that readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(model.model_dump_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _read_model(path: Path, model: type[_M]) -> _M | None:
    try:
        return model.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError:
        # Only written atomically, so an unreadable file is foreign; treat it as absent.
        return None


class JobDir:
    """A node-local directory for one job."""

    def __init__(self, path: str | os.PathLike[str], *, canonical: bool = False) -> None:
        # Canonical (symlinks resolved), as the kernel names the files the workload has open: CRIU
        # records those names, and a restore maps them back with --inherit-fd. `canonical`: the
        # caller's path is already (a folder it made in a resolved one), so no lookups are made;
        # a node service names its jobs' folders many times a second in a burst of submits.
        self.path = Path(path) if canonical else Path(path).resolve()

    def __repr__(self) -> str:
        return f"JobDir({str(self.path)!r})"

    @property
    def stdout(self) -> Path:
        return self.path / "stdout"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr"

    @property
    def shim_file(self) -> Path:
        return self.path / "shim.json"

    @property
    def exit_file(self) -> Path:
        return self.path / "exit.json"

    @property
    def monitor_file(self) -> Path:
        """The process group of the shim's monitor (written as it starts, before it reports)."""
        return self.path / "monitor.pgid"

    def read_monitor_group(self) -> int | None:
        try:
            return int(self.monitor_file.read_text())
        except (OSError, ValueError):
            return None

    @property
    def shim_log(self) -> Path:
        return self.path / "shim.log"

    def create(self) -> JobDir:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def read_shim(self) -> ShimInfo | None:
        return _read_model(self.shim_file, ShimInfo)

    def read_exit(self) -> ExitInfo | None:
        return _read_model(self.exit_file, ExitInfo)

    def write_shim(self, info: ShimInfo) -> None:
        write_json_atomic(self.shim_file, info)

    def write_exit(self, info: ExitInfo) -> None:
        write_json_atomic(self.exit_file, info)

    def clear_run_state(self) -> None:
        """Forget the previous run (shim.json, exit.json) before a new one starts."""
        for path in (self.exit_file, self.shim_file, self.monitor_file):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
