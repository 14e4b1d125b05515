"""Edits of a container's OCI runtime spec that the ``ferry`` runtime makes at ``create``, as pure
functions of the spec (a dict, as ``config.json`` holds it)."""

from __future__ import annotations

import copy
import errno
from typing import Any

IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")


def refuse_io_uring(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with io_uring refused (ENOSYS) by the container's seccomp filter, whatever else the
    filter allows or refuses: CRIU cannot dump an io_uring instance, and libuv (torch's TCPStore,
    Node) opens one when it can but falls back to epoll when the kernel says it has none. Without a
    filter, the container gets one that allows everything else."""
    out = copy.deepcopy(spec)
    linux = out.setdefault("linux", {})
    seccomp = linux.get("seccomp") or {"defaultAction": "SCMP_ACT_ALLOW"}
    rules = []
    for rule in seccomp.get("syscalls") or []:
        names = [n for n in rule.get("names") or [] if n not in IO_URING]
        if names:
            rules.append({**rule, "names": names})
    rules.append({"names": list(IO_URING), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    linux["seccomp"] = {**seccomp, "syscalls": rules}
    return out
