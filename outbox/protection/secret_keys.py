"""Credential keys: which key names mark a value as a credential, and which values could be one.

A key is a credential key when, after splitting it into words (camelCase, ``-``, ``_``,
spaces, digits) and dropping trailing neutral words (``value``, ``raw``, ``b64``,
``confirm``, ...), it *ends* with a credential noun: ``password``, ``passwd``,
``passphrase``, ``secret``, ``credential(s)``, ``token`` (except page/cursor/
idempotency/tokenizer tokens), ``<api|access|private|secret|client|...>key``,
``authorization`` or ``cookie``. So ``apiKey``, ``X-API-KEY``, ``x_api_key``,
``client_secret`` and ``new_password`` are credential keys, but ``token_count``,
``max_tokens``, ``secret_santa_group``, ``password_reset_required``, ``private_key_id``,
``idempotency_key`` and ``next_page_token`` are not (a trailing qualifier makes the key
*about* the credential). A credential key is refused only if its value could carry one:
a non-empty string that is not a mask (``"****"``, ``"[REDACTED]"``), a number, or a
container holding such a string; ``true``/``false``, ``null`` and empty values pass.
``authorization``/``cookie`` (header names; also payment objects) need a string value.
"""

from __future__ import annotations

import re
from functools import lru_cache

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
# Trailing words that do not change what a key holds ("password_confirmation", "apiKeyB64").
_NEUTRAL = (
    "value val plain plaintext raw str string text b64 base64 hex enc encrypted hash hashed "
    "digest bytes data header confirm confirmation again repeat old new current"
)
_NEUTRAL_SUFFIXES = frozenset(_NEUTRAL.split())
_SENSITIVE_TAIL = re.compile(
    r"(?:password|passwords|passwd|passphrase|secret|secrets|credentials?|authorization"
    r"|cookies?|token|(?:access|refresh|auth|api|bearer|id|session)tokens"
    r"|(?:api|access|private|secret|signing|encryption|client|auth|master|account|service"
    r"|ssh|session|subscription|app|hmac|shared|storage|license|licence)keys?)$"
)
# Tokens that are not credentials: pagination/idempotency cursors and tokenizer tokens.
_BENIGN_TOKEN = re.compile(
    r"(?:page|next|prev|previous|pagination|continuation|cursor|sync|idempotency|client"
    r"|cancellation|cancel|resume|delta|change|eos|bos|pad|unk|stop|sep|cls|mask|special)token$"
)
_HEADER_ONLY = ("authorization", "cookie", "cookies")
_MASKED = re.compile(
    r"[\s*•xX#.\-]*|[\[<(]?(?:redacted|hidden|removed|none|null|n/?a)[\]>)]?", re.IGNORECASE
)


@lru_cache(maxsize=4096)  # payloads of one kind share their keys
def key_kind(key: str) -> str | None:
    """Return "any" or "str" (which values are refused) for a credential key, else None."""
    words = [w for w in _WORD_SPLIT.split(_CAMEL.sub("_", key).lower()) if w]
    while len(words) > 1 and (words[-1] in _NEUTRAL_SUFFIXES or words[-1].isdigit()):
        words.pop()
    joined = "".join(words)
    if not _SENSITIVE_TAIL.search(joined) or _BENIGN_TOKEN.search(joined):
        return None
    return "str" if joined.endswith(_HEADER_ONLY) else "any"


def carries(value: object, strings_only: bool) -> bool:
    """Could `value` hold a credential? (not bool/None/empty/masked)"""
    if isinstance(value, str):
        return not _MASKED.fullmatch(value.strip())
    if strings_only or isinstance(value, bool) or value is None:
        return False
    if isinstance(value, dict | list | tuple):
        children = value.values() if isinstance(value, dict) else value
        return any(carries(v, True) for v in children)
    return isinstance(value, int | float)
