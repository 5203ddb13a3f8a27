"""Rows for the append-only records: ``outbox_events`` (every status change) and
``outbox_attempts`` (every dispatch attempt with its evidence). Written in the same
transaction as the transitions they describe, with one multi-row insert per batch."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from outbox import schema
from outbox.records import OperationRecord

EVIDENCE_LIMIT = 4096  # characters of JSON evidence kept per attempt
NUL_STANDIN = "\ufffd"
"""What a NUL character of a recorded value becomes on PostgreSQL (the replacement
character): ``jsonb`` and ``text`` hold no U+0000."""


def without_nul(value: Any) -> Any:
    """``value`` with each NUL character of its strings (keys included) replaced by
    :data:`NUL_STANDIN`; other values as they are."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_STANDIN)
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(v) for v in value]
    return value


def event(
    op: OperationRecord,
    *,
    from_status: str | None,
    to_status: str | None,
    actor: str,
    reason: str | None = None,
    kind: str = "transition",
    fencing_token: int | None = None,
    detail: Mapping[str, Any] | None = None,
    evidence_ref: str | None = None,
) -> dict[str, Any]:
    return {
        "tenant_id": op.tenant_id,
        "task_id": op.task_id,
        "operation_id": op.operation_id,
        "kind": kind,
        "from_status": from_status,
        "to_status": to_status,
        "actor": actor,
        "reason": reason,
        "evidence_ref": evidence_ref,
        "detail": dict(detail) if detail else None,
        "fencing_token": fencing_token if fencing_token is not None else op.fencing_token,
    }


def attempt(
    op: OperationRecord,
    *,
    attempt_no: int,
    token: int,
    worker: str,
    result_class: str,
    started_at: datetime | None,
    finished_at: datetime | None,
    status_code: int | None = None,
    error_class: str | None = None,
    transport_phase: str | None = None,
    request_digest: str | None = None,
    duration_ms: float | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "tenant_id": op.tenant_id,
        "operation_id": op.operation_id,
        "attempt": attempt_no,
        "fencing_token": token,
        "worker": worker,
        "provider": op.provider,
        "started_at": started_at,
        "finished_at": finished_at,
        "result_class": result_class,
        "status_code": status_code,
        "error_class": error_class,
        "transport_phase": transport_phase,
        "request_digest": request_digest,
        "duration_ms": duration_ms,
        "evidence": bounded(evidence),
    }


_WIDEST_ESCAPE = 12  # characters of JSON a character can take: an escaped surrogate pair
_ITEM_JSON = 8  # a key's and a value's quotes, ": " and ", "
_SCALAR_JSON = {int: 16, float: 24, bool: 5, type(None): 4}
"""The most characters ``json.dumps`` writes for a value of each type (an ``int`` below
10**15 in magnitude; a float's ``repr``, ``NaN`` and ``-Infinity`` included)."""


def _small_and_flat(evidence: Mapping[str, Any]) -> bool:
    """Whether ``evidence`` is text keys to plain scalars whose JSON certainly fits
    :data:`EVIDENCE_LIMIT`, known without encoding it: each character counted as the
    widest escape it can take. Such evidence is what :func:`bounded` keeps as it is."""
    room = EVIDENCE_LIMIT - 2
    for key, value in evidence.items():
        kind = type(key), type(value)
        if kind[0] is not str:
            return False
        if kind[1] is str:
            room -= _WIDEST_ESCAPE * (len(key) + len(value)) + _ITEM_JSON
        elif kind[1] in _SCALAR_JSON and (kind[1] is not int or -10**15 < value < 10**15):
            room -= _WIDEST_ESCAPE * len(key) + _ITEM_JSON + _SCALAR_JSON[kind[1]]
        else:
            return False
        if room < 0:
            return False
    return True


def bounded(evidence: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Evidence is untrusted and may be large: keep it small and JSON-safe."""
    if not evidence:
        return None
    if _small_and_flat(evidence):  # the common case, as below without encoding it
        return dict(evidence)
    try:  # the common case: plain JSON values already, and small
        text = json.dumps(evidence, sort_keys=True)
        plain = True
    except (TypeError, ValueError):
        plain = False
        try:
            text = json.dumps(evidence, default=str, sort_keys=True)
        except (TypeError, ValueError):  # keys of mixed types do not sort; a cycle
            try:
                text = json.dumps(evidence, default=str, skipkeys=True)
            except (TypeError, ValueError):
                text = json.dumps({"unencodable": type(evidence).__name__})
    if len(text) > EVIDENCE_LIMIT:
        return {"truncated": True, "prefix": text[:EVIDENCE_LIMIT]}
    if plain and all(isinstance(k, str) for k in evidence):
        return dict(evidence)
    result: dict[str, Any] = json.loads(text)
    return result


INSERT_EVENTS = sa.insert(schema.events)
INSERT_ATTEMPTS = sa.insert(schema.attempts)
ExecuteMany = Callable[[Connection, Any, Sequence[Mapping[str, Any]]], object]


def _execute(conn: Connection, statement: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    conn.execute(statement, list(rows))


def write(
    conn: Connection,
    events: Sequence[Mapping[str, Any]] = (),
    attempts: Sequence[Mapping[str, Any]] = (),
    *,
    execute_many: ExecuteMany = _execute,
) -> None:
    """The rows in one multi-row insert per table (``execute_many``: how a store runs an
    executemany; ``Connection.execute`` unless the store has a faster way). On PostgreSQL
    a NUL character in any value — a verifier's evidence or reason, a provider's answer —
    is written as :data:`NUL_STANDIN`: the insert would fail, and with it the transition
    it records, on every try."""
    if conn.dialect.name == "postgresql":
        events, attempts = without_nul(events), without_nul(attempts)
    if events:
        execute_many(conn, INSERT_EVENTS, events)
    if attempts:
        execute_many(conn, INSERT_ATTEMPTS, attempts)

