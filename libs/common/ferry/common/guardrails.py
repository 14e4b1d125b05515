"""What an agent may do in an hour: the limits an operator sets on agent tokens, and the pure check
of one more action against what the audit trail says the agent already did.

The limits live in the tokens file, per tenant (they apply to each agent token of that tenant)::

    tenants:
      ops:
        agent_limits: {moves_per_hour: 6, drains_per_hour: 1, cost_per_hour: 12.5}

A move is a migrate or a restore; a drain is a drain of a node (an undrain is not counted). The cost
an action commits is the hourly price of the node it sends work to (a migrate's or restore's target);
``cost_per_hour`` caps the sum over the last hour. Unset limits take the defaults below: an agent
that nobody configured may move a few jobs, drain no node and commit any cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ferry.common.models import AuditEntry

HOUR_S = 3600.0
DEFAULT_MOVES_PER_HOUR = 6
DEFAULT_DRAINS_PER_HOUR = 0


class Action(StrEnum):
    """The kinds of mutating call the limits count."""

    MOVE = "move"
    DRAIN = "drain"
    OTHER = "other"


METHOD_ACTIONS = {"Migrate": Action.MOVE, "Restore": Action.MOVE, "DrainNode": Action.DRAIN}


class AgentLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    moves_per_hour: int = Field(default=DEFAULT_MOVES_PER_HOUR, ge=0)
    drains_per_hour: int = Field(default=DEFAULT_DRAINS_PER_HOUR, ge=0)
    cost_per_hour: float | None = Field(default=None, ge=0)  # USD/h committed per hour; None: no limit


def action_of(method: str, *, undo: bool = False) -> Action:
    """What a mutating RPC counts as (an undrain gives capacity back: it counts as nothing)."""
    if method == "DrainNode" and undo:
        return Action.OTHER
    return METHOD_ACTIONS.get(method, Action.OTHER)


def spent(entries: Iterable[AuditEntry], who: str, tenant: str, now: float) -> dict[str, float]:
    """The agent's moves, drains and committed cost in the hour before ``now``, from its audit
    entries that ended well (a refused or failed call changed nothing, so it costs nothing)."""
    used = {Action.MOVE.value: 0.0, Action.DRAIN.value: 0.0, "cost": 0.0}
    for entry in entries:
        if entry.who != who or entry.tenant != tenant or entry.outcome != "ok" or now - entry.time > HOUR_S:
            continue
        if entry.undo:
            continue
        action = METHOD_ACTIONS.get(entry.method)
        if action is not None:
            used[action.value] += 1
            used["cost"] += entry.cost_per_hour
    return used


def refusal(limits: AgentLimits, used: dict[str, float], action: Action, cost_per_hour: float,
            pending: int = 0) -> str | None:
    """Why one more ``action`` committing ``cost_per_hour`` would break a limit, or None.

    ``pending``: the agent's actions of the same kind that have been allowed but not yet recorded."""
    if action is Action.MOVE and used[Action.MOVE.value] + pending + 1 > limits.moves_per_hour:
        return (f"over this agent's limit of {limits.moves_per_hour} moves per hour "
                f"({used[Action.MOVE.value] + pending:g} in the last hour): ask an operator, or wait")
    if action is Action.DRAIN and used[Action.DRAIN.value] + pending + 1 > limits.drains_per_hour:
        return (f"over this agent's limit of {limits.drains_per_hour} drains per hour "
                f"({used[Action.DRAIN.value] + pending:g} in the last hour): ask an operator, or wait")
    if (action is not Action.OTHER and limits.cost_per_hour is not None
            and used["cost"] + cost_per_hour > limits.cost_per_hour):
        return (f"over this agent's limit of {limits.cost_per_hour:g} USD/h committed per hour "
                f"({used['cost']:g} committed, this action {cost_per_hour:g}): ask an operator, or wait")
    return None
