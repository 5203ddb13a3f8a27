"""outbox.protection.secrets: credentials are refused by key name and by value; benign data passes.

Run with -s to see the recall / false-positive figures and the time per call.
"""

from __future__ import annotations

import json
import time

import pytest

from outbox.errors import OutboxError, SecretInPayload
from outbox.protection.secrets import (
    SecretFinding,
    check_no_secrets,
    find_secrets,
    find_secrets_many,
)

from .secret_corpus import BENIGN_PAYLOADS, SECRET_CASES, SecretCase


def test_corpus_sizes() -> None:
    assert len({case.kind for case in SECRET_CASES}) >= 20
    assert len(BENIGN_PAYLOADS) >= 200


@pytest.mark.parametrize("case", SECRET_CASES, ids=lambda c: f"{c.kind}:{c.path}")
def test_secret_is_refused_at_its_path_without_echoing_it(case: SecretCase) -> None:
    assert find_secrets(case.payload)[0] == SecretFinding(case.path, case.detector)
    with pytest.raises(SecretInPayload) as caught:
        check_no_secrets(case.payload)
    error = caught.value
    assert isinstance(error, OutboxError)
    assert (error.path, error.detector) == (case.path, case.detector)  # type: ignore[attr-defined]
    for text in (str(error), repr(error), repr(error.args), repr(error.fields)):
        assert case.secret not in text


@pytest.mark.parametrize("index", range(len(BENIGN_PAYLOADS)))
def test_benign_payload_is_accepted(index: int) -> None:
    payload = BENIGN_PAYLOADS[index]
    assert find_secrets(payload) == [], json.dumps(payload, ensure_ascii=False)[:500]
    check_no_secrets(payload)


def test_recall_and_false_positive_rate() -> None:
    detected = sum(
        1
        for case in SECRET_CASES
        if SecretFinding(case.path, case.detector) in find_secrets(case.payload)
    )
    flagged = sum(1 for payload in BENIGN_PAYLOADS if find_secrets(payload))
    recall = detected / len(SECRET_CASES)
    fp_rate = flagged / len(BENIGN_PAYLOADS)
    kinds = len({case.kind for case in SECRET_CASES})
    print(
        f"\nsecrets: recall={recall:.3f} ({detected}/{len(SECRET_CASES)} cases, {kinds} kinds); "
        f"false positives={flagged}/{len(BENIGN_PAYLOADS)} (rate {fp_rate:.3f})"
    )
    assert recall == 1.0
    assert flagged == 0


def test_a_batch_scan_finds_what_one_scan_per_payload_finds() -> None:
    """The dispatcher scans a claimed batch at once: secrets and benign payloads mixed in
    one batch give each payload exactly its own findings (none leak to a neighbour)."""
    mixed: list[object] = []
    for n, case in enumerate(SECRET_CASES):
        mixed += [case.payload, BENIGN_PAYLOADS[n % len(BENIGN_PAYLOADS)]]
    mixed += BENIGN_PAYLOADS
    assert find_secrets_many(mixed) == [find_secrets(p) for p in mixed]
    for case, found in zip(SECRET_CASES, find_secrets_many(mixed)[::2], strict=False):
        assert found[0] == SecretFinding(case.path, case.detector)
    assert find_secrets_many([]) == []


def test_key_name_hit_at_depth_and_in_lists() -> None:
    payload = {
        "a": {"b": [{"c": 1}, {"d": [{"e": {"x-api-key": "zzz-123"}}]}]},
        "list": [[{"Password": "p4ss"}], {"ok": "fine"}, {"sessionToken": ["t0k3n-1"]}],
    }
    assert find_secrets(payload) == [
        SecretFinding('$.a.b[1].d[0].e["x-api-key"]', "key_name"),
        SecretFinding("$.list[0][0].Password", "key_name"),
        SecretFinding("$.list[2].sessionToken", "key_name"),
    ]
    with pytest.raises(SecretInPayload) as caught:
        check_no_secrets(payload)
    assert caught.value.path == '$.a.b[1].d[0].e["x-api-key"]'  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "PASSWORD",
        "Passwd",
        "newPassword",
        "password_confirmation",
        "apiKey",
        "API-KEY",
        "x_api_key",
        "XApiKey",
        "apikey",
        "client_secret",
        "clientSecret",
        "token",
        "access_token",
        "refreshToken",
        "id_token",
        "credentials",
        "private_key",
        "privateKey",
        "secret",
        "webhook_secret",
        "aws_secret_access_key",
        "session_cookie",
        "passphrase",
    ],
)
def test_credential_key_names(key: str) -> None:
    path = f"$.k.{key}" if key.replace("_", "a").isalnum() else f'$.k["{key}"]'
    assert find_secrets({"k": {key: "v4lue!"}}) == [SecretFinding(path, "key_name")]


@pytest.mark.parametrize(
    "key",
    [
        "token_count",
        "max_tokens",
        "prompt_tokens",
        "secret_santa_group",
        "password_policy",
        "password_changed_at",
        "private_key_id",
        "public_key",
        "idempotency_key",
        "partition_key",
        "next_page_token",
        "page_token",
        "token_type",
        "token_url",
        "secret_name",
        "credential_id",
        "cookie_consent",
        "authorization_id",
        "eos_token",
        "key",
        "monkey",
        "tokenizer",
    ],
)
def test_benign_key_names(key: str) -> None:
    assert find_secrets({key: "ops-berlin"}) == []


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        None,
        "",
        "   ",
        "********",
        "[REDACTED]",
        {},
        [],
        {"enabled": True},
        [None, False],
    ],
)
def test_credential_key_with_non_carrying_value_is_accepted(value: object) -> None:
    assert find_secrets({"password": value, "password_reset_required": value}) == []


def test_header_names_refused_only_with_string_values() -> None:
    assert find_secrets({"authorization": {"id": "auth_1", "amount": 100}}) == []
    assert find_secrets({"Authorization": "Token x1y2z3"}) == [
        SecretFinding("$.Authorization", "key_name")
    ]


def test_credential_used_as_a_key_is_refused_without_echoing_it() -> None:
    token = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5"
    payload = {"owners": {token: "alice"}}
    assert find_secrets(payload) == [SecretFinding("$.owners[<key 0>]", "github_token")]
    with pytest.raises(SecretInPayload) as caught:
        check_no_secrets(payload)
    assert token not in str(caught.value)


def test_non_json_scalars_and_empty_payloads() -> None:
    assert find_secrets({}) == []
    assert find_secrets([]) == []
    assert find_secrets({"n": 1, "f": 2.5, "b": True, "z": None, "t": (1, "ok")}) == []
    check_no_secrets({"a": [1, 2, 3]})


def test_time_per_call_on_a_typical_payload() -> None:
    payload = {"batch": BENIGN_PAYLOADS[:12]}
    size = len(json.dumps(payload, ensure_ascii=False).encode())
    for _ in range(20):
        find_secrets(payload)
    runs = 200
    start = time.perf_counter()
    for _ in range(runs):
        check_no_secrets(payload)
    per_call = (time.perf_counter() - start) / runs
    print(f"\nsecrets: {per_call * 1e6:.0f} µs per call on a {size / 1024:.1f} KiB benign payload")
    assert per_call < 0.02  # generous bound for slow CI machines; typical is far lower
