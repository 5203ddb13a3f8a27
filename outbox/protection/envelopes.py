"""Protected payloads: envelope encryption of payload bodies and receipts (AES-256-GCM).

A :class:`KeyRing` holds master keys (key-encryption keys), each under a key id, loaded
from ``env:NAME`` / ``file:PATH`` references (never literals: see
:mod:`providers.secrets_ref`). One key id is *active*: new envelopes use it; the others
stay to open what was written before a rotation.

Nothing is encrypted under a master key directly. Each tenant gets its own data key,
derived with HKDF-SHA256 from the master key and the tenant id, so one tenant's data key
opens no other tenant's rows. AES-GCM's associated data names the purpose (``payload`` or
``receipt``), the tenant, the operation id and the key id: a ciphertext copied into
another row, another tenant or the other column fails authentication.

An envelope replaces the JSON value it protects, in the same column (the schema does not
change; the key id is stored with the row)::

    {"$outboxd_enc": {"v": 1, "alg": "A256GCM", "kid": "2026-01", "nonce": "...", "ct": "..."}}

The agent seals at enqueue (:func:`outbox.api.enqueue` / ``advance`` with
``protection=``, or :func:`configure` once per process); the payload digest stays the
digest of the plaintext, so approvals bind to what is sent. The dispatcher opens an
envelope in memory right before admission and the send, and seals receipts of protected
providers before they are written. Plain-SQL inserts cannot encrypt.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from outbox.credential_refs import resolve_secret
from outbox.errors import ConfigError, OutboxError

ENVELOPE_KEY: Final = "$outboxd_enc"
VERSION: Final = 1
ALG: Final = "A256GCM"
KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
PAYLOAD: Final = "payload"
RECEIPT: Final = "receipt"
KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_CACHED_DATA_KEYS: Final = 4096

# Blocked reasons (stable strings, like outbox.admission's).
PAYLOAD_KEY_UNAVAILABLE: Final = "payload_key_unavailable"
PAYLOAD_UNDECRYPTABLE: Final = "payload_undecryptable"


class EnvelopeError(OutboxError):
    """A protected value cannot be opened."""

    reason: str = PAYLOAD_UNDECRYPTABLE


class KeyUnavailable(EnvelopeError):
    """The key id of a protected value is not in the key ring."""

    reason = PAYLOAD_KEY_UNAVAILABLE


def generate_key() -> str:
    """A new master key: 32 random bytes, base64 (what a key file or variable holds)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")


