"""Refuse payloads that carry credentials: credentials never enter a record.

`find_secrets` walks a JSON-like payload (dicts, lists, tuples, scalars) and reports
every place that looks like a credential, by JSON path and detector name, never by value.

* Key names. A key is a credential key when, after splitting it into words (camelCase,
  ``-``, ``_``, spaces, digits) and dropping trailing neutral words (``value``, ``raw``,
  ``b64``, ``confirm``, ...), it *ends* with a credential noun: ``password``, ``passwd``,
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
* String values (and long keys). detect-secrets' regex plugins run first; our own patterns
  cover what detect-secrets 1.5 has no detector for; then a high-entropy check that skips
  hex digests, UUIDs and human-made identifiers (see `_high_entropy`).
"""

from __future__ import annotations

import base64
import binascii
import importlib
import json
import re
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Any, TypeVar

from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

from outbox.errors import SecretInPayload

_K = TypeVar("_K", bound=Hashable)

__all__ = ["SecretFinding", "check_no_secrets", "find_secrets"]


@dataclass(frozen=True)
class SecretFinding:
    """Where a credential-like item sits (a JSON path) and which detector saw it."""

    path: str  # e.g. "$.customer.api_key" or "$.items[2].note"
    detector: str  # e.g. "key_name", "aws_access_key", "jwt", "high_entropy"


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
def _key_kind(key: str) -> str | None:
    """Return "any" or "str" (which values are refused) for a credential key, else None."""
    words = [w for w in _WORD_SPLIT.split(_CAMEL.sub("_", key).lower()) if w]
    while len(words) > 1 and (words[-1] in _NEUTRAL_SUFFIXES or words[-1].isdigit()):
        words.pop()
    joined = "".join(words)
    if not _SENSITIVE_TAIL.search(joined) or _BENIGN_TOKEN.search(joined):
        return None
    return "str" if joined.endswith(_HEADER_ONLY) else "any"


def _carries(value: object, strings_only: bool) -> bool:
    """Could `value` hold a credential? (not bool/None/empty/masked)"""
    if isinstance(value, str):
        return not _MASKED.fullmatch(value.strip())
    if strings_only or isinstance(value, bool) or value is None:
        return False
    if isinstance(value, dict | list | tuple):
        children = value.values() if isinstance(value, dict) else value
        return any(_carries(v, True) for v in children)
    return isinstance(value, int | float)


_DENSE_MIN = 32
_Run = Callable[[str], str | None]  # returns a detector name or None
_Valid = Callable[[re.Match[str]], bool]


@dataclass(frozen=True)
class _Check:
    run: _Run
    # Speed-ups that never change a result (this runs on every enqueue): `needles` are
    # lower-case substrings one of which any match must contain; `gate` a fast regex any
    # text with a match also matches; `dense`: matches have no whitespace and are at least
    # _DENSE_MIN long, so the first pass may run over such words only.
    needles: tuple[str, ...] = ()
    gate: re.Pattern[str] | None = None
    dense: bool = False


def _plugin(
    where: str, name: str, *needles: str, dense: bool = False, gate: str | None = None
) -> _Check:
    """Wrap detect-secrets' plugin `module.Class` (under detect_secrets.plugins)."""
    module, cls = where.split(".")
    plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), cls)()
    # RegexBasedDetector.analyze_string only runs its regexes: it reads no global settings
    # and makes no network calls (analyze_line would consult detect-secrets' settings).
    analyze: Callable[[str], Iterator[str]] = plugin.analyze_string

    def run(text: str) -> str | None:
        for match in analyze(text):
            if name == "slack_token" and match.lower().startswith("https://"):
                return "slack_webhook"
            return name
        return None

    return _Check(run, needles, re.compile(gate) if gate else None, dense)


