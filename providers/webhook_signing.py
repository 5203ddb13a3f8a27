"""Standard Webhooks signatures for the ``http`` provider (``signing = "standard-webhooks"``).

The Standard Webhooks specification (standardwebhooks.com) signs a request with three
headers, which its published verifiers (``standardwebhooks`` on PyPI, and its ports to
other languages) check:

* ``webhook-id`` — the message's id, the same on every re-send: here the operation's
  idempotency key, so a receiver deduplicating on either sees one message;
* ``webhook-timestamp`` — whole seconds since the epoch when this attempt is signed (a
  verifier refuses one more than five minutes off its clock);
* ``webhook-signature`` — ``v1,<base64 HMAC-SHA256>`` of ``"<id>.<timestamp>.<body>"``
  over the exact body bytes sent, one per configured secret, space-separated: list the new
  secret before the old while receivers rotate, and either verifies.

Secrets are ``signing_secrets = ["env:NAME", "file:PATH"]`` references (never literals),
each a base64 key with an optional ``whsec_`` prefix, as the specification writes them.
Nothing here logs: a secret or a signature never leaves this module but on the wire.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Final

from outbox.credential_refs import Secret

SCHEME: Final = "standard-webhooks"
SECRET_PREFIX: Final = "whsec_"
HEADERS: Final = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})
MIN_KEY_BYTES: Final = 16


def secret_key(secret: Secret) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` (or bare base64) secret; ``ValueError`` naming
    what is wrong (never the value)."""
    text = secret.reveal().strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 (a Standard Webhooks secret: whsec_<base64>)") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"is shorter than {MIN_KEY_BYTES} bytes once decoded")
    return key


class WebhookSigner:
    """Signs request bodies with every configured key (the first is the newest)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("at least one signing secret is needed")
        self._keys = tuple(keys)

    def __repr__(self) -> str:
        return f"WebhookSigner({len(self._keys)} secret(s))"

    def headers(self, message_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
        """The three headers for ``body`` sent as message ``message_id`` at ``now``."""
        timestamp = str(int(time.time() if now is None else now))
        signed = f"{message_id}.{timestamp}.".encode() + body
        signatures = " ".join(
            "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            for key in self._keys
        )
        return {"webhook-id": message_id, "webhook-timestamp": timestamp,
                "webhook-signature": signatures}