def is_envelope(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and ENVELOPE_KEY in value


def envelope_key_id(value: Any) -> str | None:
    """The key id an envelope was sealed under (None if ``value`` is not an envelope)."""
    if not is_envelope(value):
        return None
    inner = value[ENVELOPE_KEY]
    kid = inner.get("kid") if isinstance(inner, Mapping) else None
    return kid if isinstance(kid, str) else None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise EnvelopeError("the envelope is malformed")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise EnvelopeError("the envelope is malformed") from None


def _aad(purpose: str, tenant_id: str, operation_id: str, kid: str) -> bytes:
    return b"outboxd/v1\n" + json.dumps([purpose, tenant_id, operation_id, kid]).encode()


def _decode_master_key(kid: str, reference: str, text: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raw = b""
    if len(raw) != KEY_BYTES:  # the value is never echoed: it is the key
        raise ConfigError(
            f"protection.keys.{kid}: the key referenced by {reference!r} must be "
            f"{KEY_BYTES} random bytes in base64",
            key=f"protection.keys.{kid}",
        )
    return raw


class KeyRing:
    """Master keys by key id, and the active id new envelopes are sealed under."""

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if not keys:
            raise ConfigError("protection.keys: at least one key is required")
        for kid, key in keys.items():
            if not KEY_ID.fullmatch(kid):
                raise ConfigError(
                    f"protection.keys: key id {kid!r} must be 1-64 letters, digits, '.', '_' "
                    "or '-'",
                    key="protection.keys",
                )
            if len(key) != KEY_BYTES:
                raise ConfigError(f"protection.keys.{kid}: a key is {KEY_BYTES} bytes")
        if active not in keys:
            raise ConfigError(
                "protection.active_key: names no key of protection.keys",
                key="protection.active_key",
            )
        self._keys = dict(keys)
        self.active = active
        self._data_keys: dict[tuple[str, str], AESGCM] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_references(
        cls,
        references: Mapping[str, str],
        active: str,
        environ: Mapping[str, str] | None = None,
    ) -> KeyRing:
        """Resolve ``{kid: "env:NAME" | "file:PATH"}``; errors name the key id and the
        reference, never the value."""
        keys = {
            kid: _decode_master_key(
                kid, ref, resolve_secret(ref, f"protection.keys.{kid}", environ).reveal()
            )
            for kid, ref in references.items()
        }
        return cls(keys, active)

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(active={self.active!r}, key_ids={sorted(self._keys)!r})"

    def _data_key(self, kid: str, tenant_id: str) -> AESGCM:
        cached = self._data_keys.get((kid, tenant_id))
        if cached is not None:
            return cached
        master = self._keys.get(kid)
        if master is None:
            raise KeyUnavailable(key_id=kid)
        derived = HKDF(
            algorithm=hashes.SHA256(),
            length=KEY_BYTES,
            salt=b"outboxd/data-key/v1/" + kid.encode(),
            info=b"tenant\x00" + tenant_id.encode("utf-8"),
        ).derive(master)
        aead = AESGCM(derived)
        with self._lock:
            if len(self._data_keys) >= _MAX_CACHED_DATA_KEYS:
                self._data_keys.clear()
            self._data_keys[(kid, tenant_id)] = aead
        return aead

    def seal(
        self, value: Any, *, purpose: str, tenant_id: str, operation_id: str
    ) -> dict[str, Any]:
        """The envelope of a JSON value under the active key and the tenant's data key."""
        kid = self.active
        plaintext = json.dumps(
            value, separators=(",", ":"), ensure_ascii=False, default=str
        ).encode("utf-8")
        nonce = os.urandom(NONCE_BYTES)
        ct = self._data_key(kid, tenant_id).encrypt(
            nonce, plaintext, _aad(purpose, tenant_id, operation_id, kid)
        )
        return {
            ENVELOPE_KEY: {"v": VERSION, "alg": ALG, "kid": kid, "nonce": _b64(nonce),
                           "ct": _b64(ct)}
        }

    def open(self, envelope: Any, *, purpose: str, tenant_id: str, operation_id: str) -> Any:
        """The JSON value inside ``envelope``; :class:`EnvelopeError` (or
        :class:`KeyUnavailable`) when it cannot be opened for this row."""
        if not is_envelope(envelope):
            raise EnvelopeError("not an envelope")
        inner = envelope[ENVELOPE_KEY]
        if not isinstance(inner, Mapping) or inner.get("v") != VERSION or inner.get(
            "alg"
        ) != ALG:
            raise EnvelopeError("the envelope is malformed or of an unknown version")
        kid = inner.get("kid")
        if not isinstance(kid, str):
            raise EnvelopeError("the envelope is malformed")
        nonce, ct = _unb64(inner.get("nonce")), _unb64(inner.get("ct"))
        if len(nonce) != NONCE_BYTES:
            raise EnvelopeError("the envelope is malformed")
        aead = self._data_key(kid, tenant_id)
        try:
            plaintext = aead.decrypt(nonce, ct, _aad(purpose, tenant_id, operation_id, kid))
        except InvalidTag:
            raise EnvelopeError(
                "authentication failed (another key, tenant, operation or column)", key_id=kid
            ) from None
        return json.loads(plaintext)


@dataclass(frozen=True)
class Protection:
    """A key ring and the providers whose payloads and receipts are protected."""

    ring: KeyRing
    providers: frozenset[str]

    @classmethod
    def from_references(
        cls,
        keys: Mapping[str, str],
        active_key: str,
        providers: Iterable[str],
        environ: Mapping[str, str] | None = None,
    ) -> Protection:
        return cls(KeyRing.from_references(keys, active_key, environ), frozenset(providers))

    def protects(self, provider: str) -> bool:
        return provider in self.providers

    def seal_payload(self, tenant_id: str, operation_id: str, payload: Any) -> dict[str, Any]:
        return self.ring.seal(payload, purpose=PAYLOAD, tenant_id=tenant_id,
                              operation_id=operation_id)

    def open_payload(self, op: Any) -> Any:
        """The plaintext payload of an operation record (unchanged if not an envelope)."""
        return _open(self, op, op.payload, PAYLOAD)

    def open_receipt(self, op: Any) -> Any:
        """The plaintext receipt of an operation record (unchanged if not an envelope)."""
        return _open(self, op, op.receipt, RECEIPT)


def _open(protection: Protection | None, op: Any, value: Any, purpose: str) -> Any:
    if not is_envelope(value):
        return value
    if protection is None:
        raise KeyUnavailable("no key ring is configured", key_id=envelope_key_id(value))
    return protection.ring.open(
        value, purpose=purpose, tenant_id=op.tenant_id, operation_id=op.operation_id
    )


def open_payload(protection: Protection | None, op: Any) -> Any:
    """``op.payload`` in plaintext; raises :class:`EnvelopeError` if it is an envelope that
    ``protection`` cannot open. Plaintext payloads (plain-SQL rows) pass unchanged."""
    return _open(protection, op, op.payload, PAYLOAD)


def open_receipt(protection: Protection | None, op: Any) -> Any:
    return _open(protection, op, op.receipt, RECEIPT)


def seal_receipt(protection: Protection | None, op: Any, receipt: Any) -> Any:
    """``receipt`` sealed for ``op``'s row when its provider is protected, else unchanged
    (the same object)."""
    if protection is None or receipt is None or not protection.protects(op.provider):
        return receipt
    return protection.ring.seal(
        receipt, purpose=RECEIPT, tenant_id=op.tenant_id, operation_id=op.operation_id
    )


_default: Protection | None = None


def configure(protection: Protection | None) -> None:
    """Set the process-wide protection :func:`outbox.api.enqueue` and ``advance`` use when
    they are not given one (None: no default)."""
    global _default
    _default = protection


def default() -> Protection | None:
    return _default
