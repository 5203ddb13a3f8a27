"""The verifier: establish acceptance of ``applied`` effects, without repeating the write.

For ``applied`` rows whose provider implements the optional ``verify(receipt)``
(:class:`providers.base.Verifying`), the stored receipt is handed to the provider, which
only *reads* from the receiver:

* ``VERIFIED`` -> ``verified`` (a conditional update on the revision read, an
  ``outbox_events`` row of kind ``verification`` with the evidence);
* ``FAILED`` -> stays ``applied`` with ``status_reason = 'verification_failed'`` and an
  event: the effect exists but was not accepted. It is never re-sent; a person decides
  (``outboxd ops plan`` says ``escalate``);
* ``INDETERMINATE`` (or the provider raised) -> asked again after
  :data:`RETRY_SECONDS` (``next_attempt_at`` of an ``applied`` row is the next
  verification time). A verifier timeout never becomes another create request.

The job runs at daemon start-up (like reconciliation) and on the scheduler, so a crash
between the receipt and its verification re-runs only the verifier: nothing here can
send. Failpoint ``in_verify`` fires after ``verify`` returned, before its result is
written. At start-up the job publishes which configured providers verify
(``outbox_meta`` rows ``verifier:NAME``), which :func:`outbox.recovery.plan` reads to tell
"applied, verification pending" from "applied, nothing to verify".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from dispatcher.engine import failpoints
from dispatcher.store import journal, store_for
from outbox.protection.envelopes import Protection, open_receipt
from outbox.records import OperationRecord
from outbox.recovery import VERIFICATION_FAILED
from outbox.states import OperationStatus
from providers.base import Provider, Verifying, VerifyKind, VerifyResult, verifier_of

log = logging.getLogger("outboxd.verifier")
S = OperationStatus
RETRY_SECONDS = 5.0
DEFAULT_LIMIT = 200


@dataclass
class VerifyCounts:
    verified: int = 0
    failed: int = 0
    indeterminate: int = 0
    lost_race: int = 0


class Verifier:
    def __init__(
        self,
        engine: Engine,
        providers: Mapping[str, Provider],
        *,
        actor: str,
        limit: int = DEFAULT_LIMIT,
        protection: Protection | None = None,
    ) -> None:
        self.engine = engine
        self.actor = actor
        self.limit = limit
        self.protection = protection  # opens sealed receipts, in memory
        self.configured = sorted(providers)
        self.verifiers: dict[str, Verifying] = {}
        for name, provider in providers.items():
            found = verifier_of(provider)
            if found is not None:
                self.verifiers[name] = found

    def publish(self) -> None:
        """Record which configured providers verify (read by ``outbox.recovery.plan``)."""
        with self.engine.begin() as conn:
            store_for(conn.dialect.name).publish_verifiers(
                conn, {name: name in self.verifiers for name in self.configured})

    def due(self) -> list[OperationRecord]:
        """``applied`` rows of verifying providers whose verification is due; decoded per
        row: an undecodable receipt verifies as nothing, never stops the others."""
        if not self.verifiers:
            return []
        with self.engine.begin() as conn:
            return store_for(conn.dialect.name).verification_due(
                conn, sorted(self.verifiers), limit=self.limit)

    def run_once(self) -> VerifyCounts:
        counts = VerifyCounts()
        for row in self.due():
            try:
                self._one(row, counts)
            except Exception:  # one bad row or provider must not stop the others
                log.exception("verification failed", extra={"operation_id": row.operation_id})
        return counts

    def _one(self, row: OperationRecord, counts: VerifyCounts) -> None:
        try:
            opened = open_receipt(self.protection, row)
            receipt: Mapping[str, Any] = opened if isinstance(opened, dict) else {}
            result = self.verifiers[row.provider].verify(receipt)
        except Exception as exc:
            result = VerifyResult(VerifyKind.INDETERMINATE, reason=type(exc).__name__)
        failpoints.hit("in_verify")
        with self.engine.begin() as conn:
            store = store_for(conn.dialect.name)
            if result.kind == VerifyKind.INDETERMINATE:
                store.verify_later(conn, row=row, delay_seconds=RETRY_SECONDS)
                counts.indeterminate += 1
                return
            verified = result.kind == VerifyKind.VERIFIED
            to = S.VERIFIED if verified else S.APPLIED
            if not store.record_verification(conn, row=row, verified=verified):
                counts.lost_race += 1
                return
            journal.write(
                conn,
                [
                    journal.event(
                        row,
                        from_status=S.APPLIED.value,
                        to_status=to.value,
                        actor=self.actor,
                        reason=result.reason or result.kind.value,
                        kind="verification" if verified else VERIFICATION_FAILED,
                        detail={
                            "verify": result.kind.value,
                            "evidence": journal.bounded(result.evidence),
                        },
                    )
                ],
            )
        if verified:
            counts.verified += 1
        else:
            counts.failed += 1
        log.info(
            "verified" if verified else "verification failed",
            extra={"operation_id": row.operation_id, "tenant": row.tenant_id},
        )
