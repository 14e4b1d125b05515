"""The root of every error Ferry raises on purpose.

    FerryError                      anything Ferry reports to a user (exit code 1 unless said)
    ├── UsageError                  bad input: refused before anything starts (exit code 2)
    │   └── QuotaExceeded           the tenant's quota has no room for the job (exit code 2)
    ├── PermissionDenied            the caller's role may not do that (exit code 2)
    ├── NotFoundError               unknown job, node or checkpoint (exit code 2)
    ├── ConflictError               the request does not fit the current state (exit code 1)
    │   └── AlreadyExistsError      a name that is taken (exit code 2)
    ├── ConfigError                 an invalid configuration file or FERRY_* variable
    └── (per-domain roots elsewhere: ferry.store.errors.StoreError,
         ferry.criu.errors.CriuError, ferry.common.bus.BusError, ...)

Errors from libraries (nats, grpc, minio, CRIU) are translated at the boundary with
``raise FerryError(...) from exc`` so that callers handle one tree. An error that ends an operation
crosses the bus as its kind (``kind_of``: the nearest class of this module's tree, by name) and is
raised again on the other side (``from_kind``), so that the API answers a scheduler's NotFoundError
with NOT_FOUND, as it would its own.
"""


class FerryError(Exception):
    """Base of every error Ferry raises on purpose; ``str(err)`` is one line for the user."""

    exit_code = 1


class UsageError(FerryError):
    """Invalid input from the user; nothing was changed."""

    exit_code = 2


class QuotaExceeded(UsageError):
    """A submit that would take the tenant past its quota; nothing was started."""


class LimitExceeded(QuotaExceeded):
    """An agent's action over one of the hourly limits its operator set; nothing was changed."""


class PermissionDenied(FerryError):
    """The caller's token does not allow this (an admin's call, say); nothing was changed."""

    exit_code = 2


class NotFoundError(FerryError):
    """An unknown job, node or checkpoint; nothing was changed."""

    exit_code = 2


class ConflictError(FerryError):
    """The request is valid but does not fit the current state (a job already running, say)."""


class AlreadyExistsError(ConflictError):
    """A name (of a job, say) that another one already holds; nothing was changed."""

    exit_code = 2


class ConfigError(FerryError):
    """An invalid configuration file or FERRY_* variable."""

    exit_code = 2


_KINDS: dict[str, type[FerryError]] = {
    cls.__name__: cls for cls in (FerryError, UsageError, NotFoundError, ConflictError, AlreadyExistsError, ConfigError,
                                  QuotaExceeded, PermissionDenied)
}


def kind_of(exc: FerryError) -> str:
    """The name of the nearest class of this module's tree that `exc` is an instance of."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _KINDS and _KINDS[cls.__name__] is cls:
            return cls.__name__
    return FerryError.__name__


def from_kind(kind: str, message: str, exit_code: int | None = None) -> FerryError:
    """The error of kind `kind` (FerryError for an unknown or empty kind) with `message`."""
    exc = _KINDS.get(kind, FerryError)(message)
    if exit_code is not None and kind not in _KINDS:
        exc.exit_code = exit_code  # an error from before kinds crossed the bus: its code is all there is
    return exc


def describe(exc: BaseException) -> str:
    """An exception as one line of an error message: its text, or its type's name when it has none
    (some client libraries raise timeouts with no text, which left messages ending in ": ")."""
    return " ".join(str(exc).split()) or type(exc).__name__
