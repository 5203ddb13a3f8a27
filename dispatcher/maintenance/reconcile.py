"""Reconciliation: establish the outcome of ``unknown`` operations from the provider.

For each due row: look the effect up by its idempotency key.

* found -> ``applied``, the look-up as receipt (a duplicate avoided: counted);
* not found -> evidence of "not applied" only once no earlier attempt can still land:
  after ``last_attempt_started_at + in_flight_seconds`` (+ the settle time of an
  eventually consistent look-up). Then back to ``pending`` with the same key; before
  then the row stays ``unknown`` and is looked up again at that instant;
* indeterminate (the look-up failed) -> looked up again later;
* no look-up at all -> ``blocked`` (``needs_operator``): only a person can decide.

A receiver accepted with 202 and not found afterwards is ``blocked`` for a person: it was
taken, and re-sending is exactly what must not happen blindly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from dispatcher.engine import failpoints
from dispatcher.observability import metrics
from dispatcher.store import journal, store_for
from outbox.protection.envelopes import Protection, seal_receipt
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from providers.base import Dispatch, LookupConsistency, LookupKind, LookupResult, Provider

log = logging.getLogger("outboxd.reconcile")
S = OperationStatus
NEEDS_OPERATOR = "needs_operator"
INDETERMINATE_RETRY_SECONDS = 5.0
DEFAULT_LIMIT = 200


@dataclass
class ReconcileCounts:
    applied: int = 0
    requeued: int = 0
    waiting: int = 0
    blocked: int = 0
    lost_race: int = 0


class Reconciler:
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
        self.providers = providers
        self.actor = actor
        self.limit = limit
        self.protection = protection  # seals the look-up receipts of protected providers

    def run_once(self) -> ReconcileCounts:
        counts = ReconcileCounts()
        with self.engine.begin() as conn:
            rows = store_for(conn.dialect.name).unknown_due(conn, limit=self.limit)
        for row in rows:
            try:
                self._one(row, counts)
            except Exception:  # one bad row or provider must not stop the others
                log.exception("reconciliation failed", extra={"operation_id": row.operation_id})
        return counts

    def _one(self, row: OperationRecord, counts: ReconcileCounts) -> None:
        provider = self.providers.get(row.provider)
        if provider is None or provider.capabilities.lookup_consistency == LookupConsistency.NONE:
            reason = "unknown_provider" if provider is None else NEEDS_OPERATOR
            self._resolve(row, S.BLOCKED, reason, counts, result="unsupported")
            return
        caps = provider.capabilities
        result = provider.lookup(
            Dispatch(
                tenant_id=row.tenant_id,
                task_id=row.task_id,
                operation_id=row.operation_id,
                idempotency_key=row.idempotency_key or f"{row.tenant_id}:{row.operation_id}",
                fencing_token=row.fencing_token or 0,
                payload=row.payload if isinstance(row.payload, dict) else {},
                attempt=row.attempts,
                payload_digest=row.payload_digest,
                traceparent=row.traceparent,
                created_at=row.created_at,
                first_dispatched_at=row.first_dispatched_at,
            )
        )
        failpoints.hit("in_reconcile")
        metrics.RECONCILIATIONS.labels(row.provider, result.kind.value).inc()
        if result.kind == LookupKind.FOUND:
            self._resolve(
                row,
                S.APPLIED,
                "reconciled_found",
                counts,
                result=result.kind.value,
                receipt=seal_receipt(
                    self.protection, row, {"reconciled": True, **_receipt(result)}
                ),
                last_outcome="applied",
            )
            metrics.DUPLICATES_SUPPRESSED.labels(row.provider, "reconcile_found_applied").inc()
            return
        if result.kind == LookupKind.UNSUPPORTED:
            self._resolve(row, S.BLOCKED, NEEDS_OPERATOR, counts, result=result.kind.value)
            return
        with self.engine.begin() as conn:
            store = store_for(conn.dialect.name)
            now = store.db_now(conn)
            if result.kind == LookupKind.INDETERMINATE:
                store.look_again(conn, row=row, delay_seconds=INDETERMINATE_RETRY_SECONDS)
                counts.waiting += 1
                return
            settle = (
                caps.lookup_settle_seconds
                if caps.lookup_consistency == LookupConsistency.EVENTUAL
                else 0.0
            )
            counts_after = not_found_counts_after(row, caps.in_flight_seconds, settle)
            if now < counts_after:
                store.look_again(
                    conn, row=row, delay_seconds=(counts_after - now).total_seconds() + 0.01
                )
                counts.waiting += 1
                return
        if row.last_outcome == "accepted":
            self._resolve(
                row, S.BLOCKED, "accepted_but_not_found", counts, result=result.kind.value
            )
            return
        self._resolve(
            row,
            S.PENDING,
            "reconciled_not_applied",
            counts,
            result=result.kind.value,
            last_outcome="reconciled_not_applied",
            delay_seconds=0.0,
        )

    def _resolve(
        self,
        row: OperationRecord,
        status: OperationStatus,
        reason: str,
        counts: ReconcileCounts,
        *,
        result: str,
        receipt: Any = None,
        last_outcome: str | None = None,
        delay_seconds: float | None = None,
    ) -> None:
        with self.engine.begin() as conn:
            ok = store_for(conn.dialect.name).resolve_unknown(
                conn,
                row=row,
                status=status,
                reason=reason,
                receipt=receipt,
                last_outcome=last_outcome,
                delay_seconds=delay_seconds,
            )
            if ok:
                journal.write(
                    conn,
                    [
                        journal.event(
                            row,
                            from_status="unknown",
                            to_status=status.value,
                            actor=self.actor,
                            reason=reason,
                            kind="reconciliation",
                            detail={"lookup": result},
                        )
                    ],
                )
        if not ok:
            counts.lost_race += 1
            return
        if status == S.APPLIED:
            counts.applied += 1
        elif status == S.PENDING:
            counts.requeued += 1
        else:
            counts.blocked += 1
        log.info(
            "reconciled",
            extra={
                "operation_id": row.operation_id,
                "tenant": row.tenant_id,
                "status": status.value,
                "reason": reason,
            },
        )


def _receipt(result: LookupResult) -> dict[str, Any]:
    return {
        "lookup": dict(result.receipt) if result.receipt else None,
        "evidence": dict(result.evidence) if result.evidence else None,
    }


def not_found_counts_after(row: OperationRecord, in_flight: float, settle: float) -> datetime:
    """When a not-found look-up becomes evidence of "not applied" for this row.

    No request of the row leaves once it has stopped being ``dispatching``: its sender
    recorded the outcome after the request returned, or its lease passed first and a sender
    never writes after its lease (``Worker._send``). So the last request left by the moment
    the row became ``unknown`` (``updated_at``: a later look-up that finds nothing does not
    move it) and landed, if at all, within ``in_flight_seconds`` of that. Counting from the
    attempt's start alone would be wrong for a sender paused between its ``dispatching``
    commit and its write: its request can leave long after the attempt started."""
    start = row.last_attempt_started_at or row.first_dispatched_at or row.updated_at
    return max(start, row.updated_at) + timedelta(seconds=in_flight + settle)
