"""Checks before dispatch: is this claimed row still allowed to leave the process?

Admission (the row is well formed: :func:`outbox.admission.admit`), budget left, and the
receiver's deduplication window for a blind re-send. Authority checks — approvals,
deadlines, versions, artifacts — plug in through :class:`AuthorityCheck`, which runs
inside the transaction that commits ``dispatching`` so an approval is consumed atomically
with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sqlalchemy.engine import Connection

from dispatcher.engine import outcomes
from outbox.admission import admit
from outbox.decoding import PAYLOAD_UNDECODABLE, Undecodable
from outbox.protection.artifacts import ArtifactStore
from outbox.protection.envelopes import EnvelopeError, Protection, is_envelope, open_payload
from outbox.protection.secrets import SecretFinding, find_secrets_many
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from providers.base import Provider

S = OperationStatus


class Verdict(NamedTuple):
    """``status`` is None when the row may be dispatched (a named tuple: one is made per
    claimed row, see :mod:`dispatcher.store.transitions`)."""

    status: OperationStatus | None = None
    reason: str | None = None
    digest: str | None = None
    dedup_refused: bool = False
    payload: Mapping[str, Any] | None = None
    """What is sent: the inline payload, or the resolved and verified artifact."""
    detail: str | None = None


class Refusal(str):
    """A blocked reason (it *is* the reason string) with detail for the event log."""

    detail: Mapping[str, Any] | None

    def __new__(cls, reason: str, detail: Mapping[str, Any] | None = None) -> Refusal:
        obj = super().__new__(cls, reason)
        obj.detail = detail
        return obj


class AuthorityCheck(Protocol):
    def needs_lock(
        self,
        rows: Sequence[OperationRecord],
        task_rows: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> bool:
        """Whether checking ``rows`` (whose task rows the claim read) takes locks that
        must hold until the mark commits (then the checks, the mark and :meth:`consume`
        share one transaction)."""
        ...

    def check(
        self, conn: Connection, rows: Sequence[OperationRecord], now: datetime
    ) -> Mapping[int, str]:
        """Return ``{id: blocked_reason}`` for rows that may not be dispatched now (a
        :class:`Refusal` adds detail to the event). ``rows`` carry the payload that would
        be sent (a resolved artifact in place of ``payload``). A refused row whose last
        attempt may have been applied goes to ``unknown`` for reconciliation instead."""
        ...

    def consume(self, conn: Connection, rows: Sequence[OperationRecord], token: int) -> None:
        """Called in the same transaction, for rows that were committed ``dispatching``."""
        ...


class NoAuthority:
    """No approvals or other authority rules configured."""

    def needs_lock(
        self,
        rows: Sequence[OperationRecord],
        task_rows: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> bool:
        return False

    def check(
        self, conn: Connection, rows: Sequence[OperationRecord], now: datetime
    ) -> Mapping[int, str]:
        return {}

    def consume(self, conn: Connection, rows: Sequence[OperationRecord], token: int) -> None:
        return None


def pre_dispatch(
    op: OperationRecord,
    *,
    providers: Mapping[str, Provider],
    max_payload_bytes: int,
    margin: float,
    now: datetime,
    artifacts: ArtifactStore | None = None,
    protection: Protection | None = None,
    scanned: tuple[object, Sequence[SecretFinding]] | None = None,
) -> Verdict:
    """The dispatcher's own checks for one claimed row (no database I/O; an artifact is
    read from ``artifacts``). A protected payload is opened here, in memory only, so
    admission re-checks the plaintext's digest and what is sent is the plaintext."""
    if isinstance(op.payload, Undecodable):  # first: nothing below may touch its content
        return Verdict(S.BLOCKED, PAYLOAD_UNDECODABLE, detail=op.payload.describe())
    try:
        plain = open_payload(protection, op)
    except EnvelopeError as exc:
        return Verdict(S.BLOCKED, exc.reason, detail=str(exc))
    if plain is not op.payload:
        op = replace(op, payload=plain)
    provider = providers.get(op.provider)
    caps = provider.capabilities if provider is not None else None
    adm = admit(
        op,
        known_providers=providers.keys(),
        max_payload_bytes=max_payload_bytes,
        supported_schemas=caps.payload_schemas if caps else None,
        artifacts=artifacts,
        scanned=scanned,
    )
    if not adm.ok:
        return Verdict(S.BLOCKED, adm.reason, detail=adm.detail)
    assert caps is not None
    policy = outcomes.policy_for(caps, op.max_attempts, op.max_elapsed_seconds)
    spent = policy.budget_left(
        attempts=op.attempts, first_dispatched_at=op.first_dispatched_at, now=now
    )
    if spent is not None:
        if op.last_outcome == "in_flight":  # the receiver held the key until the end
            return Verdict(S.BLOCKED, outcomes.RECEIVER_STUCK_IN_FLIGHT, adm.digest)
        status = S.UNKNOWN if outcomes.blind(op.last_outcome) else S.BLOCKED
        return Verdict(status, outcomes.BUDGET_EXHAUSTED, adm.digest)
    if outcomes.blind(op.last_outcome) and not outcomes.window_open(
        caps, margin, op.first_dispatched_at, now
    ):
        return Verdict(S.UNKNOWN, outcomes.DEDUP_WINDOW_PASSED, adm.digest, dedup_refused=True)
    return Verdict(None, None, adm.digest, payload=adm.payload)

def scan_stored(rows: list[OperationRecord]) -> dict[int, tuple[object, list[SecretFinding]]]:
    """The credential scan of a batch's stored payloads in one pass (admission uses a
    result only for the very object scanned: not for a decrypted or artifact payload)."""
    plain = [op for op in rows if isinstance(op.payload, dict) and not is_envelope(op.payload)]
    found = find_secrets_many([op.payload for op in plain])
    return {op.id: (op.payload, f) for op, f in zip(plain, found, strict=True)}
