"""Pure decisions: what an outcome means for an operation (dispatcher/engine/outcomes.py), and the
retry policy fed from persisted state (dispatcher/engine/retry.py). No I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.engine import outcomes
from dispatcher.engine.outcomes import Decision, decide, policy_for, window_open
from dispatcher.engine.retry import RetryPolicy
from outbox.states import OperationStatus as S
from providers.base import Capabilities, Outcome, OutcomeKind

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
DAY = 86_400.0
CAPS = Capabilities(dedup_retention_seconds=DAY, max_attempts=8, max_elapsed_seconds=600.0)
NO_DEDUP = Capabilities(dedup_retention_seconds=0.0, max_attempts=8, max_elapsed_seconds=600.0)


def run(
    kind: OutcomeKind,
    *,
    caps: Capabilities = CAPS,
    attempts: int = 1,
    first: datetime | None = None,
    prior: str | None = None,
    retry_after: float | None = None,
    margin: float = 0.1,
    **outcome: object,
) -> Decision:
    return decide(
        Outcome(kind, retry_after_seconds=retry_after, **outcome),  # type: ignore[arg-type]
        caps=caps,
        policy=policy_for(caps, None, None),
        margin=margin,
        attempts=attempts,
        first_dispatched_at=first or NOW,
        prior_outcome=prior,
        now=NOW,
    )


# -- every outcome kind ---------------------------------------------------------------


def test_applied_keeps_the_receipt() -> None:
    d = run(OutcomeKind.APPLIED, status_code=201, receipt={"effect_id": "e1"})
    assert (d.status, d.last_outcome, d.receipt) == (S.APPLIED, "applied", {"effect_id": "e1"})
    assert not d.retried


def test_rejected_is_final_with_the_providers_reason() -> None:
    d = run(OutcomeKind.REJECTED, status_code=400, reason="invalid amount")
    assert (d.status, d.reason, d.last_outcome) == (S.REJECTED, "invalid amount", "rejected")
    assert run(OutcomeKind.REJECTED, status_code=404).reason == "http_404"


def test_rejected_is_final_even_with_budget_left_and_prior_ambiguity() -> None:
    d = run(OutcomeKind.REJECTED, status_code=400, prior="ambiguous", attempts=1)
    assert d.status == S.REJECTED and not d.retried


def test_key_mismatch_blocks_for_a_person() -> None:
    d = run(OutcomeKind.KEY_MISMATCH, status_code=422)
    assert (d.status, d.reason) == (S.BLOCKED, outcomes.KEY_REUSED)


def test_accepted_is_unknown_awaiting_confirmation_never_resent() -> None:
    d = run(OutcomeKind.ACCEPTED, status_code=202, receipt={"id": "x"})
    assert (d.status, d.reason, d.last_outcome) == (
        S.UNKNOWN,
        outcomes.AWAITING_CONFIRMATION,
        "accepted",
    )
    assert d.receipt == {"id": "x"} and not d.retried
    assert outcomes.blind(d.last_outcome)


def test_retryable_goes_back_to_pending_with_a_bounded_delay() -> None:
    d = run(OutcomeKind.RETRYABLE, status_code=503)
    assert (d.status, d.last_outcome, d.reason) == (S.PENDING, "retryable", "retry:retryable")
    assert d.retried and d.delay_seconds is not None
    assert 0.0 <= d.delay_seconds <= 0.5  # full jitter, first retry


@pytest.mark.parametrize(
    ("kind", "sticky"), [(OutcomeKind.AMBIGUOUS, "ambiguous"), (OutcomeKind.IN_FLIGHT, "in_flight")]
)
def test_maybe_applied_is_retried_with_the_same_key_inside_the_window(
    kind: OutcomeKind, sticky: str
) -> None:
    d = run(kind, first=NOW - timedelta(seconds=60))
    assert (d.status, d.last_outcome) == (S.PENDING, sticky)
    assert d.retried and not d.dedup_refused
    assert outcomes.blind(d.last_outcome)


# -- blind re-sends and the deduplication window -------------------------------------------


def test_blind_resend_refused_once_the_window_has_passed() -> None:
    caps = Capabilities(dedup_retention_seconds=100.0, max_attempts=8, max_elapsed_seconds=DAY)
    d = run(OutcomeKind.AMBIGUOUS, caps=caps, first=NOW - timedelta(seconds=91))
    assert (d.status, d.reason) == (S.UNKNOWN, outcomes.DEDUP_WINDOW_PASSED)
    assert d.dedup_refused and not d.retried


def test_window_is_judged_at_the_time_of_the_retry_not_now() -> None:
    caps = Capabilities(dedup_retention_seconds=100.0, max_attempts=8, max_elapsed_seconds=600.0)
    first = NOW - timedelta(seconds=80)  # usable until first + 90 s: 10 s left
    assert run(OutcomeKind.AMBIGUOUS, caps=caps, first=first).status == S.PENDING
    late = run(OutcomeKind.AMBIGUOUS, caps=caps, first=first, retry_after=30)
    assert (late.status, late.reason) == (S.UNKNOWN, outcomes.DEDUP_WINDOW_PASSED)


def test_a_plain_retryable_is_not_blind_and_ignores_the_window() -> None:
    d = run(OutcomeKind.RETRYABLE, first=NOW - timedelta(seconds=DAY * 2), caps=CAPS)
    # budget: elapsed 2 days > 600 s, so it is the budget that stops it, not the window
    assert (d.status, d.reason) == (S.BLOCKED, outcomes.BUDGET_EXHAUSTED)
    caps = Capabilities(dedup_retention_seconds=10.0, max_attempts=8, max_elapsed_seconds=600.0)
    d = run(OutcomeKind.RETRYABLE, caps=caps, first=NOW - timedelta(seconds=60))
    assert d.status == S.PENDING and not d.dedup_refused


def test_retryable_after_an_ambiguous_attempt_stays_blind() -> None:
    """A 503 now does not prove the earlier ambiguous attempt was not applied."""
    d = run(OutcomeKind.RETRYABLE, prior="ambiguous", first=NOW - timedelta(seconds=60))
    assert (d.status, d.last_outcome) == (S.PENDING, "ambiguous")
    caps = Capabilities(dedup_retention_seconds=100.0, max_attempts=8, max_elapsed_seconds=DAY)
    past = run(OutcomeKind.RETRYABLE, caps=caps, prior="lost", first=NOW - timedelta(seconds=95))
    assert (past.status, past.reason) == (S.UNKNOWN, outcomes.DEDUP_WINDOW_PASSED)


def test_reconciled_not_applied_clears_the_blindness() -> None:
    d = run(OutcomeKind.RETRYABLE, prior="reconciled_not_applied", caps=NO_DEDUP)
    assert (d.status, d.last_outcome) == (S.PENDING, "retryable")


@pytest.mark.parametrize("kind", [OutcomeKind.AMBIGUOUS, OutcomeKind.IN_FLIGHT])
def test_retention_zero_never_resends_an_ambiguous_attempt(kind: OutcomeKind) -> None:
    d = run(kind, caps=NO_DEDUP)
    assert (d.status, d.reason) == (S.UNKNOWN, outcomes.NO_DEDUP_AMBIGUOUS)
    assert not d.retried


def test_retention_zero_retries_what_was_surely_not_applied() -> None:
    d = run(OutcomeKind.RETRYABLE, caps=NO_DEDUP)
    assert d.status == S.PENDING
    blind = run(OutcomeKind.RETRYABLE, caps=NO_DEDUP, prior="ambiguous")
    assert (blind.status, blind.reason) == (S.UNKNOWN, outcomes.NO_DEDUP_AMBIGUOUS)


def test_window_open() -> None:
    assert not window_open(NO_DEDUP, 0.1, NOW, NOW)
    assert window_open(CAPS, 0.1, None, NOW)
    caps = Capabilities(dedup_retention_seconds=100.0)
    assert window_open(caps, 0.1, NOW, NOW + timedelta(seconds=89.9))
    assert not window_open(caps, 0.1, NOW, NOW + timedelta(seconds=90))
    assert window_open(caps, 0.0, NOW, NOW + timedelta(seconds=99.9))


def test_blind_outcomes() -> None:
    assert {"ambiguous", "in_flight", "lost", "accepted"} == outcomes.MAYBE_APPLIED
    for safe in (None, "retryable", "reconciled_not_applied", "applied", "rejected"):
        assert not outcomes.blind(safe)


# -- budgets ----------------------------------------------------------------------------


def test_budget_exhausted_by_attempts() -> None:
    d = run(OutcomeKind.RETRYABLE, attempts=8)
    assert (d.status, d.reason, d.last_outcome) == (
        S.BLOCKED,
        outcomes.BUDGET_EXHAUSTED,
        "retryable",
    )
    # an ambiguous last attempt may have been applied: unknown, for the look-up
    d = run(OutcomeKind.AMBIGUOUS, attempts=8)
    assert (d.status, d.reason) == (S.UNKNOWN, outcomes.BUDGET_EXHAUSTED)


def test_a_receiver_answering_in_flight_until_the_budget_ends_has_its_own_reason() -> None:
    """409 "in flight" on the last attempt the budget allows: the receiver's idempotency
    record holds the key (a request died half-way); a person checks the receiver."""
    d = run(OutcomeKind.IN_FLIGHT, attempts=8, status_code=409)
    assert (d.status, d.reason, d.last_outcome) == (
        S.BLOCKED, outcomes.RECEIVER_STUCK_IN_FLIGHT, "in_flight")
    d = run(OutcomeKind.IN_FLIGHT, first=NOW - timedelta(seconds=600), status_code=409)
    assert (d.status, d.reason) == (S.BLOCKED, outcomes.RECEIVER_STUCK_IN_FLIGHT)
    # budget left: retried with the same key, as before
    assert run(OutcomeKind.IN_FLIGHT, attempts=1, status_code=409).status == S.PENDING


def test_budget_exhausted_by_elapsed_time() -> None:
    d = run(OutcomeKind.RETRYABLE, first=NOW - timedelta(seconds=600))
    assert (d.status, d.reason) == (S.BLOCKED, outcomes.BUDGET_EXHAUSTED)


def test_retry_after_is_honoured_and_counts_against_the_elapsed_budget() -> None:
    d = run(OutcomeKind.RETRYABLE, retry_after=42.0)
    assert d.status == S.PENDING and d.delay_seconds is not None and d.delay_seconds >= 42.0
    near = run(OutcomeKind.RETRYABLE, retry_after=120.0, first=NOW - timedelta(seconds=500))
    assert (near.status, near.reason) == (S.BLOCKED, outcomes.BUDGET_EXHAUSTED)


def test_the_rows_own_budget_wins_over_the_providers() -> None:
    p = policy_for(CAPS, 2, 30.0)
    assert (p.max_attempts, p.max_elapsed_seconds) == (2, 30.0)
    p = policy_for(CAPS, None, None)
    assert (p.max_attempts, p.max_elapsed_seconds) == (8, 600.0)


# -- the retry policy, from persisted state ---------------------------------------------------


def test_policy_stops_at_max_attempts_from_the_persisted_count() -> None:
    policy = RetryPolicy(3, 600.0)
    assert policy.decide(attempts=2, first_dispatched_at=NOW, now=NOW).retry
    spent = policy.decide(attempts=3, first_dispatched_at=NOW, now=NOW)
    assert (spent.retry, spent.exhausted) == (False, "attempts")


def test_a_restart_never_resets_the_budget() -> None:
    """A fresh policy object (a new process) fed the row's attempts and first dispatch time
    decides exactly as the old one would have."""
    first = NOW - timedelta(seconds=100)
    for attempts, elapsed_ok in ((3, True), (4, True), (5, False)):
        fresh = RetryPolicy(5, 600.0)
        decision = fresh.decide(attempts=attempts, first_dispatched_at=first, now=NOW)
        assert decision.retry is (attempts < 5) and elapsed_ok is (attempts < 5)
    late = RetryPolicy(5, 60.0).decide(attempts=1, first_dispatched_at=first, now=NOW)
    assert (late.retry, late.exhausted) == (False, "elapsed")


def test_policy_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    policy = RetryPolicy(100, 10_000.0)
    for attempts, high in ((1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (20, 60.0)):
        delays = [
            policy.decide(attempts=attempts, first_dispatched_at=NOW, now=NOW).delay_seconds
            for _ in range(200)
        ]
        assert all(0.0 <= d <= high for d in delays), (attempts, max(delays))
        assert max(delays) > high / 4  # jitter spreads over the range


def test_the_providers_retry_max_delay_caps_the_back_off() -> None:
    caps = Capabilities(dedup_retention_seconds=DAY, max_attempts=100,
                        max_elapsed_seconds=10_000.0, retry_max_delay_seconds=2.0)
    policy = policy_for(caps, None, None)
    delays = [policy.decide(attempts=20, first_dispatched_at=NOW, now=NOW).delay_seconds
              for _ in range(200)]
    assert all(0.0 <= d <= 2.0 for d in delays) and max(delays) > 0.5
    assert policy_for(CAPS, None, None) is not policy  # one policy per budget and cap


def test_policy_retry_after_wins_when_larger() -> None:
    policy = RetryPolicy(8, 600.0)
    d = policy.decide(attempts=1, first_dispatched_at=NOW, now=NOW, retry_after_seconds=5.0)
    assert d.retry and d.delay_seconds >= 5.0
    d = policy.decide(attempts=1, first_dispatched_at=NOW, now=NOW, retry_after_seconds=0.0)
    assert d.retry and d.delay_seconds <= 0.5


def test_policy_refuses_a_wait_that_would_end_past_the_elapsed_budget() -> None:
    policy = RetryPolicy(8, 600.0)
    first = NOW - timedelta(seconds=590)
    d = policy.decide(attempts=1, first_dispatched_at=first, now=NOW, retry_after_seconds=20.0)
    assert (d.retry, d.exhausted) == (False, "elapsed")


def test_budget_left_before_dispatch() -> None:
    policy = RetryPolicy(3, 60.0)
    assert policy.budget_left(attempts=0, first_dispatched_at=None, now=NOW) is None
    assert policy.budget_left(attempts=2, first_dispatched_at=NOW, now=NOW) is None
    assert policy.budget_left(attempts=3, first_dispatched_at=NOW, now=NOW) == "attempts"
    old = NOW - timedelta(seconds=61)
    assert policy.budget_left(attempts=1, first_dispatched_at=old, now=NOW) == "elapsed"