_GH = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")
# Instantiated once at import; analysis is stateless.
_PLUGINS: list[_Check] = [
    _plugin("private_key.PrivateKeyDetector", "private_key", "private key", "putty-user-key"),
    _plugin("jwt.JwtTokenDetector", "jwt", "eyj"),
    _plugin("aws.AWSKeyDetector", "aws_access_key", "a3t", "abia", "acca", "akia", "asia", "aws"),
    _plugin("azure_storage_key.AzureStorageKeyDetector", "azure_storage_key", "accountkey="),
    _plugin("github_token.GitHubTokenDetector", "github_token", *_GH),
    _plugin("gitlab_token.GitLabTokenDetector", "gitlab_token", "gl", "gr1348941"),
    _plugin("slack.SlackDetector", "slack_token", "xox", "hooks.slack.com"),
    _plugin("stripe.StripeDetector", "stripe_key", "k_live_"),
    _plugin("sendgrid.SendGridDetector", "sendgrid_key", "sg."),
    _plugin("twilio.TwilioKeyDetector", "twilio_key", dense=True),
    _plugin("npm.NpmDetector", "npm_token", "_authtoken="),
    _plugin("openai.OpenAIDetector", "openai_key", "t3blbkfj"),
    _plugin("pypi_token.PypiTokenDetector", "pypi_token", "pypi-age"),
    _plugin("discord.DiscordBotTokenDetector", "discord_token", dense=True),
    _plugin("mailchimp.MailchimpDetector", "mailchimp_key", "-us"),
    _plugin("square_oauth.SquareOAuthDetector", "square_oauth", "sq0csp-"),
    _plugin("telegram_token.TelegramBotTokenDetector", "telegram_token", gate=r":[\w\-]{35}"),
    # These four match "<keyword> = <value>" assignments; we run them only when the
    # vendor is named (their keyword prefix is optional, and their regexes are the slowest;
    # a vendor-less "api_key=..." is covered by inline_credential below).
    _plugin("ibm_cloud_iam.IbmCloudIamDetector", "ibm_cloud_iam", "ibm"),
    _plugin("ibm_cos_hmac.IbmCosHmacDetector", "ibm_cos_hmac", "ibm", "cos"),
    _plugin("cloudant.CloudantDetector", "cloudant", "cloudant"),
    _plugin("softlayer.SoftlayerDetector", "softlayer", "softlayer", "sl_", "sl-"),
    _plugin("basic_auth.BasicAuthDetector", "basic_auth_url", "://"),
    # Not used: ArtifactoryDetector (its "AP[0-9A-F]..." password pattern matches order
    # and product codes like "APB4471902233"; real Artifactory tokens are long and random,
    # so the entropy check catches them), KeywordDetector (code-oriented: "password: can
    # you reset it" in ticket prose would match), IPPublicDetector (not a credential),
    # HexHighEntropyString (flags every sha1/sha256 digest).
]


def _regex(name: str, pattern: str, *needles: str, valid: _Valid | None = None) -> _Check:
    compiled = re.compile(pattern)

    def run(text: str) -> str | None:
        hit = any(valid is None or valid(m) for m in compiled.finditer(text))
        return name if hit else None

    return _Check(run, needles)


def _basic_valid(m: re.Match[str]) -> bool:
    """`Basic <base64>` must decode to a printable "user:password"."""
    try:
        raw = base64.b64decode(m.group(1) + "=" * (-len(m.group(1)) % 4), validate=True)
        decoded = raw.decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


_PLACEHOLDER = re.compile(r"[A-Z_]+|[a-z_]+|[*x•.]+|<[^>]*>|\{+[^}]*\}+|\$\{?\w+\}?|%\w+%?")
_NOT_A_WORD = re.compile(r"[0-9\W_]")


def _inline_valid(m: re.Match[str]) -> bool:
    """Not a placeholder ("YOUR_API_KEY", "<token>", "${TOKEN}") nor a plain word."""
    return not _PLACEHOLDER.fullmatch(m.group(1)) and bool(_NOT_A_WORD.search(m.group(1)))


