"""The base of every record Ferry stores in KV or sends on the bus."""

import copy
from enum import Enum
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict

M = TypeVar("M", bound=BaseModel)


class Record(BaseModel):
    # JSON has no NaN or infinity (pydantic would write them as null, which then does not read back)
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    def clone(self) -> Self:
        """A deep copy, as ``model_copy(deep=True)`` makes it, at a third of its CPU: records hold
        JSON's values (and enums, records, sets of them), copied here without ``copy.deepcopy``'s
        memo. The scheduler copies every job and op at each step of an operation."""
        return clone(self)


def clone(model: M) -> M:
    """A deep copy of any pydantic model, as ``Record.clone`` makes it."""
    out = model.__class__.__new__(model.__class__)
    object.__setattr__(out, "__dict__", {k: v if type(v) in _ATOMS else _deep(v) for k, v in model.__dict__.items()})
    object.__setattr__(out, "__pydantic_fields_set__", set(model.__pydantic_fields_set__))
    object.__setattr__(out, "__pydantic_extra__", _deep(model.__pydantic_extra__))
    object.__setattr__(out, "__pydantic_private__", _deep(model.__pydantic_private__))
    return out


_ATOMS = frozenset({str, int, float, bool, bytes, type(None)})  # immutable: the copy shares them


def _deep(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is list:
        return [v if type(v) in _ATOMS else _deep(v) for v in value]
    if kind is dict:
        return {k: v if type(v) in _ATOMS else _deep(v) for k, v in value.items()}
    if isinstance(value, Enum | frozenset):
        return value
    if isinstance(value, BaseModel):
        return clone(value)
    if kind is tuple:
        return tuple(_deep(v) for v in value)
    if kind is set:
        return {_deep(v) for v in value}
    return copy.deepcopy(value)  # a value of another kind: as pydantic copies it
