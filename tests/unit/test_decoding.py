"""outbox.decoding: a stored JSON value decodes, or says why not, never raises."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox import decoding
from outbox.decoding import (
    MAX_JSON_DEPTH,
    NotUtf8,
    Undecodable,
    decode_json,
    json_depth_over,
    parse_time,
    sqlite_text,
)
from outbox.records import OPERATION_FIELDS, OperationRecord


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"a": ' + _nested(5000) + "}", "nested deeper"),
        ('{"a": ' + _nested(MAX_JSON_DEPTH) + "}", "nested deeper"),
        ('{"n": ' + "9" * 5000 + "}", "more digits"),
        ('{"s": "\\ud800"}', "lone UTF-16 surrogate"),
        ('{"s": "\\udfff x"}', "lone UTF-16 surrogate"),
        (b'{"s": "caf\xff"}', "not valid UTF-8"),
        (sqlite_text(b'{"s": "caf\xff"}'), "not valid UTF-8"),
        ("{not json", "not valid JSON"),
    ],
)
def test_what_cannot_be_decoded_says_why_and_not_what(raw: str | bytes, why: str) -> None:
    value = decode_json(raw, "payload")
    assert isinstance(value, Undecodable)
    assert why in value.why
    assert value.describe().startswith("payload: ")
    assert "999" not in value.describe() and "caf" not in value.describe()


def test_the_deepest_accepted_payload_decodes() -> None:
    raw = '{"a": ' + _nested(MAX_JSON_DEPTH - 1) + "}"
    assert not isinstance(decode_json(raw, "payload"), Undecodable)
    assert json_depth_over(json.loads(raw), MAX_JSON_DEPTH - 1)


def test_a_surrogate_pair_is_one_character_not_a_lone_surrogate() -> None:
    assert decode_json('{"s": "\\ud83d\\ude00"}', "payload") == {"s": "\U0001f600"}


def test_sqlite_text_marks_bytes_that_are_not_utf8() -> None:
    assert type(sqlite_text("café".encode())) is str
    assert isinstance(sqlite_text(b"caf\xff"), NotUtf8)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
))
def test_anything_python_wrote_decodes_to_itself(value: object) -> None:
    raw = json.dumps(value)
    decoded = decode_json(raw, "payload")
    if isinstance(decoded, Undecodable):  # only lone surrogates from st.text()
        assert "surrogate" in decoded.why
    else:
        assert decoded == value


_ANY_NUMBER_OR_TEXT = (
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.integers(min_value=10**17, max_value=10**21).flatmap(lambda n: st.sampled_from([n, -n]))
    | st.text(st.characters(), max_size=8)
)


@settings(max_examples=800, deadline=None)
@given(value=st.recursive(
    _ANY_NUMBER_OR_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                  max_size=4),
    max_leaves=30,
), ascii_only=st.booleans())
def test_the_fast_decoder_reads_what_the_standard_library_reads(
    value: object, ascii_only: bool
) -> None:
    """orjson reads a text the regex lets through as ``json.loads`` reads it, to the type
    (an integer of 19 digits or more, a float, NaN: the standard library's path), and what
    orjson refuses gets the standard library's reason."""
    raw = json.dumps(value, ensure_ascii=ascii_only)
    decoded = decode_json(raw, "payload")
    try:
        expected = json.loads(raw)
    except ValueError:
        assert isinstance(decoded, Undecodable)
        return
    if isinstance(decoded, Undecodable):  # only lone surrogates from st.text()
        assert "surrogate" in decoded.why
    else:
        assert repr(decoded) == repr(expected)


_JSON_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                  max_size=3),
    max_leaves=8,
).map(json.dumps) | st.text(max_size=8)  # and text that is not JSON at all


@given(payload=_JSON_TEXT, receipt=st.none() | _JSON_TEXT,
       when=st.datetimes(timezones=st.just(UTC)), text=st.text(max_size=8))
def test_a_typed_row_reads_as_the_generic_path_reads_it(
    payload: str, receipt: str | None, when: datetime, text: str
) -> None:
    """PostgreSQL's rows (timestamps typed, text valid UTF-8) skip the SQLite-only checks:
    the record is the same, an undecodable payload or receipt included."""
    values: dict[str, object] = dict.fromkeys(OPERATION_FIELDS)
    values.update(id=1, tenant_id=text, task_id="t", operation_id="o", provider="p",
                  payload=payload, receipt=receipt, requires_approval=0, status="claimed",
                  attempts=0, state_revision=0, created_at=when, updated_at=when,
                  lease_expires_at=when, idempotency_key=text)
    row = tuple(values[name] for name in OPERATION_FIELDS)
    assert OperationRecord.from_raw_values(row, typed=True) == OperationRecord.from_raw_values(row)


@given(when=st.datetimes(timezones=st.sampled_from([UTC, None])),
       sep=st.sampled_from([" ", "T"]), zulu=st.booleans())
def test_a_timestamp_parsed_again_is_the_same_instant(
    when: datetime, sep: str, zulu: bool
) -> None:
    """SQLite's stored text, parsed twice (the second time from the kept parses), reads as
    the same aware UTC instant as the standard library's reading of it."""
    text = when.replace(tzinfo=None).isoformat(sep) + ("Z" if zulu else "")
    expected = datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=UTC)
    assert parse_time(text, "created_at") == expected
    again = parse_time(text, "created_at")
    assert again == expected and again.tzinfo is UTC


def test_kept_parses_never_answer_for_bytes_that_are_not_utf8() -> None:
    """A NotUtf8 equals the str of the same characters: it is still refused, after that
    str was parsed and kept."""
    text = "2026-12-07 15:59:28.123456"
    assert isinstance(parse_time(text, "updated_at"), datetime)
    refused = parse_time(NotUtf8(text), "updated_at")
    assert isinstance(refused, Undecodable) and refused.column == "updated_at"


def test_kept_parses_are_bounded() -> None:
    for second in range(decoding.PARSED_TIMES_KEPT + 10):
        parse_time(f"2026-12-07 00:{second // 60 % 60:02d}:{second % 60:02d}.{second:06d}", "t")
    assert len(decoding._PARSED_TIMES) <= decoding.PARSED_TIMES_KEPT


def test_a_row_with_text_that_is_not_utf8_names_its_column() -> None:
    values: dict[str, object] = dict.fromkeys(OPERATION_FIELDS)
    values.update(id=1, tenant_id="t", task_id=NotUtf8("t\udcff"), operation_id="o",
                  provider="p", payload="{}", requires_approval=0, status="claimed",
                  attempts=0, state_revision=0, created_at="2026-12-07 00:00:00",
                  updated_at="2026-12-07 00:00:00")
    record = OperationRecord.from_raw_values(tuple(values[n] for n in OPERATION_FIELDS))
    assert isinstance(record.payload, Undecodable)
    assert record.payload.column == "task_id"
