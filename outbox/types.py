"""Column types and database-clock expressions that compile for SQLite and PostgreSQL.

Timestamps are UTC everywhere. PostgreSQL stores ``timestamptz``; SQLite stores text in
SQLAlchemy's default ``YYYY-MM-DD HH:MM:SS.ffffff`` form, which sorts and compares
correctly as text and is exactly what :class:`db_now` produces, so the database clock can
be used in SQL on both dialects.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f000', 'now')"
"""SQLite's clock in the stored text form (millisecond resolution, microsecond digits)."""


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on both dialects."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        """SQLite: :func:`sqlite_stored_time` in one step, instead of :meth:`process_bind_param`
        and then SQLAlchemy's SQLite ``DATETIME`` formatting (the same text, a third of
        the time: two of every attempt row's values are times)."""
        if dialect.name == "sqlite":
            return sqlite_stored_time
        return super().bind_processor(dialect)

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # a plain-SQL insert into SQLite with another text form
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


def sqlite_stored_time(value: datetime | None) -> str | None:
    """``value`` as SQLite stores it: UTC (a naive value is taken as UTC) in the form
    ``YYYY-MM-DD HH:MM:SS.ffffff``, the text SQLAlchemy's SQLite ``DATETIME`` writes."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds")


class db_now(FunctionElement[datetime]):
    """The database's clock (statement time), plus an optional offset in seconds.

    ``db_now()`` or ``db_now(offset_seconds_expression)``. Leases, deadlines and retry times
    are measured on this clock, never on a worker's.
    """

    type = UtcDateTime()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    args = list(element.clauses)
    if not args:
        return SQLITE_NOW
    offset = compiler.process(args[0], **kw)
    return (
        "strftime('%Y-%m-%d %H:%M:%f000', 'now', "
        f"printf('%+.6f seconds', CAST({offset} AS REAL)))"
    )


@compiles(db_now, "postgresql")
def _db_now_pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    args = list(element.clauses)
    if not args:
        return "statement_timestamp()"
    offset = compiler.process(args[0], **kw)
    return f"(statement_timestamp() + make_interval(secs => CAST({offset} AS double precision)))"


class add_seconds(FunctionElement[datetime]):
    """``timestamp_column + seconds`` on both dialects."""

    type = UtcDateTime()
    inherit_cache = True
    name = "add_seconds"


@compiles(add_seconds, "sqlite")
def _add_seconds_sqlite(element: add_seconds, compiler: SQLCompiler, **kw: Any) -> str:
    ts, secs = (compiler.process(c, **kw) for c in element.clauses)
    return (
        f"strftime('%Y-%m-%d %H:%M:%f000', {ts}, "
        f"printf('%+.6f seconds', CAST({secs} AS REAL)))"
    )


@compiles(add_seconds, "postgresql")
def _add_seconds_pg(element: add_seconds, compiler: SQLCompiler, **kw: Any) -> str:
    ts, secs = (compiler.process(c, **kw) for c in element.clauses)
    return f"({ts} + make_interval(secs => CAST({secs} AS double precision)))"


class is_due(FunctionElement[bool]):
    """``column IS NULL OR column <= db_now()``, written as one non-indexable comparison
    (``COALESCE(column, minimum) <= now``). Deliberately so: the claim must walk the
    pending-by-id index in order and stop after one batch; an indexable OR tempts the
    planner, with stale statistics after a bulk load, into a bitmap scan and a sort of the
    whole backlog."""

    type = sa.Boolean()
    inherit_cache = True
    name = "is_due"


@compiles(is_due, "sqlite")
def _is_due_sqlite(element: is_due, compiler: SQLCompiler, **kw: Any) -> str:
    (col,) = (compiler.process(c, **kw) for c in element.clauses)
    return f"(COALESCE({col}, '') <= {SQLITE_NOW})"


@compiles(is_due, "postgresql")
def _is_due_pg(element: is_due, compiler: SQLCompiler, **kw: Any) -> str:
    (col,) = (compiler.process(c, **kw) for c in element.clauses)
    return f"(COALESCE({col}, '-infinity'::timestamptz) <= statement_timestamp())"


def in_pairs(columns: tuple[Any, ...], rows: Any, *, searched: int | None = None) -> Any:
    """``(a, b, ...) IN rows``, with the first ``searched`` columns' own ``IN`` lists
    beside it (all of them by default). SQLite looks row values up by scanning the whole
    table (or index); the per-column lists let it search the primary key or an index on
    those columns instead, so the cost is the batch's, not the table's. Name only columns
    an index leads with: a list on another column (a status, say) can draw SQLite's planner
    to a worse index. PostgreSQL plans either form the same way."""
    rows = list(rows)
    lead = columns[: len(columns) if searched is None else searched]
    return sa.and_(
        *(c.in_(sorted({r[i] for r in rows})) for i, c in enumerate(lead)),
        sa.tuple_(*columns).in_(rows),
    )
