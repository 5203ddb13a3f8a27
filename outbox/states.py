"""The one status enum of an operation, and the one table of allowed transitions.

The database mirrors :class:`OperationStatus` with a CHECK constraint on
``outbox_operations.status`` (see :mod:`outbox.schema`). Every move between states in
the code goes through :func:`check_transition` (a statement's written value through
:func:`checked_move`, which calls it); the table below is also what
``docs/state-machine.md`` draws.

Who moves a row *out* of each state:

=============  ==================================================================
pending        the dispatcher's claim (-> claimed); cancellation (-> cancelled, or -> unknown
               when an earlier attempt may have landed)
claimed        the dispatcher's checks (-> dispatching / blocked / cancelled, or
               unknown when an earlier ambiguous attempt may not be re-sent blindly);
               lease recovery (-> pending: it was never sent)
dispatching    the dispatcher recording an outcome (-> applied / rejected /
               pending / unknown / blocked); lease recovery (-> unknown, never pending)
unknown        reconciliation with the provider (-> applied / pending / blocked),
               or a named operator with evidence (``outboxd ops resolve``)
blocked        a person: requeue (-> pending), resolve, cancel
applied        the verifier (-> verified); otherwise terminal
verified       terminal
rejected       terminal
cancelled      terminal
=============  ==================================================================

Nothing leaves a terminal state except through an operator override recorded in
``outbox_events``.
"""

from __future__ import annotations

import functools
from enum import StrEnum

from outbox.errors import IllegalTransition


class OperationStatus(StrEnum):
    PENDING = "pending"
    CLAIMED = "claimed"
    DISPATCHING = "dispatching"
    APPLIED = "applied"
    VERIFIED = "verified"
    REJECTED = "rejected"
    UNKNOWN = "unknown"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"


S = OperationStatus

#: Allowed automatic transitions (from -> set of to). Operator overrides are separate.
TRANSITIONS: dict[OperationStatus, frozenset[OperationStatus]] = {
    S.PENDING: frozenset({S.CLAIMED, S.CANCELLED, S.BLOCKED, S.UNKNOWN}),
    S.CLAIMED: frozenset({S.DISPATCHING, S.BLOCKED, S.PENDING, S.CANCELLED, S.UNKNOWN}),
    S.DISPATCHING: frozenset({S.APPLIED, S.REJECTED, S.PENDING, S.UNKNOWN, S.BLOCKED}),
    S.UNKNOWN: frozenset({S.APPLIED, S.PENDING, S.BLOCKED, S.REJECTED}),
    S.BLOCKED: frozenset({S.PENDING, S.CANCELLED}),
    S.APPLIED: frozenset({S.VERIFIED}),
    S.VERIFIED: frozenset(),
    S.REJECTED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL: frozenset[OperationStatus] = frozenset({S.APPLIED, S.VERIFIED, S.REJECTED, S.CANCELLED})
"""States an operation is finished in (``applied`` may still be verified)."""

NON_TERMINAL: frozenset[OperationStatus] = frozenset(set(S) - TERMINAL)

SETTLED: frozenset[OperationStatus] = TERMINAL | {S.BLOCKED}
"""States an agent can act on with no more work of the dispatcher's: finished, or waiting
for a person (``outbox.wait_for`` returns in them; ``unknown`` only after a patience)."""

#: Operator overrides (``outboxd ops resolve``/``requeue``/``cancel``): always recorded
#: with actor, reason and evidence in ``outbox_events``.
OVERRIDES: dict[OperationStatus, frozenset[OperationStatus]] = {
    S.UNKNOWN: frozenset({S.APPLIED, S.PENDING, S.REJECTED, S.CANCELLED}),
    S.BLOCKED: frozenset({S.APPLIED, S.PENDING, S.REJECTED, S.CANCELLED}),
    S.PENDING: frozenset({S.CANCELLED}),
    S.REJECTED: frozenset({S.PENDING}),
    S.APPLIED: frozenset({S.VERIFIED}),
}


#: ``last_outcome`` values after which the effect may exist at the receiver. Sticky until a
#: reconciliation establishes "not applied" (``reconciled_not_applied``): a row carrying one
#: is never re-sent blindly, nor cancelled as if it had never been sent.
MAYBE_APPLIED: frozenset[str] = frozenset({"ambiguous", "in_flight", "lost", "accepted"})


def check_transition(
    old: OperationStatus | str, new: OperationStatus | str, *, override: bool = False
) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is allowed."""
    o, n = OperationStatus(old), OperationStatus(new)
    table = OVERRIDES if override else TRANSITIONS
    if n not in table.get(o, frozenset()):
        raise IllegalTransition(from_status=o.value, to_status=n.value, override=override)


@functools.cache  # a few dozen moves exist; a refused one raises and is not kept
def checked_move(
    old: OperationStatus | str | tuple[OperationStatus, ...], new: OperationStatus | str
) -> str:
    """The value a statement writes to move ``old -> new`` (``old``: the status, or the
    statuses, its WHERE clause admits), once each move is checked (:func:`check_transition`):
    every write of a status goes through here or through :func:`check_transition`, so the
    table above is the one place moves are allowed. Each move is checked once: the
    recording thread asks for one per recorded send."""
    for source in old if isinstance(old, tuple) else (old,):
        if OperationStatus(source) != OperationStatus(new):  # a write that stays is no move
            check_transition(source, new)
    return OperationStatus(new).value


def sql_check_constraint(column: str = "status") -> str:
    """The CHECK expression that mirrors the enum in both dialects."""
    values = ", ".join(f"'{s.value}'" for s in OperationStatus)
    return f"{column} IN ({values})"
