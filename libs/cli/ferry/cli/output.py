"""How the CLI prints: one JSON document with `-o json`, short tables and lines otherwise."""

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ferry.common.units import format_bytes


def to_dict(msg: Message) -> dict[str, Any]:
    """A protobuf message as plain JSON-able data: every field present, int64 kept as numbers."""
    out: dict[str, Any] = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                out[field.name] = [to_dict(v) for v in value]
            else:
                out[field.name] = to_dict(value) if msg.HasField(field.name) else None
        elif field.is_repeated:
            out[field.name] = list(value)
        elif field.has_presence and not msg.HasField(field.name):  # an optional scalar left unset
            out[field.name] = None
        elif field.type == FieldDescriptor.TYPE_BYTES:
            out[field.name] = value.decode(errors="replace")
        else:
            out[field.name] = value
    return out


def job_dict(job: Message) -> dict[str, Any]:
    d = to_dict(job)
    d["exit_code"] = d["exit_code"] if d.pop("has_exit_code") else None
    for key in ("node", "last_checkpoint", "error", "reason"):
        d[key] = d[key] or None
    return d


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def ago(t: float) -> str:
    if not t:
        return "-"
    s = max(0.0, time.time() - t)
    if s < 60:
        return f"{s:.0f}s ago"
    if s < 3600:
        return f"{s / 60:.0f}m ago"
    return f"{s / 3600:.1f}h ago"


def size(n: int) -> str:
    return format_bytes(n)
