"""Engines and connections for both dialects, and the one place driver errors are mapped.

SQLite: WAL, ``synchronous=FULL``, foreign keys on, a busy timeout, and every transaction
begun with ``BEGIN IMMEDIATE`` so the claim is a single writer with no upgrade deadlock.
PostgreSQL: psycopg 3, pre-ping, a connect timeout, and an optional schema applied through
``schema_translate_map`` plus ``search_path``.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

from outbox import decoding, errors

SQLITE_BUSY_TIMEOUT_MS = 30_000
# primary result codes: BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN, PROTOCOL
_SQLITE_OUTAGE_CODES = frozenset({5, 6, 7, 10, 13, 14, 15})
# PERM, READONLY, CANTOPEN, NOTADB: at start-up, no wait opens the file
_SQLITE_UNOPENABLE_CODES = frozenset({3, 8, 14, 26})


def normalise_url(url: str) -> str:
    """Accept ``postgres://`` and ``postgresql://`` and use the psycopg 3 driver; spell
    several hosts the one way SQLAlchemy and libpq both read (see :func:`_host_list`)."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith("postgresql+psycopg://"):
        url = _host_list(url)
    return url


def _split_host(item: str) -> tuple[str, str]:
    """``host:port``, ``[v6]:port``, ``host`` or ``/socket/dir`` as (host, port or "")."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return host, rest.removeprefix(":")
    if item.startswith("/") or item.count(":") != 1:
        return item, ""
    host, _, port = item.partition(":")
    return host, port


def _host_list(url: str) -> str:
    """Several hosts as ``?host=a,b&port=p,q``: libpq's URI form ``user@a:p,b:q/db`` (which
    SQLAlchemy cannot parse) and ``?host=a:p,b:q`` (whose ports libpq would read as part of
    the host name) are rewritten to it; other spellings are left as they are."""
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    items: list[str] = []
    if "," in hostlist:
        items, hostlist = hostlist.split(","), ""
    else:
        listed = [v for k, v in pairs if k == "host"]
        if len(listed) == 1 and "," in listed[0] and any(
            _split_host(h)[1] for h in listed[0].split(",")
        ):
            items = listed[0].split(",")
    if not items:
        return url
    hosts, ports = zip(*(_split_host(i.strip()) for i in items), strict=True)
    if any(ports) and not all(ports):
        ports = tuple(p or "5432" for p in ports)
    pairs = [(k, v) for k, v in pairs if k != "host" and not (k == "port" and any(ports))]
    pairs += [("host", ",".join(hosts))] + ([("port", ",".join(ports))] if any(ports) else [])
    netloc = f"{userinfo}{at}{hostlist}"
    return f"{scheme}://{netloc}/{path}?{urllib.parse.urlencode(pairs, safe=',:/[]')}"


POOLERS = ("none", "session", "transaction")


def driver_options(
    url: sa.URL, options: Mapping[str, str] | None, pooler: str
) -> tuple[sa.URL, dict[str, Any]]:
    """The URL without what is not a libpq option, and psycopg's connect arguments.

    ``prepare_threshold`` (from ``options`` or the URL's query) becomes psycopg's integer or
    None, and is None (nothing prepared server-side) unless given: a prepared statement
    lives on one server connection, and a transaction pooler, configured or not, hands the
    next transaction another one, where the name is unknown or names another client's
    statement (which, with matching parameters, would run). The daemon turns preparation
    on for its own engine only where it has checked that no pooler sits in between
    (``dispatcher.daemon.Daemon._choose_preparation``). Under ``pooler = "transaction"`` a
    threshold is refused."""
    args: dict[str, Any] = dict(options or {})
    query = dict(url.query)
    if "prepare_threshold" in query:
        args.setdefault("prepare_threshold", query.pop("prepare_threshold"))
        url = url.set(query=query)
    raw = str(args.get("prepare_threshold", "none")).strip().lower()
    if raw != "none" and not raw.isdigit():
        raise ValueError('prepare_threshold must be an integer >= 0 or "none"')
    if raw != "none" and pooler == "transaction":
        raise ValueError('prepare_threshold cannot be used with pooler = "transaction"')
    args["prepare_threshold"] = None if raw == "none" else int(raw)
    return url, args


def prepare_threshold_given(url: sa.URL, options: Mapping[str, str] | None) -> bool:
    """Whether the user set ``prepare_threshold`` (in ``options`` or the URL's query)."""
    return "prepare_threshold" in (options or {}) or "prepare_threshold" in url.query


def create_engine(
    url: str,
    *,
    schema: str | None = None,
    pool_size: int = 5,
    connect_timeout: float = 5.0,
    pre_ping: bool = True,
    pooler: str = "none",
    options: Mapping[str, str] | None = None,
    synchronous_commit: str | None = None,
    **kwargs: Any,
) -> Engine:
    """An engine configured for the outbox on SQLite or PostgreSQL.

    ``pre_ping`` tests each pooled connection with a round trip before use. The daemon
    turns it off: it treats any database error as an outage (back off, retry; a
    disconnect invalidates the whole pool), so the extra round trip per transaction buys
    it nothing.

    ``pooler="transaction"``: nothing depends on session state, because the pooler gives
    each transaction whichever server connection is free: no prepared statements (see
    :func:`driver_options`), and the schema's ``search_path`` is set in every transaction
    (``set_config(..., true)``, which ends with it) instead of once per connection.
    ``options``: libpq connection options (and ``prepare_threshold``) for the driver.
    ``synchronous_commit``: how far each commit waits for synchronous standbys (None: the
    server's setting), set as the schema is."""
    engine: Engine = _build(
        sa.create_engine, _itself, url, schema=schema, pool_size=pool_size,
        connect_timeout=connect_timeout, pre_ping=pre_ping, pooler=pooler, options=options,
        synchronous_commit=synchronous_commit, **kwargs)
    return engine


def create_async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """:func:`create_engine`'s configuration on an asyncio engine (``outbox.aio``):
    psycopg's async driver, or ``aiosqlite`` for a SQLite file (``sqlite:///…`` is read as
    ``sqlite+aiosqlite:///…``). The same keyword arguments. Needs the ``aio`` extra."""
    from sqlalchemy.ext.asyncio import create_async_engine as factory

    if url.startswith("sqlite:"):
        url = "sqlite+aiosqlite:" + url[len("sqlite:"):]
    engine: AsyncEngine = _build(factory, _driver_connection, url, **kwargs)
    return engine


def _itself(dbapi_conn: Any) -> Any:
    return dbapi_conn


def _driver_connection(dbapi_conn: Any) -> Any:
    """The driver's own connection behind SQLAlchemy's asyncio adapter."""
    return dbapi_conn.driver_connection


def _build(
    factory: Any,
    driver: Any,
    url: str,
    *,
    schema: str | None = None,
    pool_size: int = 5,
    connect_timeout: float = 5.0,
    pre_ping: bool = True,
    pooler: str = "none",
    options: Mapping[str, str] | None = None,
    synchronous_commit: str | None = None,
    **kwargs: Any,
) -> Any:
    """An engine made by ``factory`` (SQLAlchemy's sync or asyncio ``create_engine``) and
    configured on its synchronous core; ``driver`` finds the driver's connection behind
    the DB-API one a ``connect`` event is given."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = factory(
            url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            **kwargs,
        )
        _configure_sqlite(_sync(engine), driver)
        return engine
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}")
    parsed, connect_args = driver_options(sa.engine.make_url(url), options, pooler)
    connect_args.setdefault("connect_timeout", max(1, int(connect_timeout)))
    engine = factory(
        parsed,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        connect_args=connect_args,
        **kwargs,
    )

    @event.listens_for(_sync(engine), "connect")
    def _time_loaders(dbapi_conn: Any, _rec: Any) -> None:
        decoding.register_pg_time_loaders(driver(dbapi_conn))

    settings: dict[str, str] = {}
    if schema:
        engine = engine.execution_options(schema_translate_map={None: schema})
        settings["search_path"] = f'"{schema}", public'
    if synchronous_commit:
        settings["synchronous_commit"] = synchronous_commit
    if settings:
        _apply_settings(_sync(engine), settings, per_transaction=pooler == "transaction")

    return engine


def _sync(engine: Any) -> Engine:
    """The synchronous core events are registered on (an ``AsyncEngine``'s, or itself)."""
    core: Engine = getattr(engine, "sync_engine", engine)
    return core


def _apply_settings(engine: Engine, settings: Mapping[str, str], *,
                    per_transaction: bool) -> None:
    """Session settings (``search_path``, ``synchronous_commit``): once per connection, or
    at the start of every transaction (``set_config(..., true)`` ends with it) where a
    transaction pooler may hand each transaction another server connection."""
    calls = ", ".join(f"set_config('{name}', %({name})s, {str(per_transaction).lower()})"
                      for name in settings)
    statement = f"SELECT {calls}"
    if per_transaction:
        @event.listens_for(engine, "begin")
        def _per_transaction(conn: Connection) -> None:
            conn.exec_driver_sql(statement, dict(settings))
        return

    @event.listens_for(engine, "connect")
    def _per_connection(dbapi_conn: Any, _rec: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(statement, dict(settings))
        finally:
            cur.close()
        dbapi_conn.commit()


def _configure_sqlite(engine: Engine, driver: Any = _itself) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        # text that is not UTF-8 is read (and parked) instead of failing the statement
        driver(dbapi_conn).text_factory = decoding.sqlite_text
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_sqlite(conn: Connection | Engine) -> bool:
    return conn.dialect.name == "sqlite"


# A FATAL at connect that no amount of waiting fixes: the database or role does not exist,
# authentication or pg_hba.conf refuses, CONNECT is not granted. Every other FATAL ("the
# database system is starting up / shutting down / not yet accepting connections / in
# recovery mode", "too many clients", "terminating connection") says "not yet": a server
# restarting or failing over says several of them in turn, and a replica started then
# waits instead of exiting.
_PERMANENT_FATAL = ("does not exist", "authentication failed", "pg_hba.conf",
                    "permission denied", "is not permitted to log in")


def connect_failure(exc: BaseException, url: str | None = None) -> tuple[bool, str]:
    """Why a connection could not be made, and whether waiting could ever help.

    ``(permanent, reason)``: permanent when the server answered and refused (the database
    or role does not exist, authentication failed, no ``pg_hba.conf`` entry) or a SQLite
    file cannot be opened; not when nothing answered (down, refused, unresolvable host) or
    the server said "not yet". ``reason`` is the driver's first line without credentials."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if url:
        password = sa.engine.make_url(normalise_url(url)).password
        if password:
            text = text.replace(str(password), "***")
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _SQLITE_UNOPENABLE_CODES, text
    permanent = "FATAL:" in text and any(t in text for t in _PERMANENT_FATAL)
    return permanent, text.removeprefix("connection failed: ")


_SHAPE_RULES = ("is nested deeper than", "outside the range of a double", "is not a timestamp")


# SQLSTATE classes of a server that cannot serve: connection exception, insufficient
# resources, operator intervention (shutdown, "cannot connect now"), system error. Others
# (a lock timeout, a cancelled statement, a prepared statement a pooler lost) are errors
# of a statement, not an outage, even where psycopg calls them OperationalError.
_PG_OUTAGE_CLASSES = frozenset({"08", "53", "57", "58"})


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means the database could not be used at all (connection refused
    or lost, server shutting down, SQLite busy or locked): the dispatcher backs off and
    tries again. Anything else (a statement's error, a bug) is not an outage: waiting for
    the database would not fix it, and a row's content never reaches this point (rows are
    decoded one at a time, :mod:`outbox.decoding`)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    code = getattr(getattr(exc, "orig", None), "sqlite_errorcode", None)
    if code is not None:  # SQLite says OperationalError for bad statements too
        return code & 0xFF in _SQLITE_OUTAGE_CODES
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if sqlstate:  # the server answered: an outage only in the classes that say so
        return sqlstate[:2] in _PG_OUTAGE_CLASSES
    return isinstance(
        exc, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.DisconnectionError
    )


def translate(exc: sa.exc.DBAPIError) -> errors.OutboxError | None:
    """Map a database error raised by one of our rules to our error, else None."""
    text = str(exc.orig) if exc.orig is not None else str(exc)
    if "outbox: immutable column" in text:
        return errors.ImmutableField("an immutable column of outbox_operations was changed")
    if "is append-only" in text:
        return errors.AppendOnly()
    if "exceeds max_payload_bytes" in text:
        return errors.InvalidPayload("the payload exceeds max_payload_bytes")
    if "not valid JSON" in text:
        return errors.InvalidPayload("the payload is not valid JSON")
    for rule in _SHAPE_RULES:  # migration 0003: what the dispatcher could not decode
        if rule in text:
            message = text[text.index("outbox: ") + 8 :].splitlines()[0]
            return errors.PayloadUndecodable(message)
    return None


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise database errors from our rules as :class:`~outbox.errors.OutboxError`."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        mapped = translate(exc)
        if mapped is None:
            raise
        raise mapped from exc


def connection_of(c: Connection | Session) -> Connection:
    """The Core connection of the caller's transaction (a Session's, or the Connection)."""
    return c.connection() if isinstance(c, Session) else c


def insert_for(conn: Connection) -> Any:
    """The dialect's ``insert`` (it has ``on_conflict_do_nothing`` on both dialects)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert
