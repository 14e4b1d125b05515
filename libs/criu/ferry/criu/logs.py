"""Pick the lines of a CRIU log worth showing to a user."""

from __future__ import annotations

from pathlib import Path

__all__ = ["failure_summary", "first_error", "log_excerpt", "read_log_excerpt"]

# Errors CRIU prints on every run on these machines and that explain no failure: without
# CAP_SYS_RESOURCE it cannot raise RLIMIT_NOFILE (see DESIGN).
BENIGN = ("Can't setup RLIMIT_NOFILE",)
# Generic closing lines: a reason only when nothing better was said.
GENERIC = ("Dumping FAILED", "Restoring FAILED")

MAX_LINES = 30
TAIL_LINES = 10
_MAX_LINE_CHARS = 400


def log_excerpt(lines: list[str], *, max_lines: int = MAX_LINES, tail: int = TAIL_LINES) -> list[str]:
    """Every "Error"/"Warn" line plus the last ``tail`` lines, in log order, at most ``max_lines``.

    When there are too many, the earliest warnings go first, then the earliest errors: the tail and
    the errors nearest to it are what explains a failure.
    """
    lines = [line.rstrip("\n")[:_MAX_LINE_CHARS] for line in lines]
    n = len(lines)
    tail_idx = set(range(max(0, n - tail), n))
    errors = [i for i, line in enumerate(lines) if "Error" in line and i not in tail_idx]
    warns = [i for i, line in enumerate(lines) if "Warn" in line and "Error" not in line and i not in tail_idx]
    room = max(0, max_lines - len(tail_idx))
    keep_errors = errors[-room:] if room else []
    room -= len(keep_errors)
    keep_warns = warns[-room:] if room else []
    chosen = sorted(tail_idx.union(keep_errors, keep_warns))
    return [lines[i] for i in chosen]


def read_log_excerpt(path: Path) -> list[str]:
    """``log_excerpt`` of a log file; an empty list when it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return log_excerpt(text.splitlines())


def first_error(lines: list[str]) -> str | None:
    """The first line that reports a real error (not a known benign or generic one), or ``None``."""
    errors = [line.strip() for line in lines if "Error" in line and not any(b in line for b in BENIGN)]
    specific = [line for line in errors if not any(g in line for g in GENERIC)]
    found = specific or errors
    return found[0] if found else None


def failure_summary(log_path: Path, output: str) -> tuple[list[str], str]:
    """The excerpt and one-line reason of a failed CRIU run: from its log, else from its own output
    (CRIU fails before opening its log on a bad option or a missing images dir)."""
    excerpt = read_log_excerpt(log_path)
    if excerpt:
        return excerpt, first_error(excerpt) or excerpt[-1].strip()
    lines = [line for line in output.splitlines() if line.strip()]
    reason = first_error(lines) or (lines[0].strip() if lines else "no output")
    excerpt = log_excerpt(lines)
    return ([reason] if reason not in excerpt else []) + excerpt, reason
