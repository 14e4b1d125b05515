"""Running the network tools (ip, nft, nsenter, sh) as Ferry's network code does: found on the
usual sbin paths too, run with a timeout, in another network namespace through nsenter when
asked, and one line of error (OSError) when they fail or are missing."""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["SBIN_PATH", "in_netns", "run", "tool"]

SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin"
TIMEOUT_S = 30.0


def tool(name: str) -> str:
    """The path of command `name`; OSError naming what to install when it is missing."""
    found = shutil.which(name) or shutil.which(name, path=SBIN_PATH)
    if found is None:
        raise OSError(f"the {name} command is missing: run ./setup.sh")
    return found


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """`argv` run in the network namespace at path `netns` (as itself when None or empty)."""
    return [tool("nsenter"), f"--net={netns}", "--", *argv] if netns else argv


def run(argv: list[str], *, netns: str | None = None, stdin: str | None = None, check: bool = True) -> str:
    """Runs tool `argv[0]` with its arguments (in `netns`); returns what it printed."""
    full = in_netns(netns, [tool(argv[0]), *argv[1:]])
    try:
        done = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise OSError(f"{' '.join(argv[:6])}: no answer within {TIMEOUT_S:.0f} s") from None
    if check and done.returncode != 0:
        raise OSError(f"{' '.join(argv[:6])}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout
