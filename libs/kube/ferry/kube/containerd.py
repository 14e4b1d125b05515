"""containerd's configuration gains the runtime ``ferry`` (what the node agent's DaemonSet does on
each node, as ``ferry pod install-runtime``): a runc-v2 runtime whose runc is ``ferry-runc``, that
passes the pod annotations the runtime reads (``ferry.dev/*`` and an Indexed Job's completion
index) into each container's spec, and keeps runc's state in a root of its own.

The section is appended between two marker lines and replaced on the next install, so installing
is idempotent and uninstalling removes exactly it. containerd 1.x (config version 2) and 2.x
(version 3) name the CRI runtime plugin differently; both are handled. containerd reads its
configuration when it starts: restart it afterwards.
"""

from __future__ import annotations

import re
import tomllib

from ferry.common.errors import UsageError
from ferry.kube.annotations import COMPLETION_INDEX, PREFIX, RUNTIME_HANDLER

BEGIN = "# ferry runtime: begin (written by `ferry pod install-runtime`; edits between these lines are replaced)"
END = "# ferry runtime: end"
PLUGIN = {2: 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes',
          3: 'plugins."io.containerd.cri.v1.runtime".containerd.runtimes'}
DEFAULT_RUNC_ROOT = "/run/ferry/runc"


def _strip(text: str) -> str:
    return re.sub(rf"\n?{re.escape(BEGIN)}.*?{re.escape(END)}\n?", "\n", text, flags=re.DOTALL)


def section(version: int, binary: str, runc_root: str = DEFAULT_RUNC_ROOT) -> str:
    table = f"{PLUGIN[version]}.{RUNTIME_HANDLER}"
    annotations = ", ".join(f'"{a}"' for a in (f"{PREFIX}*", COMPLETION_INDEX))
    return (f"{BEGIN}\n[{table}]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [{annotations}]\n"
            f"[{table}.options]\n  BinaryName = \"{binary}\"\n  Root = \"{runc_root}\"\n{END}\n")


def install(config: str, binary: str, runc_root: str = DEFAULT_RUNC_ROOT) -> str:
    """``config`` (containerd's config.toml) with the ``ferry`` runtime, once. UsageError when it is
    not TOML, has no version Ferry knows, or already defines a ``ferry`` runtime of its own."""
    base = _strip(config)
    try:
        parsed = tomllib.loads(base)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"containerd's configuration is not valid TOML: {exc}") from None
    version = int(parsed.get("version", 1))
    if version not in PLUGIN:
        raise UsageError(f"containerd configuration version {version}: Ferry knows versions 2 (containerd 1.x) "
                         "and 3 (containerd 2.x); run `containerd config default` to see yours")
    if _runtimes(parsed, version).get(RUNTIME_HANDLER) is not None:
        raise UsageError(f"containerd's configuration already defines a runtime {RUNTIME_HANDLER!r} outside "
                         "Ferry's section: remove it first")
    out = base.rstrip("\n") + "\n\n" + section(version, binary, runc_root)
    tomllib.loads(out)  # still one valid document
    return out


def uninstall(config: str) -> str:
    return _strip(config).rstrip("\n") + "\n"


def _runtimes(parsed: dict[str, object], version: int) -> dict[str, object]:
    node: object = parsed
    path = ["plugins", "io.containerd.grpc.v1.cri" if version == 2 else "io.containerd.cri.v1.runtime",
            "containerd", "runtimes"]
    for key in path:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def runtime_options(config: str) -> dict[str, object]:
    """The ``ferry`` runtime's options in a configuration (``install``'s result): what containerd reads."""
    parsed = tomllib.loads(config)
    entry = _runtimes(parsed, int(parsed.get("version", 1))).get(RUNTIME_HANDLER)
    return dict(entry) if isinstance(entry, dict) else {}
