"""Hot-path statements run on the driver's own cursor.

SQLAlchemy builds and compiles each hot-path statement once; running it through
``Connection.execute`` then costs, on every batch, a compiled-cache look-up, an execution
context, the driver's column descriptions turned into a result's metadata and a row object
per row — about as much Python as the checks of a batch of ten. Here the compiled text and
its fixed parameters are kept, the statement runs on the DBAPI cursor of the same pooled
connection (same transaction, same prepared-statement policy, same type loaders), and the
rows come back as the driver's tuples.

An executemany (:func:`execute_many`) keeps the statement's compiled text, its parameter
order and its types' bind processors, and converts each parameter set with those same
processors: the values stored are the ones ``Connection.execute`` would store, without its
per-set parameter construction (a SQLite JSON column's value encoded by orjson, compact:
the same JSON value in other text).

A driver error is raised as SQLAlchemy's ``DBAPIError`` of the same class, and a lost
connection invalidates the pooled one, as ``Connection.execute`` would: the daemon's
outage handling (:func:`outbox.db.is_outage`) sees the same exception either way.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import Null


@dataclass(frozen=True)
class Prepared:
    """A statement as the driver takes it: its text, the values it always binds, and for
    a driver that binds by position (SQLite's ``?``, psycopg's ``$1`` on a raw cursor)
    the parameters' names in order."""

    sql: str
    fixed: Mapping[str, Any]
    order: tuple[str, ...] | None = None
    numbered: bool = False
    """The text's placeholders are PostgreSQL's own (``$1``…), run on psycopg's
    ``RawCursor``: converted once here. psycopg converts a ``%(name)s`` text on every
    execution, and caches the conversion only for texts up to 4 KiB — the claim and mark
    statement is longer — so its Python re-read the whole text on every batch."""
    kinds: tuple[str, ...] = ()
    """For a numbered text: each parameter's SQL type in number order, as a server-side
    ``PREPARE`` of the text declares them (:func:`begin_and_fetch`)."""
    pieces: tuple[str, ...] = ()
    slots: tuple[int, ...] = ()
    """For a numbered text: the text around its placeholders, and for each placeholder the
    number (from 0) of its parameter — the statement with literals in their places is
    ``pieces[0] + lit[slots[0]] + pieces[1] + …`` (:func:`begin_and_fetch`)."""


_PLACEHOLDER = re.compile(r"%\(([^)]+)\)s|%%")


