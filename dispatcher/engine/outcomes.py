"""Deciding what an outcome means for an operation — pure functions, no I/O.

The decisions follow from what the provider *declares* (:class:`providers.base.Capabilities`)
and from persisted state (attempts, first dispatch, the last outcome), never from guesses.

A re-send is *blind* when an earlier attempt may have been applied (an ambiguous outcome,
an in-flight conflict, a lease lost while dispatching) and no look-up has since shown it
was not. A blind re-send is safe only while the receiver still remembers the key:
``now + delay < first_dispatched_at + dedup_retention * (1 - safety_margin)``. Past that —
or with a receiver that does not deduplicate at all — the row goes to ``unknown`` and is
reconciled by look-up; a new key is never minted.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from dispatcher.engine.retry import RetryPolicy
from outbox import states
from outbox.states import OperationStatus
from providers.base import Capabilities, Outcome, OutcomeKind

S = OperationStatus

#: Last outcomes after which the effect may exist at the receiver. Sticky until a
#: reconciliation establishes "not applied" (``reconciled_not_applied``).
MAYBE_APPLIED = states.MAYBE_APPLIED

BUDGET_EXHAUSTED = "budget_exhausted"
RECEIVER_STUCK_IN_FLIGHT = "receiver_stuck_in_flight"
"""The budget ran out while the receiver still answered 409 "in flight" for the key: its
idempotency record of a request that died half-way holds the key (a person checks the
receiver: docs/runbook.md)."""
DEDUP_WINDOW_PASSED = "dedup_window_passed"
NO_DEDUP_AMBIGUOUS = "ambiguous_receiver_does_not_deduplicate"
KEY_REUSED = "key_reused_with_different_payload"
AWAITING_CONFIRMATION = "awaiting_confirmation"


class Decision(NamedTuple):
    """What an outcome means for its operation (a named tuple: one is made per send
    recorded, see :mod:`dispatcher.store.transitions`)."""

    status: OperationStatus
    reason: str | None = None
    delay_seconds: float | None = None
    last_outcome: str | None = None
    receipt: Any = None
    retried: bool = False
    dedup_refused: bool = False


def policy_for(
    caps: Capabilities, max_attempts: int | None, max_elapsed_seconds: float | None
) -> RetryPolicy:
    """The row's own budget if it set one, else the provider's; the provider's back-off."""
    return _policy(
        max_attempts or caps.max_attempts,
        max_elapsed_seconds or caps.max_elapsed_seconds,
        caps.retry_max_delay_seconds,
    )


@functools.lru_cache(maxsize=256)
def _policy(max_attempts: int, max_elapsed_seconds: float, cap_seconds: float) -> RetryPolicy:
    """Policies hold no per-row state: one per budget is built once and shared."""
    return RetryPolicy(max_attempts, max_elapsed_seconds, cap_seconds=cap_seconds)


def window_open(
    caps: Capabilities, margin: float, first_dispatched_at: datetime | None, at: datetime
) -> bool:
    """Does the receiver still remember a key first sent at ``first_dispatched_at``?"""
    if caps.dedup_retention_seconds <= 0:
        return False
    if first_dispatched_at is None:
        return True
    usable = caps.dedup_retention_seconds * (1.0 - margin)
    return at < first_dispatched_at + timedelta(seconds=usable)


def blind(last_outcome: str | None) -> bool:
    return last_outcome in MAYBE_APPLIED


def decide(
    outcome: Outcome,
    *,
    caps: Capabilities,
    policy: RetryPolicy,
    margin: float,
    attempts: int,
    first_dispatched_at: datetime,
    prior_outcome: str | None,
    now: datetime,
) -> Decision:
    """Map one provider outcome to the operation's next state."""
    kind = outcome.kind
    if kind == OutcomeKind.APPLIED:
        return Decision(S.APPLIED, last_outcome="applied", receipt=dict(outcome.receipt or {}))
    if kind == OutcomeKind.REJECTED:
        return Decision(
            S.REJECTED,
            reason=outcome.reason or f"http_{outcome.status_code}",
            last_outcome="rejected",
            receipt=dict(outcome.receipt or {}) or None,
        )
    if kind == OutcomeKind.KEY_MISMATCH:
        return Decision(S.BLOCKED, reason=KEY_REUSED, last_outcome="key_mismatch")
    if kind == OutcomeKind.ACCEPTED:
        return Decision(
            S.UNKNOWN,
            reason=AWAITING_CONFIRMATION,
            last_outcome="accepted",
            receipt=dict(outcome.receipt or {}) or None,
        )

    maybe_applied = kind in (OutcomeKind.AMBIGUOUS, OutcomeKind.IN_FLIGHT)
    sticky = "ambiguous" if (maybe_applied or blind(prior_outcome)) else "retryable"
    if kind == OutcomeKind.IN_FLIGHT:
        sticky = "in_flight"
    if sticky != "retryable" and caps.dedup_retention_seconds <= 0:
        return Decision(S.UNKNOWN, reason=NO_DEDUP_AMBIGUOUS, last_outcome=sticky)
    step = policy.decide(
        attempts=attempts,
        first_dispatched_at=first_dispatched_at,
        now=now,
        retry_after_seconds=outcome.retry_after_seconds,
    )
    if not step.retry:
        if sticky == "retryable":
            return Decision(S.BLOCKED, reason=BUDGET_EXHAUSTED, last_outcome=sticky)
        if kind == OutcomeKind.IN_FLIGHT:
            return Decision(S.BLOCKED, reason=RECEIVER_STUCK_IN_FLIGHT, last_outcome=sticky)
        return Decision(S.UNKNOWN, reason=BUDGET_EXHAUSTED, last_outcome=sticky)
    if sticky != "retryable":
        at = now + timedelta(seconds=step.delay_seconds)
        if not window_open(caps, margin, first_dispatched_at, at):
            return Decision(
                S.UNKNOWN, reason=DEDUP_WINDOW_PASSED, last_outcome=sticky, dedup_refused=True
            )
    return Decision(
        S.PENDING,
        reason=f"retry:{kind.value}",
        delay_seconds=step.delay_seconds,
        last_outcome=sticky,
        retried=True,
    )
