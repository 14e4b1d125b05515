"""A progress bar on stderr for long operations, shown only on a terminal."""

import sys
from contextlib import AbstractContextManager
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)


class OpProgress(AbstractContextManager["OpProgress"]):
    def __init__(self, title: str, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.title = title
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> "OpProgress":
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.title, total=None)
        return self

    def update(self, phase: str, done: int, total: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=f"{self.title}: {phase}", completed=done,
                                  total=total or None)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(et, ev, tb)
