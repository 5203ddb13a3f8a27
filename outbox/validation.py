"""What an operation to stage is, and the checks it passes before anything is written.

:class:`StagedOperation` holds the fields :func:`outbox.api.enqueue` and
:func:`outbox.api.advance` accept; :func:`prepare` validates one (ids, payload shape and
size, values the database cannot store unchanged, credentials, the digest) and returns the
row to insert, its payload sealed when a protection covers the provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox import decoding, errors
from outbox.digest import canonical_json, payload_digest
from outbox.protection import envelopes as protect
from outbox.protection.secrets import check_no_secrets


@dataclass(frozen=True)
class StagedOperation:
    """An operation to stage with :func:`advance` (the same fields as :func:`enqueue`)."""

    operation_id: str
    provider: str
    payload: Mapping[str, Any] | None = None
    payload_ref: str | None = None
    payload_digest: str | None = None
    idempotency_key: str | None = None
    requires_approval: bool = False
    deadline_at: datetime | None = None
    ordering_key: str | None = None
    max_attempts: int | None = None
    max_elapsed_seconds: float | None = None
    workflow_version: str | None = None
    payload_schema: int | None = None
    traceparent: str | None = None


_MAX_SAFE_INTEGER = 2**53 - 1


def _unportable(value: Any, path: str = "$") -> str | None:
    """The JSON path of the first value that does not survive a round trip through both
    dialects, else None: a NUL character (PostgreSQL's jsonb refuses it), or an integral
    float beyond 2**53 (jsonb returns it as an integer, which RFC 8785 cannot digest, so
    the row read back could never be admitted)."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, float):
        return path if value.is_integer() and abs(value) > _MAX_SAFE_INTEGER else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            sub = f"{path}.{key}"
            if isinstance(key, str) and "\x00" in key:
                return sub
            found = _unportable(item, sub)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _unportable(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def prepare(
    tenant_id: str,
    task_id: str,
    op: StagedOperation,
    max_payload_bytes: int,
    protection: protect.Protection | None = None,
) -> dict[str, Any]:
    """Validate an operation before anything is written; returns the row to insert (the
    payload sealed in an envelope when ``protection`` covers the provider; the digest is
    always the plaintext's)."""
    for name, value in (
        ("tenant_id", tenant_id),
        ("task_id", task_id),
        ("operation_id", op.operation_id),
        ("provider", op.provider),
    ):
        if not isinstance(value, str) or not value.strip():
            raise errors.InvalidPayload(f"{name} must be a non-empty string", field=name)
    digest = op.payload_digest
    if op.payload is None:
        if op.payload_ref is None:
            raise errors.InvalidPayload("give payload or payload_ref", operation_id=op.operation_id)
        if digest is None:
            raise errors.InvalidPayload(
                "payload_ref needs payload_digest", operation_id=op.operation_id
            )
    else:
        if not isinstance(op.payload, Mapping):
            raise errors.InvalidPayload(
                "the payload must be a JSON object", operation_id=op.operation_id
            )
        if protect.ENVELOPE_KEY in op.payload:
            raise errors.InvalidPayload(
                f"the top-level key {protect.ENVELOPE_KEY!r} is reserved for envelopes",
                operation_id=op.operation_id,
            )
        shape = decoding.shape_problem(op.payload)
        if shape is not None:
            raise errors.PayloadUndecodable(
                f"the payload {shape}",
                operation_id=op.operation_id,
            )
        try:
            size = len(canonical_json(dict(op.payload)))
        except Exception as exc:  # rfc8785 raises on NaN, non-str keys, odd types
            raise errors.InvalidPayload(
                "the payload is not JSON-serialisable", operation_id=op.operation_id
            ) from exc
        if size > max_payload_bytes:
            raise errors.InvalidPayload(
                "the payload exceeds max_payload_bytes",
                operation_id=op.operation_id,
                size=size,
                limit=max_payload_bytes,
            )
        unportable = _unportable(op.payload)
        if unportable is not None:
            raise errors.InvalidPayload(
                "the payload holds a value the database cannot store and return unchanged",
                operation_id=op.operation_id,
                path=unportable,
            )
        check_no_secrets(op.payload)
        computed = payload_digest(dict(op.payload))
        if digest is not None and digest != computed:
            raise errors.InvalidPayload(
                "payload_digest does not match the payload", operation_id=op.operation_id
            )
        digest = computed
    stored: Any = dict(op.payload) if op.payload is not None else None
    if stored is not None and protection is not None and protection.protects(op.provider):
        stored = protection.seal_payload(tenant_id, op.operation_id, stored)
        if len(canonical_json(stored)) > max_payload_bytes:
            raise errors.InvalidPayload(
                "the encrypted payload exceeds max_payload_bytes",
                operation_id=op.operation_id,
                limit=max_payload_bytes,
            )
    row = {
        "tenant_id": tenant_id,
        "task_id": task_id,
        "operation_id": op.operation_id,
        "provider": op.provider,
        "payload": stored,
        "payload_ref": op.payload_ref,
        "payload_digest": digest,
        "requires_approval": op.requires_approval,
        "deadline_at": op.deadline_at,
        "ordering_key": op.ordering_key,
        "max_attempts": op.max_attempts,
        "max_elapsed_seconds": op.max_elapsed_seconds,
        "workflow_version": op.workflow_version,
        "payload_schema": op.payload_schema,
        "traceparent": op.traceparent,
    }
    if op.idempotency_key is not None:
        row["idempotency_key"] = op.idempotency_key
    return row
