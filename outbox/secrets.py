"""Refuse payloads that carry credentials: credentials never enter a record.

`find_secrets` walks a JSON-like payload (dicts, lists, tuples, scalars) and reports
every place that looks like a credential, by JSON path and detector name, never by value.

Two kinds of check:

* Key names. A key is a credential key when, after splitting it into words (camelCase,
  ``-``, ``_``, spaces, digits) and dropping trailing neutral words (``value``, ``raw``,
  ``b64``, ``confirm``, ...), it *ends* with a credential noun: ``password``, ``passwd``,
  ``passphrase``, ``secret``, ``credential(s)``, ``token`` (except page/cursor/
  idempotency/tokenizer tokens), ``<api|access|private|secret|client|...>key``,
  ``authorization`` or ``cookie``. So ``apiKey``, ``X-API-KEY``, ``x_api_key``,
  ``client_secret`` and ``new_password`` are credential keys, but ``token_count``,
  ``max_tokens``, ``secret_santa_group``, ``password_reset_required``, ``private_key_id``,
  ``idempotency_key`` and ``next_page_token`` are not: a trailing qualifier makes the key
  *about* the credential, not the credential itself. A credential key is refused only if
  its value could carry one: a non-empty string that is not a mask (``"********"``,
  ``"[REDACTED]"``), a number, or a container holding such a string. ``true``/``false``,
  ``null`` and empty values are accepted. ``authorization``/``cookie`` (HTTP header
  names, also payment "authorizations") are refused only with a string value.
* String values (and long keys). detect-secrets' regex plugins run first; our own patterns
  cover what detect-secrets 1.5 has no detector for; then a high-entropy check that skips
  hex digests, UUIDs and human-made identifiers (see `_high_entropy`).
"""

from __future__ import annotations

import base64
import binascii
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate, pairwise
from typing import Any

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from outbox.errors import SecretInPayload

__all__ = ["SecretFinding", "check_no_secrets", "find_secrets"]


@dataclass(frozen=True)
class SecretFinding:
    """Where a credential-like item sits (a JSON path) and which detector saw it."""

    path: str  # e.g. "$.customer.api_key" or "$.items[2].note"
    detector: str  # e.g. "key_name", "aws_access_key", "jwt", "high_entropy"


# --------------------------------------------------------------------------- key names

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_NEUTRAL_SUFFIXES = frozenset(
    [
        "value",
        "val",
        "plain",
        "plaintext",
        "raw",
        "str",
        "string",
        "text",
        "b64",
        "base64",
        "hex",
        "enc",
        "encrypted",
        "hash",
        "hashed",
        "digest",
        "bytes",
        "data",
        "header",
        "confirm",
        "confirmation",
        "again",
        "repeat",
        "old",
        "new",
        "current",
    ]
)
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
    if isinstance(value, int | float):
        return True
    if isinstance(value, dict):
        return any(_carries(v, True) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_carries(v, True) for v in value)
    return False


# ------------------------------------------------------------------------ value checks

_Run = Callable[[str], str | None]  # returns a detector name or None


@dataclass(frozen=True)
class _Check:
    run: _Run
    # Cheap gate: the check can only fire if one of these (lower-case) substrings occurs in
    # the lower-cased text. Each is a necessary condition of the check's patterns, so the
    # gate never changes a result; it only skips regex scans (this runs on every enqueue).
    needles: tuple[str, ...] = ()
    gate: re.Pattern[str] | None = None  # alternatively, a fast regex that must match
    # Its matches have no whitespace and are >= _DENSE_MIN long: pre-run over such words only.
    dense: bool = False


_DENSE_MIN = 32


def _plugin(plugin: object, name: str, *needles: str) -> _Check:
    # RegexBasedDetector.analyze_string only runs its regexes: it reads no global settings
    # and makes no network calls (analyze_line would consult detect-secrets' settings).
    analyze: Callable[[str], Iterator[str]] = plugin.analyze_string  # type: ignore[attr-defined]

    def run(text: str) -> str | None:
        for match in analyze(text):
            if name == "slack_token" and match.lower().startswith("https://"):
                return "slack_webhook"
            return name
        return None

    return _Check(run, needles)


