"""The retry policy: tenacity's wait and stop strategies, fed from persisted state.

tenacity normally keeps its attempt count and start time in memory; here both come from
the row (``attempts`` and ``first_dispatched_at``, measured on the database clock), so a
restart, a crash or another replica taking over never resets a budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tenacity import RetryCallState, Retrying, stop_after_attempt, stop_after_delay
from tenacity import wait_random_exponential as wait_full_jitter

DEFAULT_BASE_SECONDS = 0.5
DEFAULT_CAP_SECONDS = 60.0


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_seconds: float = 0.0
    exhausted: str | None = None  # "attempts" or "elapsed" when the budget is spent


class RetryPolicy:
    """Bounded by attempt count AND elapsed time since the first dispatch; exponential
    back-off with full jitter; ``Retry-After`` honoured (the larger wait wins)."""

    def __init__(
        self,
        max_attempts: int,
        max_elapsed_seconds: float,
        *,
        base_seconds: float = DEFAULT_BASE_SECONDS,
        cap_seconds: float = DEFAULT_CAP_SECONDS,
    ) -> None:
        self.max_attempts = max_attempts
        self.max_elapsed_seconds = max_elapsed_seconds
        self._stop_attempts = stop_after_attempt(max_attempts)
        self._stop_elapsed = stop_after_delay(max_elapsed_seconds)
        self._wait = wait_full_jitter(multiplier=base_seconds, max=cap_seconds)
        self._retrying = Retrying(stop=self._stop_attempts | self._stop_elapsed, wait=self._wait)

    def _state(self, attempts: int, elapsed: float) -> RetryCallState:
        state = RetryCallState(retry_object=self._retrying, fn=None, args=(), kwargs={})
        state.attempt_number = max(1, attempts)
        state.start_time = 0.0
        state.outcome_timestamp = max(0.0, elapsed)
        return state

    def decide(
        self,
        *,
        attempts: int,
        first_dispatched_at: datetime | None,
        now: datetime,
        retry_after_seconds: float | None = None,
    ) -> RetryDecision:
        """After ``attempts`` attempts, may another be made, and when?"""
        elapsed = (now - first_dispatched_at).total_seconds() if first_dispatched_at else 0.0
        state = self._state(attempts, elapsed)
        if self._stop_attempts(state):
            return RetryDecision(False, exhausted="attempts")
        if self._stop_elapsed(state):
            return RetryDecision(False, exhausted="elapsed")
        delay = float(self._wait(state))
        if retry_after_seconds is not None:
            delay = max(delay, retry_after_seconds)
        if elapsed + delay >= self.max_elapsed_seconds:
            return RetryDecision(False, exhausted="elapsed")
        return RetryDecision(True, delay_seconds=delay)

    def budget_left(
        self, *, attempts: int, first_dispatched_at: datetime | None, now: datetime
    ) -> str | None:
        """None if another attempt is allowed now, else which budget is spent. (Checked
        for every claimed row: the tenacity state is built only when a first dispatch
        has started the clock.)"""
        if attempts >= self.max_attempts:
            return "attempts"
        if first_dispatched_at is None:
            return None
        elapsed = (now - first_dispatched_at).total_seconds()
        if self._stop_elapsed(self._state(attempts, elapsed)):
            return "elapsed"
        return None
