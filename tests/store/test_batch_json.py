"""The JSON parameter of a batch: what PostgreSQL reads back from it is the rows as the
standard library would have written them, whichever encoder wrote it; a SQLite JSON
column in an executemany stores the value SQLAlchemy's own processor would."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from dispatcher.store import direct
from dispatcher.store.postgres import batch_json
from outbox import db, schema

NOW = datetime(2026, 12, 6, 12, 50, 53, 66719, tzinfo=UTC)


def rows() -> list[dict[str, Any]]:
    return [
        {"id": 1, "rev": 3, "status": "applied", "receipt": {"id": "r-1", "n": 2.5},
         "a_started_at": NOW, "a_finished_at": NOW.astimezone(timezone(timedelta(hours=-5))),
         "a_evidence": {"reason": "ok", "list": [1, "ü", None, True]}, "detail": None},
        {"id": 2, "rev": 1, "status": "retry", "receipt": None, "a_started_at": NOW,
         "a_finished_at": NOW, "a_evidence": {7: "a key that is not a string"}, "detail": None},
    ]


def read_back(pg_url: str, text: str) -> list[tuple[Any, ...]]:
    engine = db.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(
                "SELECT id, rev, status, receipt, a_started_at, a_finished_at, a_evidence,"
                " detail FROM jsonb_to_recordset(CAST(:t AS jsonb)) AS r(id bigint,"
                " rev bigint, status text, receipt jsonb, a_started_at timestamptz,"
                " a_finished_at timestamptz, a_evidence jsonb, detail jsonb) ORDER BY id"),
                {"t": text})]
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_reads_the_rows_the_standard_library_would_have_written(pg_url: str) -> None:
    assert read_back(pg_url, batch_json(rows())) == read_back(
        pg_url, json.dumps(rows(), default=str))


def test_an_integer_beyond_64_bits_falls_back_to_the_standard_library() -> None:
    big = [{"id": 1, "receipt": {"n": 2**70}, "at": NOW}]
    assert json.loads(batch_json(big)) == json.loads(json.dumps(big, default=str))


def test_timestamps_are_iso_8601_with_their_offset() -> None:
    assert json.loads(batch_json([{"at": NOW}])) == [{"at": "2026-12-06T12:50:53.066719+00:00"}]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_a_sqlite_json_column_binds_the_value_sqlalchemy_would(value: Any) -> None:
    """The executemany's JSON processor on SQLite (orjson's compact text) stores the
    value SQLAlchemy's processor stores, ``None`` as the JSON null it stores."""
    dialect = sqlite.dialect()
    ours = direct._json_column(schema.attempts.c.evidence.type, dialect)
    theirs = schema.attempts.c.evidence.type.dialect_impl(dialect).bind_processor(dialect)
    assert ours is not None and theirs is not None
    assert json.loads(ours(value)) == json.loads(theirs(value))


def test_sql_null_and_json_null_bind_as_sqlalchemy_binds_them() -> None:
    dialect = sqlite.dialect()
    column_type = schema.attempts.c.evidence.type
    ours = direct._json_column(column_type, dialect)
    theirs = column_type.dialect_impl(dialect).bind_processor(dialect)
    assert ours is not None and theirs is not None
    for value in (None, sa.JSON.NULL, sa.null()):
        assert ours(value) == theirs(value)
    assert direct._json_column(schema.attempts.c.worker.type, dialect) is None


nul_texts = st.text(alphabet=st.sampled_from(["a", "\x00", "\\", "u", "0", "é"]), max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(nul_texts, st.lists(nul_texts, max_size=3) | nul_texts, max_size=4))
def test_nul_characters_become_the_replacement_character_and_nothing_else_moves(
    receipt: dict[str, Any]
) -> None:
    """PostgreSQL's ``jsonb`` holds no U+0000 (it refuses the whole parameter): each NUL of
    a key or a value becomes U+FFFD; a backslash followed by ``u0000`` is text, kept."""
    def swapped(v: Any) -> Any:
        if isinstance(v, str):
            return v.replace("\x00", "\ufffd")
        if isinstance(v, dict):
            return {swapped(k): swapped(x) for k, x in v.items()}
        return [swapped(x) for x in v]

    text = batch_json([{"id": 1, "receipt": receipt}])
    assert "\\u0000" not in text.replace("\\\\", "")
    assert json.loads(text) == [{"id": 1, "receipt": swapped(receipt)}]


@pytest.mark.postgres
def test_postgres_reads_a_batch_whose_strings_hold_nul_characters(pg_url: str) -> None:
    batch = [{"id": 1, "rev": 1, "status": "applied\x00", "receipt": {"k\x00": "v\x00"},
              "a_started_at": NOW, "a_finished_at": NOW, "a_evidence": ["\x00"], "detail": None}]
    (row,) = read_back(pg_url, batch_json(batch))
    assert (row[2], row[3], row[6]) == ("applied\ufffd", {"k\ufffd": "v\ufffd"}, ["\ufffd"])
