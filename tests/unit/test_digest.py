"""outbox.digest: the canonical digest does not depend on key order or on which dialect
stored the payload; different payloads get different digests.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Engine

from outbox import api, errors
from outbox.digest import (
    DIGEST_PREFIX,
    canonical_json,
    default_idempotency_key,
    payload_digest,
)
from outbox.protection.secrets import find_secrets

MAX_SAFE = 2**53 - 1
FAST = settings(max_examples=40, deadline=None)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=15,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=6)

# What both databases store and hand back unchanged (see validation._unportable): no NUL, no
# integral float beyond 2**53.
storable_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
storable_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE, max_value=MAX_SAFE)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f.is_integer() and abs(f) > MAX_SAFE)
    )
    | st.text(storable_chars, max_size=20)
)
storable_keys = st.text(storable_chars, max_size=10)
storable_objects = st.dictionaries(
    storable_keys,
    st.recursive(
        storable_scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(storable_keys, children, max_size=4)
        ),
        max_leaves=20,
    ),
    max_size=6,
).filter(lambda p: not find_secrets(p))  # credentials are refused, rightly


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: shuffled(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@FAST
@given(json_objects, st.randoms(use_true_random=False))
def test_digest_ignores_key_order_at_every_depth(
    payload: dict[str, Any], rnd: random.Random
) -> None:
    other = shuffled(payload, rnd)
    assert other == payload
    assert canonical_json(other) == canonical_json(payload)
    assert payload_digest(other) == payload_digest(payload)


@FAST
@given(json_objects, json_objects)
def test_different_payloads_get_different_digests(a: dict[str, Any], b: dict[str, Any]) -> None:
    assume(canonical_json(a) != canonical_json(b))
    assert payload_digest(a) != payload_digest(b)


@FAST
@given(json_objects, st.data())
def test_changing_one_leaf_changes_the_digest(payload: dict[str, Any], data: st.DataObject) -> None:
    key = data.draw(st.text(max_size=10))
    changed = {**payload, key: ["changed", payload.get(key)]}
    assert payload_digest(changed) != payload_digest(payload)


@FAST
@given(json_objects)
def test_digest_form(payload: dict[str, Any]) -> None:
    digest = payload_digest(payload)
    assert digest.startswith(DIGEST_PREFIX)
    assert digest == DIGEST_PREFIX + hashlib.sha256(canonical_json(payload)).hexdigest()
    assert len(digest) == len(DIGEST_PREFIX) + 64


# Everything JSON can hold and some it cannot: any character (lone surrogates included),
# keys above U+E000 and beyond the BMP (UTF-16 order differs there), floats, integers just
# inside and outside the exact domain, non-string keys, a tuple, a str subclass.
edge_ints = st.sampled_from([MAX_SAFE, -MAX_SAFE, MAX_SAFE + 1, -MAX_SAFE - 1, 0, 2**64])
any_scalars = (st.none() | st.booleans() | st.integers() | edge_ints | st.floats()
               | st.text(st.characters(), max_size=12))
any_keys = (st.text(st.characters(), max_size=6)
            | st.sampled_from(["\ue000", "\uffff", "\U0001f600", "\U00010000a", "a\ud800"])
            | st.integers(max_value=9))
any_values = st.recursive(
    any_scalars,
    lambda children: (st.lists(children, max_size=4)
                      | st.tuples(children)
                      | st.dictionaries(any_keys, children, max_size=5)),
    max_leaves=20,
)


def _rfc8785_or_error(value: Any) -> bytes | type[Exception]:
    try:
        return bytes(rfc8785.dumps(value))
    except Exception as exc:
        return type(exc)


def _ours_or_error(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except Exception as exc:
        return type(exc)


@settings(max_examples=1500, deadline=None)
@given(any_values)
def test_canonical_json_is_the_rfc8785_librarys_bytes_or_its_error(value: Any) -> None:
    """The fast paths (orjson, then the C encoder, for float-free values) write what
    ``rfc8785`` writes, and refuse what it refuses with the same error."""
    assert _ours_or_error(value) == _rfc8785_or_error(value)


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


def test_canonical_json_edge_cases_agree_with_rfc8785() -> None:
    class Name(str):
        pass

    cases: list[Any] = [
        {"\ue000": 1, "\U0001f600": 2, "a": 3},  # UTF-16 order differs from code points
        {"ctl": "\x00\x1f\x7f\u2028\u2029\b\f\n\r\t\"\\/"},
        {"big": MAX_SAFE, "small": -MAX_SAFE}, {"big": MAX_SAFE + 1}, {"f": 1.0, "g": 1e21},
        {"lone": "\ud800"}, {Name("k"): Name("v")}, {"t": (1, 2)}, {1: 2}, [], {}, "s", None,
        {"every_control": "".join(map(chr, range(0x20)))},
        {"deep": _nested(300)},  # past orjson's nesting limit: the C encoder's path
        {"deep": _nested(300), "lone": "\udfff"},
    ]
    for value in cases:
        assert _ours_or_error(value) == _rfc8785_or_error(value), value


def test_known_vector() -> None:
    """RFC 8785: sorted keys, no whitespace, shortest numbers; pinned so it never drifts."""
    payload = {"b": [True, None, 1.0, "é"], "a": {"z": 1e21, "y": -0.0}}
    assert canonical_json(payload) == '{"a":{"y":0,"z":1e+21},"b":[true,null,1,"é"]}'.encode()
    assert (
        payload_digest(payload)
        == DIGEST_PREFIX
        + hashlib.sha256('{"a":{"y":0,"z":1e+21},"b":[true,null,1,"é"]}'.encode()).hexdigest()
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"a": 1}, {"a": "1"}),
        ({"a": [1, 2]}, {"a": [2, 1]}),
        ({"a": None}, {}),
        ({"a": True}, {"a": 1}),
        ({"a": {"b": 1}}, {"a.b": 1}),
    ],
)
def test_semantically_different_payloads_differ(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert payload_digest(a) != payload_digest(b)


def test_same_number_written_differently_is_the_same_payload() -> None:
    assert payload_digest({"n": 1}) == payload_digest({"n": 1.0})


def test_default_idempotency_key() -> None:
    assert default_idempotency_key("acme", "ticket:create:case-8472") == (
        "acme:ticket:create:case-8472"
    )


# --------------------------------------------------------------------- through each dialect


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=storable_objects)
def test_digest_of_the_payload_read_back_equals_the_one_computed_before_insert(
    engine: Engine, payload: dict[str, Any]
) -> None:
    """jsonb reorders keys and rewrites numbers; the canonical digest does not change."""
    before = payload_digest(payload)
    operation_id = f"op-{uuid.uuid4().hex}"
    with engine.begin() as conn:
        staged = api.enqueue(
            conn,
            tenant_id="t",
            task_id="k",
            operation_id=operation_id,
            provider="p",
            payload=payload,
        )
    assert staged.payload_digest == before
    with engine.connect() as conn:
        read = api.get_operation(conn, tenant_id="t", operation_id=operation_id)
    assert read.payload == payload
    assert payload_digest(read.payload) == before
    assert read.payload_digest == before


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"amount": 1e16}, "$.amount"),
        ({"a": [1, {"b": -1e300}]}, "$.a[1].b"),
        ({"note": "nul\x00byte"}, "$.note"),
        ({"n": float(2**53)}, "$.n"),
    ],
)
def test_values_a_dialect_cannot_return_unchanged_are_refused_on_both(
    engine: Engine, payload: dict[str, Any], path: str
) -> None:
    with engine.begin() as conn, pytest.raises(errors.InvalidPayload) as caught:
        api.enqueue(
            conn, tenant_id="t", task_id="k", operation_id="x", provider="p", payload=payload
        )
    assert caught.value.path == path  # type: ignore[attr-defined]


def test_large_non_integral_and_safe_integral_floats_are_accepted(engine: Engine) -> None:
    payload = {"a": 12345.678, "b": float(2**53 - 1), "c": 1e-300, "d": 0.1 + 0.2}
    with engine.begin() as conn:
        api.enqueue(
            conn, tenant_id="t", task_id="k", operation_id="f", provider="p", payload=payload
        )
    with engine.connect() as conn:
        read = api.get_operation(conn, tenant_id="t", operation_id="f")
    assert payload_digest(read.payload) == payload_digest(payload)