def _split(sql: str, names: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A ``pyformat`` text cut at its placeholders (see :attr:`Prepared.pieces`), each
    placeholder's name found in ``names``."""
    pieces: list[str] = []
    slots: list[int] = []
    current, at = [], 0
    for m in _PLACEHOLDER.finditer(sql):
        current.append(sql[at:m.start()])
        at = m.end()
        if m.group(1) is None:
            current.append("%")
            continue
        pieces.append("".join(current))
        current = []
        slots.append(names.index(m.group(1)))
    current.append(sql[at:])
    pieces.append("".join(current))
    return tuple(pieces), tuple(slots)


def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """A ``pyformat`` text (``%(name)s``, ``%%``) with PostgreSQL's ``$n`` placeholders
    instead, one number per name however often it is used; the names in number order."""
    names: dict[str, int] = {}

    def place(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "%"
        return f"${names.setdefault(m.group(1), len(names) + 1)}"

    return _PLACEHOLDER.sub(place, sql), tuple(names)


def _compile(
    statement: ClauseElement,
    dialect: Dialect,
    schemas: tuple[tuple[str | None, str], ...],
    refusal: str,
    **kw: Any,
) -> tuple[SQLCompiler, set[str], MutableMapping[str, Any]]:
    """``statement`` compiled for ``dialect``, its tables in the schemas of the
    connection's ``schema_translate_map`` (``schemas``: its items); the names of the
    parameters the caller binds, and every parameter's value (None for those). A statement
    whose text depends on its values is refused with ``refusal``."""
    compiled = statement.compile(
        dialect=dialect, schema_translate_map=dict(schemas) if schemas else None,
        render_schema_translate=bool(schemas), **kw)
    if not isinstance(compiled, SQLCompiler) or (
        compiled.literal_execute_params or compiled.post_compile_params
    ):
        raise TypeError(refusal)
    required = {b.key for b in compiled.binds.values() if b.required}
    return compiled, required, compiled.construct_params(dict.fromkeys(required), _check=False)


@functools.cache
def prepared(
    statement: ClauseElement, dialect: Dialect, schemas: tuple[tuple[str | None, str], ...] = ()
) -> Prepared:
    """``statement`` compiled for ``dialect`` (see :func:`_compile`), to run with plain
    values: a statement whose types convert them is refused."""
    refusal = "a statement run on the driver's cursor must bind plain values"
    compiled, required, binds = _compile(statement, dialect, schemas, refusal)
    if getattr(compiled, "_bind_processors", None):
        raise TypeError(refusal)
    fixed = {k: v for k, v in binds.items() if k not in required}
    if dialect.driver == "psycopg" and not compiled.positional:
        sql, names = numbered(str(compiled))
        kinds = tuple(_sql_type(compiled.binds.get(n), dialect) for n in names)
        pieces, slots = _split(str(compiled), names)
        return Prepared(sql, fixed, names, numbered=True, kinds=kinds, pieces=pieces,
                        slots=slots)
    order = tuple(compiled.positiontup or ()) if compiled.positional else None
    return Prepared(str(compiled), fixed, order)


def _sql_type(bind: Any, dialect: Dialect) -> str:
    """The SQL type a parameter is declared with; ``unknown`` (the server infers it) for
    one without a type."""
    try:
        return str(dialect.type_compiler_instance.process(bind.type))
    except (AttributeError, sa.exc.CompileError):
        return "unknown"


def _schemas(conn: Connection) -> tuple[tuple[str | None, str], ...]:
    translate = conn.get_execution_options().get("schema_translate_map")
    return tuple(translate.items()) if translate else ()


def fetch_all(
    conn: Connection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """Run ``statement`` with ``params`` in ``conn``'s transaction; its rows as tuples
    (none for a statement that returns nothing)."""
    p = prepared(statement, conn.dialect, _schemas(conn))
    named = {**p.fixed, **params}
    values: Any = named if p.order is None else tuple(named[n] for n in p.order)
    with _cursor(conn, p.sql, values, keep=True, raw_query=p.numbered) as cursor:
        cursor.execute(p.sql, values)
        return list(cursor.fetchall()) if _has_rows(cursor) else []


SERVER_PREPARED = "outboxd.direct.server_prepared"
MAX_SERVER_PREPARED = 32
"""Statements one connection prepares for :func:`begin_and_fetch` (one per claim size
seen, the batch size first); beyond them ``BEGIN`` goes on its own again."""
_MISSING_STATEMENT = "26000"  # invalid_sql_statement_name


def begin_and_fetch(
    conn: Connection, statement: ClauseElement, params: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """``BEGIN`` on ``conn`` (autocommit, no transaction open), then ``statement`` with
    ``params`` in the transaction it opened, in ONE round trip; its rows as tuples, as
    :func:`fetch_all`.

    The extended protocol carries one statement per message, so ``BEGIN`` and a
    parameterised statement are two round trips there; a simple query carries both. Where
    the connection prepares statements server-side (psycopg's ``prepare_threshold`` set:
    PostgreSQL reached directly or through a session pooler, see
    ``dispatcher.daemon.Daemon._choose_preparation``) the statement is prepared once per
    connection (``PREPARE``, its parameters declared with their types) and the query is
    ``BEGIN; EXECUTE name(values)``; elsewhere (a transaction pooler hands each
    transaction another server connection, so nothing prepared on one is on the next) it
    is ``BEGIN; <the statement with its values in place>``, planned on every execution as
    an unprepared statement always is. The values are rendered as literals by psycopg (the
    same quoting as its client-side binding), once per connection: a claim's values are
    the same on every batch. psycopg deallocates every prepared statement of a connection —
    its own and these — after a ``ROLLBACK`` once it has prepared any; a statement found
    gone is prepared again, once, after rolling the failed ``BEGIN`` back."""
    p = prepared(statement, conn.dialect, _schemas(conn))
    if not p.numbered or p.order is None:  # not psycopg: BEGIN on its own
        run(conn, "BEGIN")
        return fetch_all(conn, statement, params)
    raw: Any = conn.connection.dbapi_connection
    named = {**p.fixed, **params}
    values = tuple(named[n] for n in p.order)
    info = conn.connection.info
    known: dict[str, str] = info.setdefault(SERVER_PREPARED, {})
    prepares = getattr(raw, "prepare_threshold", None) is not None
    for again in (False, True):
        name = known.get(p.sql)
        if name is None and prepares and len(known) < MAX_SERVER_PREPARED:
            # a name never used on this connection: none can be left over
            info[f"{SERVER_PREPARED}.n"] = n = info.get(f"{SERVER_PREPARED}.n", 0) + 1
            name = f"outboxd_{n}"
            declared = f"PREPARE {name} ({', '.join(p.kinds)}) AS {p.sql}"
            with _cursor(conn, declared, None) as cursor:
                cursor.execute(declared)
            known[p.sql] = name
        text = _begin_text(info, p, name, values, raw)
        try:
            # kept: the same text on every batch (a claim's values do not change), and a
            # kept cursor keeps its loaders for the result's columns
            with _cursor(conn, text, None, keep=True) as cursor:
                cursor.execute(text)
                cursor.nextset()  # past BEGIN's result
                return list(cursor.fetchall()) if _has_rows(cursor) else []
        except sa.exc.DBAPIError as exc:
            code = getattr(exc.orig, "sqlstate", None)
            if again or name is None or code != _MISSING_STATEMENT:
                raise
            run(conn, "ROLLBACK")  # the BEGIN that ran
            known.clear()  # deallocated: every one of them
    raise AssertionError("unreachable")


def _begin_text(
    info: dict[Any, Any], p: Prepared, name: str | None, values: tuple[Any, ...], raw: Any
) -> str:
    """The simple query of :func:`begin_and_fetch`: ``BEGIN; EXECUTE name(values)``, or
    with no ``name`` ``BEGIN;`` and the statement with ``values`` in place; kept in the
    connection's ``info`` (rendering a claim's values costs 30 µs a batch)."""
    from psycopg.sql import Literal

    texts: dict[Any, str] = info.setdefault(f"{SERVER_PREPARED}.texts", {})
    key: tuple[Any, ...] | None = (name, p.sql, values)
    try:
        text = texts.get(key)
    except TypeError:  # a value that cannot be a key (a list, a dict): not kept
        key, text = None, None
    if text is None:
        literals = [Literal(v).as_string(raw) for v in values]
        if name is not None:
            text = f"BEGIN; EXECUTE {name}({', '.join(literals)})"
        else:
            parts = [p.pieces[0]]
            for slot, piece in zip(p.slots, p.pieces[1:], strict=True):
                parts += [literals[slot], piece]
            text = "BEGIN; " + "".join(parts)
        if key is not None and len(texts) < 4 * MAX_SERVER_PREPARED:
            texts[key] = text
    return text


def _has_rows(cursor: Any) -> bool:
    """Whether the statement ``cursor`` ran returned rows. psycopg answers from its
    result's status (its ``description`` builds an object per column on every call)."""
    result = getattr(cursor, "pgresult", _ABSENT)
    if result is _ABSENT:
        return cursor.description is not None
    return result is not None and (result.nfields > 0 or result.status == _TUPLES_OK)


def run(conn: Connection, sql: str) -> None:
    """Run the parameterless statement ``sql`` (``BEGIN``, ``COMMIT``) on ``conn``'s
    driver cursor; errors as :func:`fetch_all` raises them."""
    with _cursor(conn, sql, None, keep=True) as cursor:
        cursor.execute(sql)


def json_text(value: Any) -> str:
    """``value``'s JSON text as the hot path binds it — PostgreSQL's batch parameters,
    SQLite's JSON columns in an executemany: orjson's C encoder (a batch of 100 records:
    650 µs with the standard library's, 70 µs with it, in the thread that records), a
    value that is not JSON as its ``str``; what orjson refuses (an integer beyond 64 bits
    in a receipt or evidence) through the standard library's encoder."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=str)


def _json_column(column_type: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    """A SQLite JSON column's bind processor with :func:`json_text` as its encoder (the
    text SQLAlchemy's would store, compact; ``None`` and ``JSON.NULL`` as it stores them);
    None for any other type. Each attempt row, event row and recorded receipt has one."""
    impl = column_type.dialect_impl(dialect)
    if not isinstance(impl, sa.JSON):
        return None
    none_as_null = impl.none_as_null

    def process(value: Any) -> str | None:
        if value is None:
            return None if none_as_null else "null"
        if value is sa.JSON.NULL:
            return "null"
        if isinstance(value, Null):
            return None
        return json_text(value)

    return process


@dataclass(frozen=True)
class PreparedMany:
    """A statement for an executemany: its text, and for each parameter in the driver's
    order its name, its type's bind processor, and (for a value fixed in the statement)
    that value already processed."""

    sql: str
    positional: bool
    slots: tuple[tuple[str, Callable[[Any], Any] | None, bool, Any], ...]


@functools.cache
def prepared_many(
    statement: ClauseElement,
    dialect: Dialect,
    keys: tuple[str, ...],
    schemas: tuple[tuple[str | None, str], ...] = (),
) -> PreparedMany:
    """``statement`` compiled for an executemany of parameter sets with ``keys`` (see
    :func:`_compile`); values a Python-side default would fill are refused."""
    refusal = "an executemany on the driver's cursor must bind plain parameters"
    compiled, required, binds = _compile(
        statement, dialect, schemas, refusal, column_keys=list(keys), for_executemany=True)
    if compiled.escaped_bind_names or compiled.insert_prefetch or compiled.update_prefetch:
        raise TypeError(refusal)
    processors = compiled._bind_processors
    names = compiled.positiontup if compiled.positional else list(binds)
    assert names is not None
    slots = []
    for name in names:
        found = processors.get(name)
        if isinstance(found, Sequence):  # a tuple type's processors, one per element
            raise TypeError(refusal)
        process: Callable[[Any], Any] | None = found
        if process is not None and dialect.name == "sqlite":
            process = _json_column(compiled.binds[name].type, dialect) or process
        fixed = name not in required
        value = binds[name] if fixed else None
        if fixed and process is not None:
            value = process(value)
        slots.append((name, None if fixed else process, fixed, value))
    return PreparedMany(str(compiled), compiled.positional, tuple(slots))


def execute_many(
    conn: Connection, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Run ``statement`` once per row of ``rows`` (all with the keys of the first) in
    ``conn``'s transaction, each value converted as ``Connection.execute`` converts it.
    Returns the rows the statement changed, over all of ``rows`` (the driver's count)."""
    if not rows:
        return 0
    p = prepared_many(statement, conn.dialect, tuple(rows[0]), _schemas(conn))
    slots = p.slots
    values = [
        [fx if fixed else (process(row[n]) if process else row[n])
         for n, process, fixed, fx in slots]
        for row in rows
    ]
    params: list[Any] = (
        [tuple(v) for v in values] if p.positional
        else [{s[0]: x for s, x in zip(slots, v, strict=True)} for v in values]
    )
    with _cursor(conn, p.sql, params) as cursor:
        cursor.executemany(p.sql, params)
        return int(cursor.rowcount)


_ABSENT: Any = object()
_TUPLES_OK = 2  # libpq's PGRES_TUPLES_OK
KEPT_CURSORS = "outboxd.direct.cursors"


@contextmanager
def _cursor(
    conn: Connection, sql: str, params: Any, *, keep: bool = False, raw_query: bool = False
) -> Iterator[Any]:
    """A cursor of ``conn``'s driver connection; a driver error raised as SQLAlchemy's.

    ``keep``: the cursor this driver connection keeps for ``sql`` (made on first use,
    dropped on any error). psycopg sets a cursor up for the statement it last ran — its
    query converted, a loader per result column — and runs the same statement again on
    that set-up; a fresh cursor per call made it all again on every batch. ``raw_query``:
    psycopg's ``RawCursor``, for a text with ``$n`` placeholders (:attr:`Prepared.numbered`)."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    kept: dict[str, Any] | None = (
        conn.connection.info.setdefault(KEPT_CURSORS, {}) if keep else None)
    try:
        cursor = kept.get(sql) if kept is not None else None
        if cursor is None or cursor.connection is not raw:
            if raw_query:
                from psycopg import RawCursor

                cursor = RawCursor(raw)  # type: ignore[call-overload]
            else:
                cursor = raw.cursor()
            if kept is not None:
                kept[sql] = cursor
        try:
            yield cursor
        except BaseException:
            if kept is not None:
                kept.pop(sql, None)
            cursor.close()
            raise
        if kept is None:
            cursor.close()
    except conn.dialect.loaded_dbapi.Error as exc:
        lost = conn.dialect.is_disconnect(exc, raw, None)
        if lost:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql, params, exc, conn.dialect.loaded_dbapi.Error,
            hide_parameters=True, connection_invalidated=lost, dialect=conn.dialect,
        ) from exc
