"""Typed, read-only views of rows, as the API and the dispatcher hand them around."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Self

import sqlalchemy as sa

from outbox import decoding
from outbox.states import OperationStatus

_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}


def _from_mapping(cls: type[Any], row: Mapping[Any, Any]) -> dict[str, Any]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    return {k: v for k, v in row.items() if k in names}


@dataclass(frozen=True)
class OperationRecord:
    id: int
    tenant_id: str
    task_id: str
    operation_id: str
    provider: str
    payload: Any
    payload_ref: str | None
    payload_digest: str | None
    idempotency_key: str | None
    requires_approval: bool
    deadline_at: datetime | None
    ordering_key: str | None
    max_attempts: int | None
    max_elapsed_seconds: float | None
    workflow_version: str | None
    payload_schema: int | None
    traceparent: str | None
    status: OperationStatus
    fencing_token: int | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    attempts: int
    first_dispatched_at: datetime | None
    last_attempt_started_at: datetime | None
    last_outcome: str | None
    next_attempt_at: datetime | None
    receipt: Any
    status_reason: str | None
    state_revision: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Self:
        data = _from_mapping(cls, row)
        data["status"] = OperationStatus(data["status"])
        data["requires_approval"] = bool(data["requires_approval"])
        return cls(**data)

    @classmethod
    def from_raw_values(cls, row: Sequence[Any], *, typed: bool = False) -> Self:
        """From a row whose columns are :data:`OPERATION_FIELDS` in order, as
        :func:`raw_operation_columns` selects them (no per-row mapping is built);
        ``payload`` and ``receipt`` arrive as the stored text and are decoded here, one row
        at a time (:mod:`outbox.decoding`): a value that
        cannot be decoded, or a text column whose bytes are not UTF-8, becomes an
        :class:`~outbox.decoding.Undecodable` ``payload`` instead of failing the batch.
        ``typed``: the driver delivered timestamps as datetimes and text as valid UTF-8
        (PostgreSQL), so neither is looked at again."""
        values = list(row)
        for at in _JSON_AT:
            values[at] = decoding.decode_json(values[at], OPERATION_FIELDS[at])
        problem: decoding.Undecodable | None = None
        bad_text = None
        if not typed:
            for at in _TIME_AT:  # SQLite's timestamps arrive as the stored text
                if isinstance(values[at], str):
                    values[at] = decoding.parse_time(values[at], OPERATION_FIELDS[at])
                if isinstance(values[at], decoding.Undecodable):
                    problem, values[at] = values[at], None
            # the types of the row's values as a set first (C loops): rarely a NotUtf8
            if decoding.NotUtf8 in set(map(type, values)):
                bad_text = next(n for n, v in zip(OPERATION_FIELDS, values, strict=True)
                                if isinstance(v, decoding.NotUtf8))
        if bad_text is not None:
            problem = decoding.Undecodable(bad_text, "stored bytes are not valid UTF-8")
        elif isinstance(values[_RECEIPT_AT], decoding.Undecodable):
            problem = values[_RECEIPT_AT]
        if problem is not None and not isinstance(values[_PAYLOAD_AT], decoding.Undecodable):
            values[_PAYLOAD_AT] = problem  # the row is parked for it: see dispatcher.engine.checks
        status = values[_STATUS_AT]
        values[_STATUS_AT] = _STATUS_OF.get(status) or OperationStatus(status)
        values[_APPROVAL_AT] = bool(values[_APPROVAL_AT])
        # the same object ``cls(*values)`` builds (the fields have no defaults, no
        # ``__post_init__``), without the frozen ``__init__``'s ``object.__setattr__`` per
        # field: 1.1 µs a row against 3.2, on the claiming thread
        record = _new(cls)
        record.__dict__.update(zip(OPERATION_FIELDS, values, strict=True))
        return record


OPERATION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(OperationRecord))
_new = object.__new__
_STATUS_AT = OPERATION_FIELDS.index("status")
_STATUS_OF: dict[str, OperationStatus] = {s.value: s for s in OperationStatus}
"""Each status by its text: a dictionary look-up, not the enum's call (0.35 µs a row)."""
_APPROVAL_AT = OPERATION_FIELDS.index("requires_approval")
_PAYLOAD_AT = OPERATION_FIELDS.index("payload")
_RECEIPT_AT = OPERATION_FIELDS.index("receipt")
_JSON_AT = (_PAYLOAD_AT, _RECEIPT_AT)
RAW_JSON_FIELDS = frozenset({"payload", "receipt"})
"""Columns the dispatcher's claim reads as text and decodes per row."""
RAW_TIME_FIELDS = frozenset(
    f.name for f in fields(OperationRecord) if "datetime" in str(f.type)
)
"""Timestamps, read as text on SQLite (where they are text) and parsed per row."""
_TIME_AT = tuple(OPERATION_FIELDS.index(n) for n in sorted(RAW_TIME_FIELDS))


def raw_operation_columns(source: Any, *, raw_times: bool) -> list[Any]:
    """Columns to select for :meth:`OperationRecord.from_raw_values`: every field of
    ``source`` (the operations table, or a CTE over it) in order, the JSON ones (and, with
    ``raw_times``, the timestamps: SQLite stores them as text) read as text. The driver
    then never decodes a row's content, so one undecodable value cannot fail a whole
    result: each row is decoded on its own. PostgreSQL's timestamps stay typed; the ones
    Python cannot hold are clamped (:func:`outbox.decoding.register_pg_time_loaders`)."""
    raw = RAW_JSON_FIELDS | (RAW_TIME_FIELDS if raw_times else frozenset())
    return [
        sa.cast(source.c[name], sa.Text()).label(name) if name in raw else source.c[name]
        for name in OPERATION_FIELDS
    ]


@dataclass(frozen=True)
class TaskRecord:
    id: int
    tenant_id: str
    task_id: str
    workflow_version: str | None
    state_revision: int
    phase: str | None
    state: Any
    cancelled_at: datetime | None
    cancel_reason: str | None
    deadline_at: datetime | None
    max_attempts: int | None
    max_elapsed_seconds: float | None
    legal_hold_owner: str | None
    legal_hold_review_at: datetime | None
    created_at: datetime
    updated_at: datetime
    operations: tuple[OperationRecord, ...] = field(default=())

    @classmethod
    def from_row(cls, row: Mapping[Any, Any], operations: tuple[OperationRecord, ...] = ()) -> Self:
        return cls(**_from_mapping(cls, row), operations=operations)
