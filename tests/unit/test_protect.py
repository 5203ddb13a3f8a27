"""Envelope encryption (outbox.protection.envelopes) and its configuration: tenant
separation, binding to the row, rotation, key loading that never echoes a key."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from dispatcher.config import load_config, protection_of
from outbox.errors import ConfigError
from outbox.protection import envelopes as protect
from outbox.protection.envelopes import (
    ENVELOPE_KEY,
    EnvelopeError,
    KeyRing,
    KeyUnavailable,
    Protection,
    envelope_key_id,
    generate_key,
)

BODY = {"subject": "Refund follow-up", "amount": 12.5, "lines": [1, 2, {"x": None}]}


def ring(active: str = "k1", **keys: bytes) -> KeyRing:
    return KeyRing(keys or {"k1": os.urandom(32)}, active)


def test_seal_then_open_round_trip() -> None:
    r = ring()
    env = r.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    assert set(env) == {ENVELOPE_KEY} and envelope_key_id(env) == "k1"
    assert "Refund" not in json.dumps(env)
    assert r.open(env, purpose="payload", tenant_id="A", operation_id="op-1") == BODY
    again = r.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    assert again != env  # a fresh nonce each time


def test_a_ciphertext_is_bound_to_its_tenant_operation_and_column() -> None:
    r = ring()
    env = r.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    for where in (
        {"purpose": "payload", "tenant_id": "B", "operation_id": "op-1"},
        {"purpose": "payload", "tenant_id": "A", "operation_id": "op-2"},
        {"purpose": "receipt", "tenant_id": "A", "operation_id": "op-1"},
    ):
        with pytest.raises(EnvelopeError) as info:
            r.open(env, **where)
        assert info.value.reason == protect.PAYLOAD_UNDECRYPTABLE


def _data_key(master: bytes, kid: str, tenant: str) -> bytes:
    """The derivation docs/security.md states, written out independently."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"outboxd/data-key/v1/" + kid.encode(),
                info=b"tenant\x00" + tenant.encode()).derive(master)


def test_one_tenants_data_key_opens_no_other_tenants_rows() -> None:
    master = os.urandom(32)
    r = KeyRing({"k1": master}, "k1")
    env = r.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")[ENVELOPE_KEY]
    nonce, ct = base64.b64decode(env["nonce"]), base64.b64decode(env["ct"])
    aad = b"outboxd/v1\n" + json.dumps(["payload", "A", "op-1", "k1"]).encode()
    assert json.loads(AESGCM(_data_key(master, "k1", "A")).decrypt(nonce, ct, aad)) == BODY
    key_b = _data_key(master, "k1", "B")
    assert key_b != _data_key(master, "k1", "A")
    with pytest.raises(InvalidTag):  # even with A's associated data
        AESGCM(key_b).decrypt(nonce, ct, aad)


def test_rotation_keeps_old_envelopes_readable() -> None:
    k1, k2 = os.urandom(32), os.urandom(32)
    before = KeyRing({"k1": k1}, "k1")
    old = before.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    after = KeyRing({"k1": k1, "k2": k2}, "k2")
    new = after.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-2")
    assert envelope_key_id(old) == "k1" and envelope_key_id(new) == "k2"
    assert after.open(old, purpose="payload", tenant_id="A", operation_id="op-1") == BODY
    assert after.open(new, purpose="payload", tenant_id="A", operation_id="op-2") == BODY
    retired = KeyRing({"k2": k2}, "k2")  # k1 dropped too early
    with pytest.raises(KeyUnavailable) as info:
        retired.open(old, purpose="payload", tenant_id="A", operation_id="op-1")
    assert info.value.reason == protect.PAYLOAD_KEY_UNAVAILABLE


def test_tampered_or_malformed_envelopes_are_refused() -> None:
    r = ring()
    env = r.seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    inner = dict(env[ENVELOPE_KEY])
    ct = bytearray(base64.b64decode(inner["ct"]))
    ct[0] ^= 1
    for bad in ({**inner, "ct": base64.b64encode(bytes(ct)).decode()}, {**inner, "v": 2},
                {**inner, "nonce": "!!"}, {**inner, "kid": 7}):
        with pytest.raises(EnvelopeError):
            r.open({ENVELOPE_KEY: bad}, purpose="payload", tenant_id="A", operation_id="op-1")


def test_plaintext_passes_and_an_envelope_without_a_ring_is_unavailable() -> None:
    class Row:
        tenant_id, operation_id, provider = "A", "op-1", "p"
        payload: object = BODY
        receipt: object = None

    row = Row()
    assert protect.open_payload(None, row) is BODY  # a plain-SQL row
    row.payload = ring().seal(BODY, purpose="payload", tenant_id="A", operation_id="op-1")
    with pytest.raises(KeyUnavailable):
        protect.open_payload(None, row)
    prot = Protection(ring(), frozenset({"p"}))
    receipt = {"id": "effect-1"}
    sealed = protect.seal_receipt(prot, row, receipt)
    assert sealed is not receipt and envelope_key_id(sealed) == "k1"
    row.receipt = sealed
    assert prot.open_receipt(row) == receipt
    row.provider = "other"  # not protected: unchanged, the same object
    assert protect.seal_receipt(prot, row, receipt) is receipt


