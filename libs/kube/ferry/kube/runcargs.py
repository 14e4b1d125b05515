"""runc's command line as containerd's runc shim writes it, parsed (a pure function) so that the
``ferry`` runtime can tell a ``create`` to turn into a restore, and rebuilt for the real runc.

    runc [GLOBAL OPTIONS] COMMAND [COMMAND OPTIONS] [CONTAINER ID]
"""

from __future__ import annotations

from dataclasses import dataclass, field

# runc's global options and those of `create`/`start` that take a value (the rest are switches)
_GLOBAL_VALUES = {"--root", "--log", "--log-format", "--criu", "--rootless"}
_COMMAND_VALUES = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds", "--pidfd-socket"}


@dataclass(frozen=True)
class RuncCall:
    """One runc invocation: ``globals`` as given (flag, value pairs kept together), the command,
    its options by name (a switch maps to ""), and the positional arguments (the container id)."""

    globals: tuple[str, ...]
    command: str
    options: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()

    def global_value(self, name: str) -> str | None:
        for i, item in enumerate(self.globals):
            if item == name and i + 1 < len(self.globals):
                return self.globals[i + 1]
            if item.startswith(name + "="):
                return item.split("=", 1)[1]
        return None

    @property
    def container_id(self) -> str | None:
        """runc's commands name the container first (``kill ID [SIGNAL]``)."""
        return self.args[0] if self.args else None

    @property
    def signal(self) -> str:
        """The signal of a ``kill``, as written (runc's default: SIGTERM)."""
        return self.args[1] if len(self.args) > 1 else "SIGTERM"

    @property
    def stops(self) -> bool:
        """A ``kill`` that asks the container's init to end gracefully: SIGTERM, as the kubelet sends
        before a pod goes (a drain, a preemption, a suspended job, a spot reclaim's drain)."""
        return self.command == "kill" and "--all" not in self.options and \
            self.signal.upper().removeprefix("SIG") in ("TERM", "15")

    @property
    def bundle(self) -> str | None:
        return self.options.get("--bundle") or self.options.get("-b")


def _split(items: list[str], values: set[str]) -> tuple[list[str], int]:
    """The options at the start of ``items`` (each value kept after its flag) and where they end."""
    taken: list[str] = []
    i = 0
    while i < len(items) and items[i].startswith("-"):
        item = items[i]
        taken.append(item)
        if item in values and i + 1 < len(items):
            taken.append(items[i + 1])
            i += 1
        i += 1
    return taken, i


def parse(argv: list[str]) -> RuncCall:
    """``argv`` without the program name. A call with no command (``runc --version``) has command ""."""
    globals_, i = _split(argv, _GLOBAL_VALUES)
    if i >= len(argv):
        return RuncCall(globals=tuple(globals_), command="")
    command = argv[i]
    rest = argv[i + 1:]
    options: dict[str, str] = {}
    args: list[str] = []
    j = 0
    while j < len(rest):
        item = rest[j]
        if item == "--":
            args.extend(rest[j + 1:])
            break
        if item.startswith("-"):
            name, eq, value = item.partition("=")
            if eq:
                options[name] = value
            elif name in _COMMAND_VALUES and j + 1 < len(rest):
                options[name] = rest[j + 1]
                j += 1
            else:
                options[name] = ""
        else:
            args.append(item)
        j += 1
    return RuncCall(globals=tuple(globals_), command=command, options=options, args=tuple(args))


def restore_argv(call: RuncCall, *, images: str, work: str) -> list[str]:
    """The ``runc restore`` that stands for a ``create`` (``call``): detached, with the same bundle,
    pid file and console socket, from ``images``; the shim then sees a container already running."""
    options = ["--detach", "--bundle", call.bundle or ".", "--image-path", images, "--work-path", work]
    for name in ("--pid-file", "--console-socket"):
        if name in call.options:
            options += [name, call.options[name]]
    if "--no-pivot" in call.options:
        options.append("--no-pivot")
    return [*call.globals, "restore", *options, *call.args]
