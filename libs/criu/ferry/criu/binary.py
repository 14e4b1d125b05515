"""Finding the ``criu`` binary and reading its version."""

from __future__ import annotations

import os
import re
import shutil

__all__ = ["EXTRA_DIRS", "MIN_VERSION", "SETUP_HINT", "find_criu", "parse_version"]

# CRIU lives in sbin, which a non-login root shell or a service unit often lacks on PATH.
EXTRA_DIRS = ("/usr/local/sbin", "/usr/sbin")
# CRIU older than 4.1 fails on kernels 6.13+ ("vdso: Unexpected rt vDSO area bounds").
MIN_VERSION = (4, 1)
SETUP_HINT = "run ./setup.sh, or install CRIU >= 4.1 (Debian 13 ships 4.1.1)"

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
