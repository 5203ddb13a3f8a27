"""Admission: is a stored row fit to be dispatched at all?

Rows written with plain SQL bypass the Python API's checks; restored rows are untrusted
data. The dispatcher calls :func:`admit` on every claimed row before anything else. A row
that fails is parked as ``blocked`` with the reason below; it never crashes or stalls the
daemon. Reasons are stable strings (they label the ``outbox_blocked_operations`` metric).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from outbox import decoding
from outbox.digest import canonical_json, digest_of_canonical
from outbox.errors import SecretInPayload
from outbox.protection import artifacts as _artifacts
from outbox.protection.secrets import SecretFinding, find_secrets
from outbox.records import OperationRecord

UNKNOWN_PROVIDER = "unknown_provider"
PAYLOAD_NOT_OBJECT = "payload_not_object"
PAYLOAD_TOO_LARGE = "payload_too_large"
PAYLOAD_INVALID = "payload_invalid"
PAYLOAD_UNDECODABLE = decoding.PAYLOAD_UNDECODABLE
CREDENTIAL_IN_PAYLOAD = "credential_in_payload"
DIGEST_MISMATCH = "digest_mismatch"
ARTIFACT_MISSING = _artifacts.ARTIFACT_MISSING
ARTIFACT_DIGEST_MISMATCH = _artifacts.ARTIFACT_DIGEST_MISMATCH
INCOMPATIBLE_VERSION = "incompatible_version"
INCOMPATIBLE_PAYLOAD_SCHEMA = INCOMPATIBLE_VERSION  # one reason for schema and workflow


class Admission(NamedTuple):
    """Whether a row may be dispatched; if not, why (a named tuple: one is made per claimed
    row, a third of a frozen dataclass's construction time)."""

    ok: bool
    reason: str | None = None
    detail: str | None = None
    digest: str | None = None
    """The canonical digest (computed if the row had none)."""
    payload: Mapping[str, Any] | None = None


def admit(
    op: OperationRecord,
    *,
    known_providers: Collection[str],
    max_payload_bytes: int,
    supported_schemas: Collection[int] | None = None,
    artifacts: _artifacts.ArtifactStore | None = None,
    scanned: tuple[object, Sequence[SecretFinding]] | None = None,
) -> Admission:
    """Check one row. Never raises for bad data: returns the reason instead.

    A row with ``payload_ref`` and no inline payload is resolved through ``artifacts``
    (:func:`outbox.protection.artifacts.resolve`); the verified artifact is returned as ``payload``
    and is exempt from ``max_payload_bytes`` (large payloads are what artifacts are for)."""
    if op.provider not in known_providers:
        return Admission(False, UNKNOWN_PROVIDER, f"provider {op.provider!r} is not configured")
    payload = op.payload
    from_artifact = False
    if payload is None and op.payload_ref is not None:
        found = _artifacts.resolve(artifacts, op.payload_ref, op.payload_digest)
        if not found.ok:
            return Admission(False, found.reason, found.detail)
        payload, from_artifact = found.payload, True
    if payload is None:  # JSON null (SQL NULL needs a payload_ref: a CHECK constraint)
        return Admission(False, PAYLOAD_NOT_OBJECT, "payload is JSON null")
    if not isinstance(payload, dict):
        return Admission(False, PAYLOAD_NOT_OBJECT, f"payload is a {type(payload).__name__}")
    try:
        canonical = canonical_json(payload)
    except Exception as exc:  # non-finite numbers, odd values from a foreign writer
        return Admission(False, PAYLOAD_INVALID, type(exc).__name__)
    size = len(canonical)
    if size > max_payload_bytes and not from_artifact:
        return Admission(False, PAYLOAD_TOO_LARGE, f"{size} > {max_payload_bytes} bytes")
    try:
        # ``scanned``: (the object a batch scan read, its findings): used for that object only
        if scanned is not None and scanned[0] is payload:
            findings = list(scanned[1])
        else:
            findings = find_secrets(payload)
    except SecretInPayload as exc:  # pragma: no cover - find_secrets returns, not raises
        return Admission(False, CREDENTIAL_IN_PAYLOAD, str(exc))
    if findings:
        f = findings[0]
        return Admission(False, CREDENTIAL_IN_PAYLOAD, f"{f.path} ({f.detector})")
    digest = digest_of_canonical(canonical)
    if op.payload_digest is not None and op.payload_digest != digest:
        return Admission(False, DIGEST_MISMATCH, "stored digest differs from the payload's")
    schema = op.payload_schema if op.payload_schema is not None else 1
    if supported_schemas is not None and schema not in supported_schemas:
        return Admission(False, INCOMPATIBLE_VERSION,
                         f"payload_schema {schema} not in {sorted(supported_schemas)}")
    return Admission(True, digest=digest, payload=payload)