def test_key_references_resolve_and_never_echo_the_key(tmp_path: Path) -> None:
    good = generate_key()
    key_file = tmp_path / "kek"
    key_file.write_text(good + "\n")
    r = KeyRing.from_references({"a": "env:KEK_A", "b": f"file:{key_file}"}, "b",
                                {"KEK_A": good})
    assert r.key_ids == {"a", "b"} and r.active == "b"
    assert good not in repr(r)
    short = base64.b64encode(b"x" * 16).decode()
    for refs, env, words in (
        ({"a": "env:MISSING"}, {}, "not set"),
        ({"a": "env:KEK_A"}, {"KEK_A": short}, "32 random bytes"),
        ({"a": "env:KEK_A"}, {"KEK_A": "not base64 at all!"}, "32 random bytes"),
        ({"a": good}, {}, "literal"),
    ):
        with pytest.raises(ConfigError) as info:
            KeyRing.from_references(refs, "a", env)
        message = str(info.value)
        assert words in message and good not in message and short not in message
        assert "not base64" not in message
    with pytest.raises(ConfigError, match="active_key"):
        KeyRing({"a": os.urandom(32)}, "b")


PROTECTED = """
[providers.tickets]
kind = "http"
url = "http://127.0.0.1:8080/tickets"
protect_payloads = true

[providers.plain]
kind = "null"
"""


def test_config_protection_section_and_provider_switch(tmp_path: Path) -> None:
    key = generate_key()
    cfg = load_config(_write(tmp_path, PROTECTED + """
[protection]
active_key = "2026-01"
keys = { "2025-07" = "env:OLD_KEK", "2026-01" = "env:NEW_KEK" }
"""), {})
    assert cfg.protection.active_key == "2026-01"
    assert dict(cfg.protection.keys) == {"2025-07": "env:OLD_KEK", "2026-01": "env:NEW_KEK"}
    assert cfg.protected_providers() == {"tickets"}
    prot = protection_of(cfg, {"OLD_KEK": generate_key(), "NEW_KEK": key})
    assert prot is not None and prot.ring.key_ids == {"2025-07", "2026-01"}
    assert prot.protects("tickets") and not prot.protects("plain")
    with pytest.raises(ConfigError, match=r"protection\.keys\.2025-07.*not set"):
        protection_of(cfg, {"NEW_KEK": key})
    # the environment rotates without editing the file
    env_cfg = load_config(_write(tmp_path, PROTECTED), {
        "OUTBOXD_PROTECTION_KEYS": '{"k9": "file:/run/secrets/k9"}',
        "OUTBOXD_PROTECTION_ACTIVE_KEY": "k9",
        "OUTBOXD_PROVIDERS_PLAIN_PROTECT_PAYLOADS": "true"})
    assert env_cfg.protection.active_key == "k9"
    assert env_cfg.protected_providers() == {"tickets", "plain"}
    assert protection_of(load_config(None, {}, search_default=False)) is None


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "outboxd.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "env", "key"), [
    ('[protection]\nactive_key = "b"\nkeys = { a = "env:A" }\n', {}, "protection.active_key"),
    ('[protection]\nkeys = { a = "env:A" }\n', {}, "protection.active_key"),
    ('[protection]\nactive_key = "a"\nkeys = { a = "c2VjcmV0LWtleS1tYXRlcmlhbA==" }\n', {},
     "protection.keys"),
    ('[protection]\nactive_key = "a"\nkeys = { a = 5 }\n', {}, "protection.keys"),
    ('[protection]\nactive_key = "a"\nkeys = { "a b" = "env:A" }\n', {}, "protection.keys"),
    ("", {"OUTBOXD_PROTECTION_KEYS": "c2VjcmV0LWtleS1tYXRlcmlhbA=="}, "protection.keys"),
    ('[providers.t]\nkind = "null"\nprotect_payloads = true\n', {},
     "providers.t.protect_payloads"),
    ('[providers.t]\nkind = "null"\nprotect_payloads = "yes"\n', {},
     "providers.t.protect_payloads"),
])
def test_config_protection_errors_name_the_key_and_never_the_value(
    tmp_path: Path, text: str, env: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), env)
    assert info.value.key == key  # type: ignore[attr-defined]
    assert "c2VjcmV0" not in str(info.value)


def test_protect_payloads_is_not_a_provider_option() -> None:
    from providers.registry import build_provider

    provider = build_provider("n", {"kind": "null", "protect_payloads": True})
    assert provider.name == "n"
