"""Parsing of human units on the command line and in configuration: durations and byte sizes."""

import re

from ferry.common.errors import UsageError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_duration(text: str) -> float:
    """Seconds in `text`: "30s", "1h30m", "250ms", "2d" or a plain number of seconds.

    >>> parse_duration("1m30s")
    90.0
    """
    value = text.strip().lower()
    if not value:
        raise UsageError("empty duration: give a number with a unit, like 30s, 5m or 1h30m")
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
            pos = match.end()
        if pos != len(value):
            raise UsageError(
                f"bad duration {text!r}: use a number with a unit, like 30s, 5m or 1h30m"
            ) from None
    if seconds < 0:
        raise UsageError(f"bad duration {text!r}: it must not be negative")
    return seconds


def parse_size(text: str) -> int:
    """Bytes in `text`: "2GiB", "512M", "1.5g", "4096" (binary units with an i, decimal without)."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"bad size {text!r}: use a number with a unit, like 512MiB or 2GiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    base = unit[:1] if unit != "b" else ""
    factor = 1024 ** "bkmgt".index(base or "b") if "i" in unit else _SIZE_UNITS[base]
    return int(number * factor)


def format_bytes(n: float) -> str:
    """A short human form: 1.5 GiB, 312 KiB, 12 B."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