# Our own patterns, only for what detect-secrets 1.5 has no detector for.
_OWN: list[_Check] = [
    # PEM variants missing from PrivateKeyDetector's list ("ENCRYPTED PRIVATE KEY").
    _regex("private_key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", "private key"),
    _regex("github_token", r"\bgithub_pat_[0-9A-Za-z_]{60,}", "github_pat_"),  # fine-grained
    _regex("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", "npm_"),  # detect-secrets: .npmrc only
    _regex(
        "stripe_key", r"\b(?:[sr]k_test_[0-9A-Za-z]{24,}|whsec_[\w+/=]{24,})", "k_test_", "whsec_"
    ),
    _regex("anthropic_key", r"\bsk-ant-[a-z]+\d*-[A-Za-z0-9_\-]{32,}", "sk-ant-"),
    _regex("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{32,}", "sk-"),
    _regex("slack_token", r"\bxapp-\d-[A-Z0-9]+-\d+-[a-z0-9]{16,}", "xapp-"),  # app-level
    _regex("discord_webhook", r"discord(?:app)?\.com/api/webhooks/\d+/[\w\-]{20,}", "discord"),
    _regex("gcp_api_key", r"\bAIza[0-9A-Za-z_\-]{35}", "aiza"),
    _regex("gcp_oauth", r"\b(?:GOCSPX-|ya29\.)[0-9A-Za-z_\-]{20,}", "gocspx-", "ya29."),
    _regex("azure_sas", r"[?&]sig=[A-Za-z0-9%+/=]{20,}", "sig="),
    _regex("huggingface_token", r"\bhf_[A-Za-z]{34}\b", "hf_"),
    _regex("bearer_token", r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{16,}=*", "bearer"),
    _regex(
        "basic_auth_header",
        r"(?i)\bbasic\s+([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])",
        "basic",
        valid=_basic_valid,
    ),
    # "password=..." / "api_key: ..." inside text: connection strings, query strings, prose.
    _regex(
        "inline_credential",
        r"(?i)(?<![a-z0-9])(?:pass(?:word|wd)|pwd|secret|api[_-]?key|client[_-]?secret"
        r"|(?:access|refresh|auth|session)[_-]?token|(?<![a-z0-9_])token)"
        r"\s*[:=]\s*[\"']?([^\s\"';,&<>]{6,})",
        *("pass", "pwd", "secret", "api", "token"),
        valid=_inline_valid,
    ),
]

_ENTROPY = Base64HighEntropyString()
_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")
_HEXISH = re.compile(r"[0-9a-fA-F\-]+")
_SEPARATORS = re.compile(r"[/_\-+]")
_ENTROPY_LIMIT = 4.0  # bits/char; random 32-char base62 strings score >= 4.05
_MIN_SEGMENT = 16
# Random base62/64 changes character class (upper/lower/digit/other) at ~60% of positions
# (< 0.35 for about 1 in 1000 random 32-char strings, rarer when longer); camelCase
# identifiers like "getUserAccountDetailsForCustomer2024" stay around 0.3.
_MIN_SWITCHES = 0.35
_CLASS_RUNS = re.compile(r"[A-Z]+|[a-z]+|[0-9]+|[^A-Za-z0-9]+")


def _high_entropy(text: str) -> str | None:
    """Long random-looking base64/base62 tokens.

    A candidate is a run of >= 32 base64/base64url characters that is not only hex and
    dashes (sha1/sha256 digests, git SHAs, UUIDs), mixes upper case, lower case and
    digits, has a separator-free stretch of >= 16 characters (human-made identifiers like
    "Q3_2024_Revenue_Report_FINAL_v2" are short words joined by "_"/"-"/"/"), switches
    character class often (not camelCase words), and whose Shannon entropy (detect-secrets'
    calculation) exceeds 4.0 bits per character.
    Runs inside URL paths are skipped (document ids like Google Drive's live there;
    credential-bearing URLs are caught by the specific detectors above).
    """
    for m in _CANDIDATE.finditer(text):
        run = m.group(0).strip("=")
        if (
            len(run) >= 32
            and not _HEXISH.fullmatch(run)
            and not run.isupper()
            and not run.islower()
            and any(c.isdigit() for c in run)
            and max(len(s) for s in _SEPARATORS.split(run)) >= _MIN_SEGMENT
            and len(_CLASS_RUNS.findall(run)) - 1 >= _MIN_SWITCHES * (len(run) - 1)
            and not _in_url_path(text, m.start())
            and _ENTROPY.calculate_shannon_entropy(run) > _ENTROPY_LIMIT
        ):
            return "high_entropy"
    return None


def _in_url_path(text: str, pos: int) -> bool:
    """Is `pos` inside the host/path part (not the query) of a URL?"""
    scheme = text.rfind("://", 0, pos)
    return scheme >= 0 and not any(c.isspace() or c in "?#\"'<>" for c in text[scheme:pos])


_VALUE_CHECKS: list[_Check] = [*_PLUGINS, *_OWN, _Check(_high_entropy, dense=True)]
_MIN_LEN = 7  # the shortest pattern above ("://u:p@") needs 7 characters


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Paths are linked lists (parent, segment), formatted only for findings; a segment is a
# dict key, a list index, or (index,) for a dict key that must not be shown.
_Path = tuple["_Path", "str | int | tuple[int]"] | None


def _format(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, seg = path
        if isinstance(seg, str):
            parts.append(f".{seg}" if _IDENT.fullmatch(seg) else f"[{json.dumps(seg)}]")
        else:
            parts.append(f"[{seg}]" if isinstance(seg, int) else f"[<key {seg[0]}>]")
    return "$" + "".join(reversed(parts))


def find_secrets(payload: object) -> list[SecretFinding]:
    """Every credential-like item in `payload`, in document order; one finding per path."""
    return find_secrets_many([payload])[0]


def find_secrets_many(payloads: Sequence[object]) -> list[list[SecretFinding]]:
    """:func:`find_secrets` of each payload, scanning all their strings together: each
    check runs once per batch rather than once per payload (the dispatcher admits a
    claimed batch at a time)."""
    walked = [_walk(p) for p in payloads]
    strings = [
        ((n, i), text)
        for n, items in enumerate(walked)
        for i, (_, text) in enumerate(items)
        if text is not None
    ]
    hits: list[dict[int, str]] = [
        {i: "key_name" for i, (_, text) in enumerate(items) if text is None} for items in walked
    ]
    for (n, i), detector in _scan_strings(strings):
        hits[n][i] = detector
    return [
        [SecretFinding(_format(items[i][0]), found[i]) for i in sorted(found)]
        for items, found in zip(walked, hits, strict=True)
    ]


def _walk(payload: object) -> list[tuple[_Path, str | None]]:
    """(path, string to scan | None: a key_name hit) for every item worth a look."""
    items: list[tuple[_Path, str | None]] = []
    stack: list[tuple[_Path, bool, Iterator[tuple[int, Any]]]] = []
    if isinstance(payload, str):
        items.append((None, payload))
    elif isinstance(payload, dict):
        stack.append((None, True, enumerate(payload.items())))
    elif isinstance(payload, list | tuple):
        stack.append((None, False, enumerate(payload)))
    while stack:  # depth-first, in document order, without recursion
        path, is_dict, entries = stack[-1]
        for index, entry in entries:
            if is_dict:
                key, value = entry
                key_text = key if isinstance(key, str) else str(key)
                child: _Path = (path, key_text)
                kind = _key_kind(key_text)
                if kind is not None and _carries(value, kind == "str"):
                    items.append((child, None))
                    continue
                if len(key_text) >= 20:  # a credential used as a key: never echo the key
                    items.append(((path, (index,)), key_text))
            else:
                value, child = entry, (path, index)
            if isinstance(value, str):
                if len(value) >= _MIN_LEN:
                    items.append((child, value))
            elif isinstance(value, dict):
                stack.append((child, True, enumerate(value.items())))
                break
            elif isinstance(value, list | tuple):
                stack.append((child, False, enumerate(value)))
                break
        else:
            stack.pop()
    return items


def _scan_strings(strings: list[tuple[_K, str]]) -> Iterator[tuple[_K, str]]:
    """(item index, detector) for each string that a check fires on (the first check wins)."""
    if not strings:
        return
    # Each check runs once over all strings joined by newlines (no pattern spans one), or
    # just over the strings holding its needles; if it fires, string by string for the path.
    texts = [text for _, text in strings]
    lowered_parts = [text.lower() for text in texts]
    starts = list(accumulate((len(part) + 1 for part in lowered_parts[:-1]), initial=0))
    joined, lowered = "\n".join(texts), "\n".join(lowered_parts)
    # Whitespace-free words long enough to hold a `dense` check's match.
    dense = "\n".join(word for word in joined.split() if len(word) >= _DENSE_MIN)
    hits: dict[int, list[_Run]] = {}  # position in `strings` -> checks that fired there
    for check in _VALUE_CHECKS:
        owners: Iterable[int] | None = None
        if check.needles:
            owners = _owners(lowered, starts, check.needles)
        if owners is None:
            target = dense if check.dense else joined
            if (check.gate is not None and not check.gate.search(target)) or not check.run(target):
                continue
            owners = range(len(texts))
        for position in owners:
            hits.setdefault(position, []).append(check.run)
    for position in sorted(hits):
        index, text = strings[position]
        for run in hits[position]:
            detector = run(text)
            if detector is not None:
                yield index, detector
                break


def _owners(lowered: str, starts: list[int], needles: tuple[str, ...]) -> set[int] | None:
    """Indices of the strings holding a needle, or None when there are too many hits."""
    owners: set[int] = set()
    budget = 32
    for needle in needles:
        pos = lowered.find(needle)
        while pos >= 0:
            budget -= 1
            if budget < 0:
                return None
            owners.add(bisect_right(starts, pos) - 1)
            pos = lowered.find(needle, pos + 1)
    return owners


def check_no_secrets(payload: object) -> None:
    """Raise SecretInPayload(path=..., detector=...) for the first finding: never the value."""
    for finding in find_secrets(payload):
        raise SecretInPayload(path=finding.path, detector=finding.detector)
