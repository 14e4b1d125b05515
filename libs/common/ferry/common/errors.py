"""The root of every error Ferry raises on purpose.

    FerryError                      anything Ferry reports to a user (exit code 1 unless said)
    ├── UsageError                  bad input: refused before anything starts (exit code 2)
    ├── NotFoundError               unknown job, node or checkpoint (exit code 2)
    ├── ConflictError               the request does not fit the current state (exit code 1)
    │   └── AlreadyExistsError      a name that is taken (exit code 2)
    ├── ConfigError                 an invalid configuration file or FERRY_* variable
    └── (per-domain roots elsewhere: ferry.store.errors.StoreError,
         ferry.criu.errors.CriuError, ferry.common.bus.BusError, ...)

Errors from libraries (nats, grpc, minio, CRIU) are translated at the boundary with
``raise FerryError(...) from exc`` so that callers handle one tree.
"""


class FerryError(Exception):
    """Base of every error Ferry raises on purpose; ``str(err)`` is one line for the user."""

    exit_code = 1


class UsageError(FerryError):
    """Invalid input from the user; nothing was changed."""

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
