"""Pre-dispatch policies used by the tests (named in a provider's ``policy`` key)."""

from __future__ import annotations

from datetime import datetime

from outbox.records import OperationRecord


def amount_limit(op: OperationRecord, now: datetime) -> str | None:
    amount = (op.payload or {}).get("amount", 0)
    return f"amount {amount} is over the limit of 100" if amount > 100 else None


def review_resends(op: OperationRecord, now: datetime) -> str | None:
    return "a re-send needs a fresh review" if op.attempts >= 1 else None
