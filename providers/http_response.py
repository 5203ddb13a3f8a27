"""Turning an HTTP response (untrusted) into an :class:`~providers.base.Outcome`.

This is the HTTP provider's wire protocol in one place (DESIGN.md, "Providers"):

======================  ==============  =====================================================
status                  outcome         notes
======================  ==============  =====================================================
202                     ACCEPTED        taken, not finished: reconcile by lookup, never re-send
other 2xx               APPLIED         ``Idempotent-Replayed: true`` sets ``replayed``
409                     IN_FLIGHT       the receiver is still processing this key
422                     KEY_MISMATCH    key reused with another payload
400 + mismatch_status   KEY_MISMATCH    only if configured ``mismatch_status = 400`` (Stripe)
                                        and the body mentions idempotency
408 425 429 503         RETRYABLE       ``Retry-After`` (seconds or HTTP date) honoured
other 4xx               REJECTED        never retried
3xx                     AMBIGUOUS       redirects are not followed; a 303 after a POST
                                        usually means "created", so it is not a refusal
other (5xx, 1xx)        AMBIGUOUS       may or may not have been applied
======================  ==============  =====================================================

The body is evidence only: bounded, hashed, parsed as JSON when it is a small object,
never followed or executed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

from providers.base import Outcome, OutcomeKind, TransportPhase

RETRYABLE_STATUSES: Final = frozenset({408, 425, 429, 503})
MAX_RETRY_AFTER_SECONDS: Final = 86_400.0
MAX_JSON_BODY_BYTES: Final = 16 * 1024
MAX_TEXT_BODY_CHARS: Final = 2048
SELECTED_HEADERS: Final = (
    "content-type",
    "date",
    "etag",
    "idempotent-replayed",
    "location",
    "request-id",
    "retry-after",
    "x-request-id",
)
"""Response headers kept as evidence. Never ``set-cookie`` or anything credential-like."""
MAX_HEADER_CHARS: Final = 256


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; else ``None``.

    Clamped to [0, 1 day]: the value comes from the receiver and is untrusted.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def build_receipt(
    status: int, headers: Mapping[str, str], body: bytes, *, truncated: bool
) -> dict[str, Any]:
    """Bounded evidence: status, selected headers, bounded body, digest of what was read."""
    kept = {
        name: headers[name][:MAX_HEADER_CHARS] for name in SELECTED_HEADERS if name in headers
    }
    parsed: Any = None
    if not truncated and len(body) <= MAX_JSON_BODY_BYTES:
        try:
            candidate = json.loads(body)
        except (ValueError, RecursionError):
            candidate = None
        if isinstance(candidate, dict):
            parsed = candidate
    if parsed is None:
        text = body.decode("utf-8", errors="replace")
        parsed = text[:MAX_TEXT_BODY_CHARS]
        truncated = truncated or len(text) > MAX_TEXT_BODY_CHARS
    return {
        "status": status,
        "headers": kept,
        "body": parsed,
        "body_truncated": truncated,
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }


def mentions_idempotency(receipt: Mapping[str, Any]) -> bool:
    body = receipt.get("body")
    text = json.dumps(body) if isinstance(body, dict) else str(body)
    return "idempot" in text.lower()


def classify_response(
    status: int,
    reason_phrase: str,
    headers: Mapping[str, str],
    receipt: Mapping[str, Any],
    *,
    mismatch_status: int,
) -> Outcome:
    """The outcome of a complete response (``transport_phase = RESPONSE``)."""
    evidence = {"status_code": status}

    def outcome(kind: OutcomeKind, **extra: Any) -> Outcome:
        return Outcome(kind=kind, status_code=status, receipt=receipt, evidence=evidence, **extra)

    reason = f"HTTP {status} {reason_phrase}".strip()
    if status == 202:
        return outcome(OutcomeKind.ACCEPTED)
    if 200 <= status < 300:
        replayed = headers.get("idempotent-replayed", "").strip().lower() == "true"
        return outcome(OutcomeKind.APPLIED, replayed=replayed)
    if status == 409:
        return outcome(OutcomeKind.IN_FLIGHT, reason=reason)
    if status == 422:
        return outcome(OutcomeKind.KEY_MISMATCH, reason=reason)
    if status == 400 and mismatch_status == 400 and mentions_idempotency(receipt):
        return outcome(OutcomeKind.KEY_MISMATCH, reason=f"{reason} (idempotency error)")
    if status in RETRYABLE_STATUSES:
        retry_after = parse_retry_after(headers.get("retry-after"))
        return outcome(OutcomeKind.RETRYABLE, reason=reason, retry_after_seconds=retry_after)
    if 400 <= status < 500:
        return outcome(OutcomeKind.REJECTED, reason=reason)
    if 300 <= status < 400:
        return outcome(OutcomeKind.AMBIGUOUS, reason=f"{reason} (redirects are not followed)")
    return outcome(OutcomeKind.AMBIGUOUS, reason=reason)


def transport_outcome(
    kind: OutcomeKind, phase: TransportPhase, error: BaseException, detail: str
) -> Outcome:
    """An outcome without a response. Only the exception's class is kept, not its text."""
    name = type(error).__name__
    return Outcome(
        kind=kind,
        reason=f"{detail} ({name})",
        transport_phase=phase,
        error_class=name,
        evidence={"error_class": name, "transport_phase": phase.value},
    )
