"""Recall over the published token formats, false positives over a benign set.

For every format of ``outbox.protection.token_formats`` the test generates tokens from the
format's declared parts (random characters of each part's alphabet, lengths across its
range, and a valid checksum where the issuer defines one), places them in payloads the way
agents write them (a field of its own, inside prose, in a query string, in a header line,
deep in a list), and runs the whole enqueue-time scan (``find_secrets``) over them.

``pytest -s`` prints the figures: formats, issuers, recall, and false positives over the
benign set (the corpus of tests/unit/secret_corpus.py plus identifiers, digests, UUIDs,
base64 images and prose below).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import uuid
import zlib

import pytest

from outbox.protection.secrets import find_secrets
from outbox.protection.token_formats import (
    BECH32,
    FORMATS,
    SCANNER,
    TokenFormat,
    bech32_valid,
    crc32_base62,
)
from tests.unit.secret_corpus import BENIGN_PAYLOADS

_rng = random.Random(20261206)
_B62_ORDER = string.digits + string.ascii_uppercase + string.ascii_lowercase


def _crc32_token(prefix: str) -> str:
    body = "".join(_rng.choice(string.ascii_letters + string.digits) for _ in range(30))
    value, check = zlib.crc32(body.encode()), ""
    while value:
        value, digit = divmod(value, 62)
        check = _B62_ORDER[digit] + check
    return prefix + body + check.rjust(6, "0")


def _bech32_token(fmt: TokenFormat) -> str:
    """Data characters, then the 6 checksum characters that make BIP 173's polymod 1."""
    hrp = "age-secret-key-"
    data = [_rng.randrange(32) for _ in range(52)]
    values = [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp] + data
    from outbox.protection.token_formats import _bech32_polymod

    polymod = _bech32_polymod([*values, 0, 0, 0, 0, 0, 0]) ^ 1
    check = [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]
    token = (hrp + "1" + "".join(BECH32[d] for d in data + check)).upper()
    assert bech32_valid(token)
    return token


def _json_token(fmt: TokenFormat, length: int) -> str:
    prefix = fmt.parts[0].text.removesuffix("eyJ")
    claims = {"iat": 1764979200, "region": "us", "key": "".join(
        _rng.choice(string.ascii_letters) for _ in range(length))}
    return prefix + base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")


def generate(fmt: TokenFormat, longest: bool = False) -> str:
    """One token of ``fmt``: each run at its shortest (or longest) length."""
    if fmt.checksum is crc32_base62:
        return _crc32_token(fmt.parts[0].text)
    if fmt.checksum is bech32_valid:
        return _bech32_token(fmt)
    if fmt.checksum is not None:  # JSON-bearing tokens
        low = fmt.parts[-1].low
        return _json_token(fmt, low if not longest else low + 40)
    out = []
    for part in fmt.parts:
        if not part.alphabet:
            out.append(part.text)
            continue
        size = part.high if longest else part.low
        chars = [_rng.choice(part.alphabet) for _ in range(size)]
        # Random text of a wide alphabet, like a real token: at least one digit and
        # letter where the alphabet has them (a run of letters only reads as a word).
        digits = [c for c in part.alphabet if c.isdigit()]
        if size >= 8 and digits:
            chars[_rng.randrange(size)] = _rng.choice(digits)
        out.append("".join(chars))
    return "".join(out)


CONTEXTS = (
    lambda t: {"ticket": {"title": "Rotate credentials", "value": t}},
    lambda t: {"note": f"Customer pasted their key {t} into the chat, please rotate it."},
    lambda t: {"callback": f"https://hooks.example.com/notify?id=42&token={t}&retry=1"},
    lambda t: {"headers": [{"line": f"X-Api-Key: {t}"}]},
    lambda t: {"items": [{"sku": "A-1"}, {"meta": {"log": [f"loaded config\n{t}\n"]}}]},
)


def test_every_format_has_a_distinct_issuer_and_at_least_one_hundred_are_covered() -> None:
    assert len(FORMATS) >= 100
    assert len({f.issuer for f in FORMATS}) == len(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.issuer)
def test_a_generated_token_is_named_by_its_format(fmt: TokenFormat) -> None:
    for longest in (False, True):
        token = generate(fmt, longest)
        assert fmt.expression().fullmatch(token), token
        names = {f.name for f, _ in SCANNER.matches(f"value: {token} ")}
        assert fmt.name in names


def test_recall_over_the_formats_in_payloads_is_complete() -> None:
    missed: list[str] = []
    cases = 0
    for fmt in FORMATS:
        for longest in (False, True):
            token = generate(fmt, longest)
            for context in CONTEXTS:
                cases += 1
                payload = context(token)
                findings = find_secrets(payload)
                if not findings:
                    missed.append(f"{fmt.issuer}: {json.dumps(payload)[:80]}")
                assert token not in str(findings)  # findings name a path, never the value
    recall = 1 - len(missed) / cases
    print(f"\ntoken formats: {len(FORMATS)} formats, {len({f.name for f in FORMATS})} "
          f"detector names, {cases} placed tokens, recall {recall:.4f} ({len(missed)} missed)")
    assert not missed, missed[:10]


def test_a_checksum_the_issuer_defines_is_checked() -> None:
    github = generate(FORMATS[0])
    tampered = github[:-1] + ("A" if github[-1] != "A" else "B")
    assert crc32_base62(github) and not crc32_base62(tampered)
    assert SCANNER.find(f"x {tampered} y") is None  # the format's own check refuses it
    age = next(f for f in FORMATS if f.checksum is bech32_valid)
    key = generate(age)
    assert bech32_valid(key) and not bech32_valid(key[:-1] + ("Q" if key[-1] != "Q" else "P"))


def _benign() -> list[object]:
    rng = random.Random(7)
    words = ("invoice", "refund", "customer", "shipment", "approved", "quarterly", "report")
    extra: list[object] = [
        {"sha1": hashlib.sha1(b"x").hexdigest(), "sha256": hashlib.sha256(b"y").hexdigest(),
         "md5": hashlib.md5(b"z", usedforsecurity=False).hexdigest()},
        {"ids": [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(20)]},
        {"image": "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 4).decode()},
        {"prose": " ".join(rng.choice(words) for _ in range(400))},
        {"identifiers": ["getUserAccountDetailsForCustomer2024", "Q3_2024_Revenue_Report_v2",
                         "order-2026-12-06-000123", "cus_Q3Xb2019", "pi_refund_partial",
                         "arn:aws:iam::123456789012:role/agent-dispatcher",
                         "projects/acme/locations/eu/queues/refunds",
                         "sk-learn model v1.2.3", "API-docs for the ticket API",
                         "the secret_santa_2026 list", "pat.tern matching",
                         "re_open_the_ticket_after_review", "SKU-77120-BLUE",
                         "dapi endpoints", "hf_hub download", "AKIA is an AWS prefix"]},
        {"git": [hashlib.sha1(str(i).encode()).hexdigest() for i in range(20)]},
        {"urls": ["https://docs.example.com/guides/tokens", "https://slack.com/help/articles",
                  "https://github.com/acme/agent/pull/1234/files"]},
    ]
    return [*BENIGN_PAYLOADS, *extra]


def test_no_false_positive_over_the_benign_set() -> None:
    benign = _benign()
    flagged = [(p, find_secrets(p)) for p in benign if find_secrets(p)]
    print(f"\ntoken formats: benign set of {len(benign)} payloads, "
          f"{len(flagged)} false positive(s)")
    assert flagged == []
