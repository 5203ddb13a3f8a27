"""Hot-path statements run on the driver's own cursor.

SQLAlchemy builds and compiles each hot-path statement once; running it through
``Connection.execute`` then costs, on every batch, a compiled-cache look-up, an execution
context, the driver's column descriptions turned into a result's metadata and a row object
per row — about as much Python as the checks of a batch of ten. Here the compiled text and
its fixed parameters are kept, the statement runs on the DBAPI cursor of the same pooled
connection (same transaction, same prepared-statement policy, same type loaders), and the
rows come back as the driver's tuples.

A driver error is raised as SQLAlchemy's ``DBAPIError`` of the same class, and a lost
connection invalidates the pooled one, as ``Connection.execute`` would: the daemon's
outage handling (:func:`outbox.db.is_outage`) sees the same exception either way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class Prepared:
    """A statement as the driver takes it: its text and the values it always binds."""

    sql: str
    fixed: Mapping[str, Any]


@functools.cache
def prepared(
    statement: ClauseElement, dialect: Dialect, schemas: tuple[tuple[str | None, str], ...] = ()
) -> Prepared:
    """``statement`` compiled for ``dialect``, its tables in the schemas of the
    connection's ``schema_translate_map`` (``schemas``: its items)."""
    compiled = statement.compile(
        dialect=dialect, schema_translate_map=dict(schemas) if schemas else None,
        render_schema_translate=bool(schemas))
    if not isinstance(compiled, SQLCompiler) or (
        compiled.literal_execute_params
        or compiled.post_compile_params
        or getattr(compiled, "_bind_processors", None)
    ):
        raise TypeError("a statement run on the driver's cursor must bind plain values")
    required = {b.key for b in compiled.binds.values() if b.required}
    binds = compiled.construct_params(dict.fromkeys(required), _check=False)
    return Prepared(str(compiled), {k: v for k, v in binds.items() if k not in required})


def fetch_all(
    conn: Connection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Run ``statement`` with ``params`` in ``conn``'s transaction; its rows as tuples
    (none for a statement that returns nothing)."""
    translate = conn.get_execution_options().get("schema_translate_map")
    p = prepared(statement, conn.dialect, tuple(translate.items()) if translate else ())
    values = {**p.fixed, **params}
    raw = conn.connection.dbapi_connection
    assert raw is not None
    try:
        cursor = raw.cursor()
        try:
            cursor.execute(p.sql, values)
            return list(cursor.fetchall()) if cursor.description is not None else []
        finally:
            cursor.close()
    except conn.dialect.loaded_dbapi.Error as exc:
        lost = conn.dialect.is_disconnect(exc, raw, None)
        if lost:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            p.sql, values, exc, conn.dialect.loaded_dbapi.Error,
            hide_parameters=True, connection_invalidated=lost, dialect=conn.dialect,
        ) from exc
