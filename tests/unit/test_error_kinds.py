"""Errors cross the bus as their kind: what ended an op in the scheduler is raised again, with the
same class and exit code, in the API and the CLI."""

import grpc
import pytest

from ferry.api.errors import status_of
from ferry.cli.client import translate
from ferry.common.bus import BusError
from ferry.common.errors import (
    AlreadyExistsError,
    ConfigError,
    ConflictError,
    FerryError,
    NotFoundError,
    UsageError,
    from_kind,
    kind_of,
)
from ferry.store.errors import StoreError


@pytest.mark.parametrize(("exc", "kind"), [
    (UsageError("x"), "UsageError"), (NotFoundError("x"), "NotFoundError"), (ConflictError("x"), "ConflictError"),
    (AlreadyExistsError("x"), "AlreadyExistsError"), (ConfigError("x"), "ConfigError"),
    (BusError("x"), "FerryError"), (StoreError("x"), "FerryError"),  # other roots: their nearest known class
])
def test_the_kind_is_the_nearest_class_of_the_tree(exc: FerryError, kind: str) -> None:
    assert kind_of(exc) == kind
    again = from_kind(kind, "message")
    assert type(again).__name__ == kind and str(again) == "message"
    assert again.exit_code == exc.exit_code or kind == "FerryError"


def test_a_subclass_outside_the_tree_crosses_as_its_parent() -> None:
    class Busy(ConflictError):
        pass

    assert kind_of(Busy("x")) == "ConflictError"
    assert kind_of(type("Gone", (NotFoundError,), {})("x")) == "NotFoundError"


def test_an_unknown_kind_is_a_ferry_error_with_the_code_that_came_with_it() -> None:
    exc = from_kind("SomethingNew", "m", exit_code=2)
    assert type(exc) is FerryError and exc.exit_code == 2
    assert from_kind("", "m").exit_code == 1
    assert from_kind("NotFoundError", "m", exit_code=1).exit_code == 2  # the kind decides


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize("kind", ["UsageError", "NotFoundError", "AlreadyExistsError", "ConflictError", "FerryError"])
def test_a_kind_keeps_its_exit_code_through_the_api_and_the_cli(kind: str) -> None:
    """What ended an op in the scheduler, raised again in the API (its status), then in the CLI."""
    sent = from_kind(kind, "why")
    got = translate(FakeRpcError(status_of(sent), "why"))
    assert got.exit_code == sent.exit_code and str(got) == "why"
