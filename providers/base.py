"""The provider interface: what an adapter does, and what it *declares* it guarantees.

The dispatcher's decisions (retry? reconcile? block?) follow from :class:`Capabilities`,
never from guesses. A provider is built from a ``[providers.NAME]`` configuration section
by :mod:`providers.registry`; it knows nothing of the daemon.

Methods are called from worker threads, concurrently: implementations must be
thread-safe (an ``httpx.Client`` is). Optional: ``verify(receipt)`` (:class:`Verifying`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable


class LookupConsistency(enum.StrEnum):
    STRONG = "strong"  # a lookup reflects every completed write
    EVENTUAL = "eventual"  # a lookup may lag by up to lookup_settle_seconds
    NONE = "none"  # no authoritative lookup: ambiguous outcomes go to a person


@dataclass(frozen=True)
class Capabilities:
    """What the receiver guarantees. Declare these honestly: the dispatcher trusts them."""

    dedup_retention_seconds: float
    """How long the receiver keeps idempotency keys; 0: it does not deduplicate."""
    lookup_consistency: LookupConsistency = LookupConsistency.NONE
    lookup_settle_seconds: float = 0.0
    in_flight_seconds: float = 20.0
    """Longest the receiver may take to apply a request it has received."""
    fencing: bool = False
    """The receiver rejects a fencing token lower than the highest it has seen for a key."""
    payload_schemas: frozenset[int] = frozenset({1})
    max_attempts: int = 8
    max_elapsed_seconds: float = 600.0
    timeout_seconds: float = 10.0
    retry_max_delay_seconds: float = 60.0
    """The longest back-off between two attempts (before jitter; a Retry-After wins)."""


@dataclass(frozen=True)
class Dispatch:
    """One attempt to apply an operation, as the provider sees it."""

    tenant_id: str
    task_id: str
    operation_id: str
    idempotency_key: str
    fencing_token: int
    payload: Mapping[str, Any]
    attempt: int = 1
    payload_digest: str | None = None
    traceparent: str | None = None
    created_at: datetime | None = None
    """When the agent staged the operation (the row's ``created_at``): the same on every
    attempt (a CloudEvents envelope's ``time``)."""
    first_dispatched_at: datetime | None = None
    """When the operation's first attempt began: the start of the receiver's deduplication
    window for its key. Given to ``lookup`` (a look-up whose evidence expires with that
    window can tell whether it still holds)."""


class OutcomeKind(enum.StrEnum):
    APPLIED = "applied"  # 2xx: the effect exists; receipt holds the evidence
    REJECTED = "rejected"  # a definite refusal: never retried
    RETRYABLE = "retryable"  # not applied, try again later with the same key
    AMBIGUOUS = "ambiguous"  # may or may not have been applied
    IN_FLIGHT = "in_flight"  # 409: the receiver is still processing this key
    KEY_MISMATCH = "key_mismatch"  # 422 (or Stripe's 400): key reused with another payload
    ACCEPTED = "accepted"  # 202: taken, not finished; reconcile by lookup, never re-send


class TransportPhase(enum.StrEnum):
    BEFORE_WRITE = "before_write"  # nothing reached the receiver: safe, never dispatched
    AFTER_WRITE = "after_write"  # the request may have been received
    RESPONSE = "response"  # a complete response was read


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    status_code: int | None = None
    receipt: Mapping[str, Any] | None = None
    """Bounded evidence: status, selected headers, bounded body, body digest."""
    reason: str | None = None
    retry_after_seconds: float | None = None
    replayed: bool = False
    """The receiver said it deduplicated (``Idempotent-Replayed: true``, NATS duplicate)."""
    transport_phase: TransportPhase = TransportPhase.RESPONSE
    error_class: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


class LookupKind(enum.StrEnum):
    FOUND = "found"
    NOT_FOUND = "not_found"
    INDETERMINATE = "indeterminate"  # the lookup itself failed (timeout, 5xx): ask later
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class LookupResult:
    kind: LookupKind
    receipt: Mapping[str, Any] | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    observed_at: datetime | None = None


class VerifyKind(enum.StrEnum):
    VERIFIED = "verified"  # the effect exists and passes the acceptance check
    FAILED = "failed"  # the effect is there but does not pass: a person decides
    INDETERMINATE = "indeterminate"  # the check itself failed (timeout, 5xx): ask later


@dataclass(frozen=True)
class VerifyResult:
    kind: VerifyKind
    reason: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Verifying(Protocol):
    """OPTIONAL capability, separate from :class:`Provider` (which stays satisfied by
    providers without it): a provider that can check an applied effect implements
    ``verify(receipt)``. It is given the stored receipt of an ``applied`` operation and must
    only *read* from the receiver, never repeat the write; the dispatcher's verifier
    (:mod:`dispatcher.maintenance.verifier`) moves the operation to ``verified`` on ``VERIFIED``."""

    def verify(self, receipt: Mapping[str, Any]) -> VerifyResult:
        """Check the applied effect this receipt names. Never raises for receiver or
        transport failures: return ``INDETERMINATE``."""
        ...


def verifier_of(provider: object) -> Verifying | None:
    """The provider itself when it implements the optional ``verify``, else None."""
    if isinstance(provider, Verifying) and callable(getattr(provider, "verify", None)):
        return provider
    return None


@runtime_checkable
class Provider(Protocol):
    name: str
    capabilities: Capabilities

    def send(self, dispatch: Dispatch) -> Outcome:
        """Send once. Never raises for receiver or transport failures: classify them."""
        ...

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        """Ask the receiver whether the effect of this key exists."""
        ...

    def close(self) -> None: ...



