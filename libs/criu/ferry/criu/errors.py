"""Errors raised by ``ferry.criu``.

    FerryError                      (ferry.common.errors)
    └── CriuError                   anything that went wrong around CRIU; carries a log excerpt
        ├── CriuMissing             no usable ``criu`` binary (absent, too old, or ``criu check`` fails)
        ├── DumpFailed              ``criu dump`` failed; with --leave-running the tree keeps running
        ├── RestoreFailed           ``criu restore`` failed; nothing of the tree is left running
        ├── LaunchFailed            a workload could not be started (command not found, bad cwd, ...)
        └── ImageError              a CRIU image file is truncated, corrupt or of an unexpected type

``log_excerpt`` holds the lines of CRIU's log worth showing (every ``Error``/``Warn`` line plus the
last lines, at most about 30) and ``log_path`` the full log, when there is one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ferry.common.errors import FerryError

__all__ = [
    "CriuError",
    "CriuMissing",
    "DumpFailed",
    "ImageError",
    "LaunchFailed",
    "RestoreFailed",
]


class CriuError(FerryError):
    """Root of the CRIU domain; ``str(err)`` is one line, details are in ``log_excerpt``."""

    def __init__(
        self,
        message: str,
        *,
        log_excerpt: Sequence[str] = (),
        log_path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.log_excerpt: list[str] = list(log_excerpt)
        self.log_path: str | None = log_path


class CriuMissing(CriuError):
    """No usable CRIU: run the setup command or install CRIU >= 4.2 (4.1 on kernels older than 6.16)."""


class DumpFailed(CriuError):
    """``criu dump`` failed."""


class RestoreFailed(CriuError):
    """``criu restore`` failed."""


class LaunchFailed(CriuError):
    """A workload could not be started."""


class ImageError(CriuError):
    """A CRIU image could not be decoded."""
