"""The JSON parameter of a batch: what PostgreSQL reads back from it is the rows as the
standard library would have written them, whichever encoder wrote it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.store.postgres import batch_json
from outbox import db

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
