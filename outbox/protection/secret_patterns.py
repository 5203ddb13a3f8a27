"""Credential values: the detectors run over every string in a payload (and long keys).

detect-secrets' regex plugins run first; our own patterns cover what detect-secrets 1.5 has
no detector for; then the published token formats (:mod:`.token_formats`: issuers'
prefixes, lengths and checksums); then a high-entropy check that skips hex digests, UUIDs
and human-made identifiers (see `_high_entropy`). :data:`VALUE_CHECKS` lists them in that
order, each with the hints (`Check`) that let a scan skip text it cannot match.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

from outbox.protection.token_formats import SCANNER as TOKEN_SCANNER

DENSE_MIN = 32
Run = Callable[[str], str | None]  # returns a detector name or None
_Valid = Callable[[re.Match[str]], bool]


@dataclass(frozen=True)
class Check:
    run: Run
    # Speed-ups that never change a result (this runs on every enqueue): `needles` are
    # lower-case substrings one of which any match must contain; `gate` a fast regex any
    # text with a match also matches; `min_word`: matches have no whitespace and are at
    # least that long, so the first pass may run over such words only (0: the whole text).
    needles: tuple[str, ...] = ()
    gate: re.Pattern[str] | None = None
    min_word: int = 0


def _plugin(
    where: str, name: str, *needles: str, min_word: int = 0, gate: str | None = None
) -> Check:
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

    return Check(run, needles, re.compile(gate) if gate else None, min_word)


_GH = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")
# Instantiated once at import; analysis is stateless.
_PLUGINS: list[Check] = [
    _plugin("private_key.PrivateKeyDetector", "private_key", "private key", "putty-user-key"),
    _plugin("jwt.JwtTokenDetector", "jwt", "eyj"),
    _plugin("aws.AWSKeyDetector", "aws_access_key", "a3t", "abia", "acca", "akia", "asia", "aws"),
    _plugin("azure_storage_key.AzureStorageKeyDetector", "azure_storage_key", "accountkey="),
    _plugin("github_token.GitHubTokenDetector", "github_token", *_GH),
    _plugin("gitlab_token.GitLabTokenDetector", "gitlab_token", "gl", "gr1348941"),
    _plugin("slack.SlackDetector", "slack_token", "xox", "hooks.slack.com"),
    _plugin("stripe.StripeDetector", "stripe_key", "k_live_"),
    _plugin("sendgrid.SendGridDetector", "sendgrid_key", "sg."),
    _plugin("twilio.TwilioKeyDetector", "twilio_key", min_word=DENSE_MIN),
    _plugin("npm.NpmDetector", "npm_token", "_authtoken="),
    _plugin("openai.OpenAIDetector", "openai_key", "t3blbkfj"),
    _plugin("pypi_token.PypiTokenDetector", "pypi_token", "pypi-age"),
    _plugin("discord.DiscordBotTokenDetector", "discord_token", min_word=DENSE_MIN),
    _plugin("mailchimp.MailchimpDetector", "mailchimp_key", "-us"),
    _plugin("square_oauth.SquareOAuthDetector", "square_oauth", "sq0csp-"),
    # "<8-10 digits>:<35>": a whitespace-free word of 44 characters or more
    _plugin("telegram_token.TelegramBotTokenDetector", "telegram_token", gate=r":[\w\-]{35}",
            min_word=DENSE_MIN),
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


def _regex(name: str, pattern: str, *needles: str, valid: _Valid | None = None) -> Check:
    compiled = re.compile(pattern)

    def run(text: str) -> str | None:
        hit = any(valid is None or valid(m) for m in compiled.finditer(text))
        return name if hit else None

    return Check(run, needles)


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
_OWN: list[Check] = [
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
            and not _in_data_uri(text, m.start())
            and _ENTROPY.calculate_shannon_entropy(run) > _ENTROPY_LIMIT
        ):
            return "high_entropy"
    return None


def _in_data_uri(text: str, pos: int) -> bool:
    """Is `pos` inside the base64 body of a ``data:<type>;base64,`` URI (an image, a file:
    content, not a credential)?"""
    start = text.rfind("data:", 0, pos)
    if start < 0:
        return False
    marker = text.find(";base64,", start, pos)
    return marker >= 0 and not any(c.isspace() or c in "\"'<>" for c in text[start:pos])


def _in_url_path(text: str, pos: int) -> bool:
    """Is `pos` inside the host/path part (not the query) of a URL?"""
    scheme = text.rfind("://", 0, pos)
    return scheme >= 0 and not any(c.isspace() or c in "?#\"'<>" for c in text[scheme:pos])


# The published formats of outbox.protection.token_formats: one automaton pass per batch.
_FORMATS = Check(TOKEN_SCANNER.find, min_word=TOKEN_SCANNER.shortest)

VALUE_CHECKS: list[Check] = [
    *_PLUGINS, *_OWN, _FORMATS, Check(_high_entropy, min_word=DENSE_MIN)]
MIN_LEN = 7  # the shortest pattern above ("://u:p@") needs 7 characters
