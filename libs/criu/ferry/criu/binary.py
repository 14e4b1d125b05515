"""Finding the ``criu`` binary and reading its version."""

from __future__ import annotations

import os
import platform
import re
import shutil

__all__ = ["EXTRA_DIRS", "MIN_VERSION", "find_criu", "parse_version", "required_version", "setup_hint"]

# CRIU lives in sbin, which a non-login root shell or a service unit often lacks on PATH.
EXTRA_DIRS = ("/usr/local/sbin", "/usr/sbin")
# CRIU older than 4.1 fails on kernels 6.13+ ("vdso: Unexpected rt vDSO area bounds"), and 4.1
# cannot dump a TCP or UDP socket on kernels 6.16+ (it reads SO_PASSCRED on inet sockets, which
# those kernels refuse: criu #2705, fixed in 4.2). DESIGN.md's "CRIU >= 4.1" predates the latter.
MIN_VERSION = (4, 1)
SOCKETS_MIN_VERSION = (4, 2)
SOCKETS_KERNEL = (6, 16)

_KERNEL = re.compile(r"^(\d+)\.(\d+)")


def required_version(kernel_release: str | None = None) -> tuple[int, int]:
    """The oldest CRIU (major, minor) that checkpoints every workload on this kernel."""
    match = _KERNEL.match(kernel_release if kernel_release is not None else platform.release())
    if match and (int(match[1]), int(match[2])) >= SOCKETS_KERNEL:
        return SOCKETS_MIN_VERSION
    return MIN_VERSION


def setup_hint() -> str:
    """What to do about a missing or too old CRIU, for this kernel."""
    major, minor = required_version()
    return f"run ./setup.sh, or install CRIU >= {major}.{minor} (what kernel {platform.release()} needs)"

_VERSION = re.compile(r"^Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", re.MULTILINE)


def find_criu(criu_bin: str = "criu") -> str | None:
    """Absolute path of ``criu_bin``: as given when it holds a slash, else PATH then sbin dirs."""
    if os.sep in criu_bin:
        return criu_bin if os.path.isfile(criu_bin) and os.access(criu_bin, os.X_OK) else None
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *EXTRA_DIRS])
    return shutil.which(criu_bin, path=search)


def parse_version(output: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from ``criu --version`` output ("Version: 4.1.1")."""
    match = _VERSION.search(output)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)
