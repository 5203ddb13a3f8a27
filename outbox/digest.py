r"""Canonical payload digests and default idempotency keys.

The digest is sha256 over the RFC 8785 (JSON Canonicalization Scheme) form of the payload:
the same payload in any key order, from the Python API or from a row inserted with plain
SQL, has the same digest. Approvals bind to this digest.

The canonical form is computed by the maintained ``rfc8785`` library, except for the
payloads orjson (sorting keys) and the standard library's C encoder write byte for byte the
same (:func:`_plain`):
no floats (ECMAScript number formatting is what ``rfc8785`` is for), integers in JSON's
exact domain, object keys that sort the same by code point as by UTF-16 code unit, and
only JSON's own types. All three escape exactly ``"``, ``\\`` and the control characters
below U+0020 (``\b \f \n \r \t`` by name, the rest as lower-case ``\u00xx``) and write
every other character as UTF-8. orjson goes first (a tenth of the C encoder's time); what
it refuses (lone surrogates, nesting past 255 levels) goes to the C encoder.
``tests/unit/test_digest.py`` checks that they agree with the library on generated values,
floats and odd keys included.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson
import rfc8785

DIGEST_PREFIX = "sha256:"
_EXACT = 2**53 - 1
"""The largest integer an IEEE 754 double holds exactly (RFC 8785's integer domain)."""
_SORTS_APART = "\ue000"
"""From here on a BMP character sorts above a surrogate pair in UTF-16 but below it by
code point: keys with such characters take the library's path."""
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True,
                           separators=(",", ":")).encode


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only what the C encoder writes as RFC 8785 does: dicts with
    ``str`` keys below U+E000, lists, ``str``, ``bool``, ``None`` and ``int`` within
    ±(2**53 - 1); exact types only (no subclasses, no floats)."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is dict:
            for k in v:
                if type(k) is not str or (not k.isascii() and max(k) >= _SORTS_APART):
                    return False
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
        elif t is int:
            if not -_EXACT <= v <= _EXACT:
                return False
        elif not (t is str or t is bool or v is None):
            return False
    return True


def canonical_json(payload: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value."""
    if _plain(payload):
        try:
            return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate, nesting past orjson's limit
            pass
        try:
            return _encode(payload).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: let the library say so its way
            pass
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
