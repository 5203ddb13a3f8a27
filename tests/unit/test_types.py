"""``UtcDateTime`` binds a time for SQLite in one step: the same text SQLAlchemy's SQLite
``DATETIME`` writes after the type's own conversion to UTC, so stored times keep sorting
and comparing as text beside ``db_now()``'s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from outbox.types import UtcDateTime, sqlite_stored_time

DIALECT = sqlite.dialect()
offsets = st.one_of(
    st.none(),
    st.integers(min_value=-23 * 60, max_value=23 * 60).map(
        lambda m: timezone(timedelta(minutes=m))),
)
times = st.builds(
    lambda naive, tz: naive if tz is None else naive.replace(tzinfo=tz),
    st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 30)), offsets)


def sqlalchemy_text(value: datetime | None) -> str | None:
    """What the two steps wrote: the type's conversion, then SQLite ``DATETIME``'s."""
    converted = UtcDateTime().process_bind_param(value, DIALECT)
    process = sa.DateTime().dialect_impl(DIALECT).bind_processor(DIALECT)
    assert process is not None
    result: str | None = process(converted)
    return result


@settings(max_examples=500, deadline=None)
@given(times)
def test_one_step_writes_the_text_the_two_steps_wrote(value: datetime) -> None:
    assert sqlite_stored_time(value) == sqlalchemy_text(value)


def test_the_type_binds_through_the_one_step_for_sqlite_only() -> None:
    assert UtcDateTime().bind_processor(DIALECT) is sqlite_stored_time
    assert sqlite_stored_time(None) is None
    assert sqlite_stored_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == (
        "2026-01-02 03:04:05.000000")
    from sqlalchemy.dialects import postgresql
    assert UtcDateTime().bind_processor(postgresql.dialect()) is not sqlite_stored_time
