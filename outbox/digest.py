"""Canonical payload digests and default idempotency keys.

The digest is sha256 over the RFC 8785 (JSON Canonicalization Scheme) form of the payload,
computed by the maintained ``rfc8785`` library: the same payload in any key order, from
the Python API or from a row inserted with plain SQL, has the same digest. Approvals bind
to this digest.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

DIGEST_PREFIX = "sha256:"


def canonical_json(payload: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value."""
    return bytes(rfc8785.dumps(payload))


def payload_digest(payload: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``payload``."""
    return digest_of_canonical(canonical_json(payload))


def digest_of_canonical(canonical: bytes) -> str:
    """``sha256:<hex>`` of bytes already in canonical form (:func:`canonical_json`)."""
    return DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest()


def default_idempotency_key(tenant_id: str, operation_id: str) -> str:
    """The key a row gets when none is given: ``<tenant_id>:<operation_id>``.

    It is derived in the database too (a trigger), so a plain-SQL insert gets the same
    key as the Python API. It is never regenerated: a retry, a restart or a reconciliation
    always reuses the stored key.
    """
    return f"{tenant_id}:{operation_id}"
