"""One send and what it means: the in-flight record of a dispatch attempt, and the pure
mapping from its outcome to the operation's next state, the metrics, the log line, the
``outbox_events`` row and the ``outbox_attempts`` row (evidence). No I/O here; the
worker writes the rows in one transaction per batch."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dispatcher.engine import outcomes
from dispatcher.engine.settings import WorkerSettings
from dispatcher.observability import metrics
from dispatcher.store import journal
from dispatcher.store.transitions import Recorded, Transition
from outbox.protection.envelopes import seal_receipt
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from providers.base import Capabilities, Outcome, OutcomeKind, Provider, TransportPhase

log = logging.getLogger("outboxd.dispatch")
S = OperationStatus
KIND_TEXT: dict[OutcomeKind, str] = {k: k.value for k in OutcomeKind}
PHASE_TEXT: dict[TransportPhase, str] = {p: p.value for p in TransportPhase}
"""Each outcome kind's and transport phase's text: a dictionary look-up, where the enum's
``value`` is a property (0.19 µs each, four times an outcome on the recording thread)."""
@dataclass
class InFlight:
    op: OperationRecord
    token: int
    revision: int  # after the dispatching commit
    attempt: int
    first_dispatched_at: datetime
    started_at: datetime
    digest: str | None
    t0: float = field(default_factory=time.monotonic)
    extended_at: float = field(default_factory=time.monotonic)
    outcome: Outcome | None = None
    duration: float = 0.0
    payload: Mapping[str, Any] | None = None  # what is sent (a resolved artifact, verified)
    send_by: float | None = None
    """For a blind re-send: the monotonic instant the receiver's dedup window (less the
    margin) closes. Checked again right before the request leaves: a send delayed past it
    (a full pool, a paused process) is not made, and the row is reconciled instead."""
    not_sent: bool = False
    lease_until: float = float("inf")
    """The monotonic instant this worker's lease on the row ends by its own reckoning: the
    lease time after a clock reading taken *before* the statement that set or extended it,
    so never later than the lease on the database clock. No request leaves after it unless
    the lease is renewed first (``dispatcher.engine.leases``)."""
    lease_lost: bool = False

    def db_now(self) -> datetime:
        """The database clock now, read without a round trip: the database's time at the
        dispatching write plus the monotonic time since (never the host's wall clock). It
        lags the true value by that write's commit latency; every decision it feeds
        (retry or not, window still open) is checked again on the database clock at the
        next claim, and right before a re-send leaves."""
        # (days, seconds): positional, half the time of the keyword (0.57 against 1.1 µs)
        return self.started_at + timedelta(0, time.monotonic() - self.t0)


def not_sent_outcome(item: InFlight, now: float) -> Outcome | None:
    """Why ``item`` must not be sent at monotonic instant ``now``, as its outcome — nothing
    left, "retryable, before the write" — or None: send it."""
    if item.send_by is not None and now >= item.send_by:
        item.not_sent = True
        return _not_sent("DedupWindowPassed", "the receiver's dedup window closed first")
    if now >= item.lease_until:  # the caller may still renew it (``dispatcher.engine.leases``)
        item.lease_lost = True
        return _not_sent("LeaseExpired", "the lease ended before the request left",
                         lease_expired=True)
    return None


def _not_sent(error_class: str, why: str, **evidence: Any) -> Outcome:
    return Outcome(
        OutcomeKind.RETRYABLE,
        transport_phase=TransportPhase.BEFORE_WRITE,
        error_class=error_class,
        reason=f"not sent: {why}",
        evidence={"not_sent": True, **evidence},
    )


def send_deadline(
    caps: Capabilities, s: WorkerSettings, op: OperationRecord, first: datetime, db_now: datetime
) -> float | None:
    """For a blind re-send: the monotonic instant the receiver's dedup window (less the
    margin) closes, from the database clock at the ``dispatching`` write; else None."""
    if not outcomes.blind(op.last_outcome):
        return None
    usable = caps.dedup_retention_seconds * (1.0 - s.dedup_safety_margin)
    closes = first + timedelta(seconds=usable)
    return time.monotonic() + (closes - db_now).total_seconds()


def decide(
    item: InFlight, providers: Mapping[str, Provider], s: WorkerSettings, now: datetime
) -> outcomes.Decision:
    """What the outcome of ``item`` means for its operation."""
    assert item.outcome is not None
    if item.not_sent:
        return outcomes.Decision(
            S.UNKNOWN,
            reason=outcomes.DEDUP_WINDOW_PASSED,
            last_outcome=item.op.last_outcome,
            dedup_refused=True,
        )
    caps = providers[item.op.provider].capabilities
    # a send refused because the lease ended first (``lease_lost``) left nothing: its
    # "retryable, before the write" outcome takes the ordinary path (a blind row's window is
    # checked again there)
    d = outcomes.decide(
        item.outcome,
        caps=caps,
        policy=outcomes.policy_for(caps, item.op.max_attempts, item.op.max_elapsed_seconds),
        margin=s.dedup_safety_margin,
        attempts=item.attempt,
        first_dispatched_at=item.first_dispatched_at,
        prior_outcome=item.op.last_outcome,
        now=now,
    )
    sealed = seal_receipt(s.protection, item.op, d.receipt)  # protected providers only
    return d if sealed is d.receipt else d._replace(receipt=sealed)


def observe(item: InFlight, d: outcomes.Decision, *, moved: bool) -> None:
    """The metrics and the log line of one recorded outcome."""
    out = item.outcome
    assert out is not None
    provider = item.op.provider
    metrics.attempts_series(provider, KIND_TEXT[out.kind]).inc()
    if not moved:
        return
    if out.replayed:
        metrics.DUPLICATES_SUPPRESSED.labels(provider, "receiver_replay").inc()
    if d.retried:
        metrics.RETRIES.labels(provider).inc()
    if d.dedup_refused:
        metrics.DEDUP_WINDOW_REFUSALS.labels(provider).inc()
    quiet = d.status not in (S.UNKNOWN, S.BLOCKED, S.REJECTED)
    level = logging.INFO if quiet else logging.WARNING
    if log.isEnabledFor(level):
        log.log(
            level,
            "dispatch outcome",
            extra={
                "operation_id": item.op.operation_id,
                "tenant": item.op.tenant_id,
                "fencing_token": item.token,
                "attempt": item.attempt,
                "outcome": out.kind.value,
                "status": d.status.value,
                "reason": d.reason,
            },
        )


def recorded(item: InFlight, d: outcomes.Decision, worker: str, now: datetime) -> Recorded:
    """What recording ``item`` writes: its fenced transition, its event's detail, and its
    attempt row with the evidence."""
    out = item.outcome
    assert out is not None
    return Recorded(
        item.op,
        Transition(
            item.op.id,
            item.revision,
            d.status,
            d.reason,
            d.receipt,
            d.last_outcome,
            d.delay_seconds,
            # store the digest of a plain-SQL row the first time it is known
            payload_digest=item.digest if item.op.payload_digest is None else None,
        ),
        {"outcome": KIND_TEXT[out.kind], "status_code": out.status_code, "replayed": out.replayed},
        attempt_row(item, worker, now),
        item.token,
    )


def attempt_row(item: InFlight, worker: str, now: datetime) -> dict[str, Any]:
    """The ``outbox_attempts`` row of one attempt, with its evidence."""
    out = item.outcome
    assert out is not None
    evidence: dict[str, Any] = dict(out.evidence)
    if out.reason:
        evidence["reason"] = out.reason
    if out.retry_after_seconds is not None:
        evidence["retry_after_seconds"] = out.retry_after_seconds
    if out.replayed:
        evidence["replayed"] = True
    return journal.attempt(
        item.op,
        attempt_no=item.attempt,
        token=item.token,
        worker=worker,
        result_class=KIND_TEXT[out.kind],
        started_at=item.started_at,
        finished_at=now,
        status_code=out.status_code,
        error_class=out.error_class,
        transport_phase=PHASE_TEXT[out.transport_phase],
        request_digest=item.digest,
        duration_ms=round(item.duration * 1000, 3),
        evidence=evidence,
    )