# Instantiated once at import; analysis is stateless.
_PLUGINS: list[_Check] = [
    # Gate: a ":" followed by the 35-character secret (literal-prefixed, so fast).
    _Check(
        _plugin(TelegramBotTokenDetector(), "telegram_token").run,
        gate=re.compile(r":[0-9A-Za-z_\-]{35}"),
        dense=True,
    ),
    _plugin(PrivateKeyDetector(), "private_key", "private key", "putty-user-key"),
    _plugin(JwtTokenDetector(), "jwt", "eyj"),
    _plugin(AWSKeyDetector(), "aws_access_key", "a3t", "abia", "acca", "akia", "asia", "aws"),
    _plugin(AzureStorageKeyDetector(), "azure_storage_key", "accountkey="),
    _plugin(GitHubTokenDetector(), "github_token", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    _plugin(GitLabTokenDetector(), "gitlab_token", "gl", "gr1348941"),
    _plugin(SlackDetector(), "slack_token", "xox", "hooks.slack.com"),
    _plugin(StripeDetector(), "stripe_key", "k_live_"),
    _plugin(SendGridDetector(), "sendgrid_key", "sg."),
    _Check(_plugin(TwilioKeyDetector(), "twilio_key").run, dense=True),
    _plugin(NpmDetector(), "npm_token", "_authtoken="),
    _plugin(OpenAIDetector(), "openai_key", "t3blbkfj"),
    _plugin(PypiTokenDetector(), "pypi_token", "pypi-age"),
    _Check(_plugin(DiscordBotTokenDetector(), "discord_token").run, dense=True),
    _plugin(MailchimpDetector(), "mailchimp_key", "-us"),
    _plugin(SquareOAuthDetector(), "square_oauth", "sq0csp-"),
    # These four match "<keyword> = <value>" assignments; we run them only when the
    # vendor is named (their keyword prefix is optional, and their regexes are the slowest;
    # a vendor-less "api_key=..." is covered by inline_credential below).
    _plugin(IbmCloudIamDetector(), "ibm_cloud_iam", "ibm"),
    _plugin(IbmCosHmacDetector(), "ibm_cos_hmac", "ibm", "cos"),
    _plugin(CloudantDetector(), "cloudant", "cloudant"),
    _plugin(SoftlayerDetector(), "softlayer", "softlayer", "sl_", "sl-"),
    _plugin(BasicAuthDetector(), "basic_auth_url", "://"),
    # Not used: ArtifactoryDetector (its "AP[0-9A-F]..." password pattern matches order
    # and product codes like "APB4471902233"; real Artifactory tokens are long and random,
    # so the entropy check catches them), KeywordDetector (code-oriented: "password: can
    # you reset it" in ticket prose would match), IPPublicDetector (not a credential),
    # HexHighEntropyString (flags every sha1/sha256 digest).
]


def _regex(name: str, pattern: str, *needles: str) -> _Check:
    compiled = re.compile(pattern)
    return _Check(lambda text: name if compiled.search(text) else None, needles)


# Our own patterns, only for what detect-secrets 1.5 has no detector for.
_OWN: list[_Check] = [
    # PEM variants missing from PrivateKeyDetector's list ("ENCRYPTED PRIVATE KEY").
    _regex("private_key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", "private key"),
    _regex("github_token", r"\bgithub_pat_[0-9A-Za-z_]{60,}", "github_pat_"),  # fine-grained
    _regex("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", "npm_"),  # detect-secrets: .npmrc only
    _regex(
        "stripe_key",
        r"\b(?:[sr]k_test_[0-9A-Za-z]{24,}|whsec_[A-Za-z0-9+/=]{24,})",
        "k_test_",
        "whsec_",
    ),
    _regex("anthropic_key", r"\bsk-ant-[a-z]+\d*-[A-Za-z0-9_\-]{32,}", "sk-ant-"),
    _regex("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{32,}", "sk-"),
    _regex("slack_token", r"\bxapp-\d-[A-Z0-9]+-\d+-[a-z0-9]{16,}", "xapp-"),  # app-level
    _regex(
        "discord_webhook", r"discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{20,}", "discord"
    ),
    _regex("gcp_api_key", r"\bAIza[0-9A-Za-z_\-]{35}", "aiza"),
    _regex(
        "gcp_oauth",
        r"\b(?:GOCSPX-[0-9A-Za-z_\-]{20,}|ya29\.[0-9A-Za-z_\-]{20,})",
        "gocspx-",
        "ya29.",
    ),
    _regex("azure_sas", r"[?&]sig=[A-Za-z0-9%+/=]{20,}", "sig="),
    _regex("huggingface_token", r"\bhf_[A-Za-z]{34}\b", "hf_"),
    _regex("bearer_token", r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{16,}=*", "bearer"),
]

_BASIC = re.compile(r"(?i)\bbasic\s+([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])")


def _basic_auth_header(text: str) -> str | None:
    """`Basic <base64>` whose base64 decodes to a printable "user:password"."""
    for m in _BASIC.finditer(text):
        encoded = m.group(1)
        try:
            plain = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
            decoded = plain.decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            continue
        if ":" in decoded and decoded.isprintable():
            return "basic_auth_header"
    return None


# "password=..." / "api_key: ..." inside text: connection strings, query strings, tickets.
_INLINE = re.compile(
    r"(?i)(?<![a-z0-9])(?:pass(?:word|wd)|pwd|secret|api[_-]?key|client[_-]?secret"
    r"|(?:access|refresh|auth|session)[_-]?token|(?<![a-z0-9_])token)"
    r"\s*[:=]\s*[\"']?([^\s\"';,&<>]{6,})"
)
_PLACEHOLDER = re.compile(r"[A-Z_]+|[a-z_]+|[*x•.]+|<[^>]*>|\{+[^}]*\}+|\$\{?\w+\}?|%\w+%?")
_NOT_A_WORD = re.compile(r"[0-9\W_]")


def _inline_credential(text: str) -> str | None:
    """The value must not be a placeholder ("YOUR_API_KEY", "<token>") or a plain word."""
    for m in _INLINE.finditer(text):
        value = m.group(1)
        if not _PLACEHOLDER.fullmatch(value) and _NOT_A_WORD.search(value):
            return "inline_credential"
    return None


_OWN += [
    _Check(_basic_auth_header, ("basic",)),
    _Check(_inline_credential, ("pass", "pwd", "secret", "api", "token")),
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


def _class_switches(run: str) -> int:
    classes = [
        "u" if c.isupper() else "l" if c.islower() else "d" if c.isdigit() else "o" for c in run
    ]
    return sum(a != b for a, b in pairwise(classes))


def _high_entropy(text: str) -> str | None:
    """Long random-looking base64/base62 tokens.

    A candidate is a run of >= 32 base64/base64url characters that is not only hex and
    dashes (sha1/sha256 digests, git SHAs, UUIDs), mixes upper case, lower case and
    digits, has a separator-free stretch of >= 16 characters (human-made identifiers like
    "Q3_2024_Revenue_Report_FINAL_v2" are short words joined by "_"/"-"/"/"), switches
    character class often (not camelCase words), and whose Shannon entropy (detect-secrets' calculation) exceeds 4.0 bits per character.
    Runs inside URL paths are skipped (document ids like Google Drive's live there;
    credential-bearing URLs are caught by the specific detectors above).
    """
    for m in _CANDIDATE.finditer(text):
        run = m.group(0).strip("=")
        if len(run) < 32 or _HEXISH.fullmatch(run):
            continue
        if not (any(c.isupper() for c in run) and any(c.islower() for c in run)):
            continue
        if not any(c.isdigit() for c in run):
            continue
        if max(len(s) for s in _SEPARATORS.split(run)) < _MIN_SEGMENT:
            continue
        if _class_switches(run) < _MIN_SWITCHES * (len(run) - 1):
            continue
        if _in_url_path(text, m.start()):
            continue
        if _ENTROPY.calculate_shannon_entropy(run) > _ENTROPY_LIMIT:
            return "high_entropy"
    return None


def _in_url_path(text: str, pos: int) -> bool:
    """Is `pos` inside the host/path part (not the query) of an http(s) URL?"""
    head = text[:pos]
    scheme = max(head.rfind("http://"), head.rfind("https://"))
    if scheme < 0:
        return False
    between = head[scheme:]
    return not any(c.isspace() or c in "?#\"'<>" for c in between)


_VALUE_CHECKS: list[_Check] = [*_PLUGINS, *_OWN, _Check(_high_entropy, dense=True)]
_MIN_LEN = 7  # the shortest pattern above ("://u:p@") needs 7 characters


# -------------------------------------------------------------------------------- walk

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A path is built lazily as a linked list (parent, segment); only findings are formatted.
# A segment is a dict key, a list index, or (index,) for a dict key that must not be shown.
_Path = tuple["_Path", "str | int | tuple[int]"] | None


def _format(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, segment = path
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif isinstance(segment, tuple):
            parts.append(f"[<key {segment[0]}>]")
        elif _IDENT.fullmatch(segment):
            parts.append(f".{segment}")
        else:
            parts.append('["' + segment.replace("\\", "\\\\").replace('"', '\\"') + '"]')
    return "$" + "".join(reversed(parts))


def find_secrets(payload: object) -> list[SecretFinding]:
    """Every credential-like item in `payload`, in document order; one finding per path."""
    items: list[tuple[_Path, str | None]] = []  # (path, string to scan | None: key_name hit)
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
    hits = {i: "key_name" for i, (_, text) in enumerate(items) if text is None}
    hits.update(_scan_strings([(i, text) for i, (_, text) in enumerate(items) if text is not None]))
    return [SecretFinding(_format(items[i][0]), hits[i]) for i in sorted(hits)]


def _scan_strings(strings: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(item index, detector) for each string that a check fires on (the first check wins)."""
    if not strings:
        return
    # Each check runs once over all strings joined by newlines (no pattern spans a newline)
    # or, when its needles occur only a few times, over just the strings holding them;
    # a check that fires is re-run string by string to find the path.
    texts = [text for _, text in strings]
    lowered_parts = [text.lower() for text in texts]
    starts = list(accumulate((len(part) + 1 for part in lowered_parts[:-1]), initial=0))
    joined, lowered = "\n".join(texts), "\n".join(lowered_parts)
    dense: str | None = None
    hits: dict[int, list[_Run]] = {}  # position in `strings` -> checks that fired there
    for check in _VALUE_CHECKS:
        owners = _owners(lowered, starts, check.needles) if check.needles else None
        if owners is None:
            if check.dense:
                if dense is None:  # whitespace-free words long enough to hold a match
                    dense = "\n".join(w for w in joined.split() if len(w) >= _DENSE_MIN)
                target = dense
            else:
                target = joined
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
    """Raise SecretInPayload(path=..., detector=...) for the first finding, if any.

    The message names the path and the detector only, never the value.
    """
    findings = find_secrets(payload)
    if findings:
        first = findings[0]
        raise SecretInPayload(path=first.path, detector=first.detector)
