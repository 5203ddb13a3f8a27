"""Stored values the dispatcher decodes itself, one row at a time.

A database can hold values that a driver or Python's JSON decoder refuses or cannot
represent: JSON nested deeper than Python recurses, integers longer than Python parses,
escapes of lone UTF-16 surrogates, and (SQLite) ``TEXT`` bytes that are not UTF-8. Read
through the driver's own decoders, one such value fails the whole result set, so one row
would halt every batch that claims it. The dispatcher therefore reads its per-row JSON
columns as text and decodes each row here: a value that cannot be decoded becomes an
:class:`Undecodable` in its place, the row is parked ``blocked`` ``payload_undecodable``,
and the rest of the batch goes on.

:data:`MAX_JSON_DEPTH` is the nesting the dispatcher accepts; the schema refuses deeper
payloads at INSERT (see ``docs/plain-sql.md``) and the agent API before anything is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

MAX_JSON_DEPTH = 64
"""Containers nested inside each other, the outermost counting as 1."""

PAYLOAD_UNDECODABLE = "payload_undecodable"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}|\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_NOT_FOR_ORJSON = re.compile(r"[0-9](?:[.eE]|[0-9]{18})")
"""Text that may hold a number orjson reads otherwise than the standard library: a
fraction or an exponent follows a digit in every JSON float (read the same, but left to
the standard library's one rounding), and orjson reads an integer of 19 digits or more
past 64 bits as a float. Matches inside strings too: those texts just take the slow path."""


@dataclass(frozen=True)
class Undecodable:
    """In place of a value that could not be decoded: which column, and why in words
    (never the value itself)."""

    column: str
    why: str

    def describe(self) -> str:
        return f"{self.column}: {self.why}"


class NotUtf8(str):
    """SQLite ``TEXT`` whose bytes are not UTF-8, decoded with ``surrogateescape`` so the
    row can still be read and parked (the connection's ``text_factory``)."""


def sqlite_text(data: bytes) -> str:
    """``text_factory`` for SQLite connections: UTF-8, and a :class:`NotUtf8` for bytes
    that are not (instead of an error that fails the whole statement)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return NotUtf8(data.decode("utf-8", "surrogateescape"))


def json_depth_over(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether containers in ``value`` nest deeper than ``limit`` (iterative: any depth)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))
    return False


def unencodable_string(value: Any) -> bool:
    """Whether a string (or key) in ``value`` cannot be encoded as UTF-8 (lone surrogates)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def shape_problem(value: Any) -> str | None:
    """Why a JSON value could not be dispatched as is (completing "the payload ..."),
    or None."""
    if json_depth_over(value):
        return f"is nested deeper than {MAX_JSON_DEPTH} levels"
    if unencodable_string(value):
        return "holds a string that is not encodable as UTF-8 (a lone surrogate)"
    return None


def decode_json(raw: str | bytes | None, column: str) -> Any:
    """The value of a JSON column read as text, or an :class:`Undecodable`."""
    if raw is None:
        return None
    if isinstance(raw, NotUtf8):
        return Undecodable(column, "stored bytes are not valid UTF-8")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return Undecodable(column, "stored bytes are not valid UTF-8")
    if _NOT_FOR_ORJSON.search(raw) is None:
        # orjson, in C: the standard library's value for such text (strings, integers of up
        # to 18 digits, true, false, null), or an error for all it refuses and more (lone
        # surrogates, NaN, nesting past 1,024): the standard library then says why
        try:
            fast = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            deep_enough = raw.count("[") + raw.count("{") > MAX_JSON_DEPTH
            if deep_enough and isinstance(fast, dict | list) and json_depth_over(fast):
                return Undecodable(column, f"nested deeper than {MAX_JSON_DEPTH} levels")
            return fast
    try:
        value = json.loads(raw)
    except RecursionError:
        return Undecodable(column, f"nested deeper than {MAX_JSON_DEPTH} levels")
    except ValueError as exc:  # malformed text, or an integer longer than Python parses
        return Undecodable(column, _value_error(exc))
    if isinstance(value, dict | list):
        # each container opens with a bracket: too few brackets in the text, no walk
        deep_enough = raw.count("[") + raw.count("{") > MAX_JSON_DEPTH
        if deep_enough and json_depth_over(value):
            return Undecodable(column, f"nested deeper than {MAX_JSON_DEPTH} levels")
        if _SURROGATE_ESCAPE.search(raw) and unencodable_string(value):
            return Undecodable(column, "a string is a lone UTF-16 surrogate escape")
    return value


def _value_error(exc: ValueError) -> str:
    text = str(exc)
    if "digits" in text:  # Python's int-string conversion limit
        return "an integer has more digits than Python parses"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg})"
    return type(exc).__name__


LATEST = datetime.max.replace(tzinfo=UTC)
EARLIEST = datetime.min.replace(tzinfo=UTC)


_PARSED_TIMES: dict[str, datetime] = {}
"""Timestamps already parsed, by their text: the rows of one claim mostly share them (one
statement set their lease, start and update times; a bulk load, their creation time)."""
PARSED_TIMES_KEPT = 1024
"""Entries :data:`_PARSED_TIMES` holds at most; it starts again empty past that."""


def parse_time(text: str, column: str) -> datetime | Undecodable:
    """A timestamp stored as text (SQLite), in any ISO 8601 form, as an aware UTC
    datetime; an :class:`Undecodable` for text that is not one. A text seen recently is
    not parsed again (datetimes are immutable: the same object serves every row)."""
    if type(text) is str:  # never a NotUtf8 (a str subclass), which is refused below
        value = _PARSED_TIMES.get(text)
        if value is not None:
            return value
    if isinstance(text, NotUtf8):
        return Undecodable(column, "stored bytes are not valid UTF-8")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return Undecodable(column, "not an ISO 8601 timestamp")
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if type(text) is str:
        if len(_PARSED_TIMES) >= PARSED_TIMES_KEPT:
            _PARSED_TIMES.clear()  # several threads may: the next parse fills it again
        _PARSED_TIMES[text] = value
    return value


_LOADED_TIMES: dict[Any, dict[bytes, datetime]] = {}
"""PostgreSQL's ``timestamptz`` texts already loaded, by the session's time zone, then by
the text (:func:`register_pg_time_loaders`); each holds at most :data:`PARSED_TIMES_KEPT`."""


def register_pg_time_loaders(connection: Any) -> None:
    """PostgreSQL ``timestamptz`` values Python cannot represent (``infinity``,
    ``-infinity``, years after 9999 or before 1) read as the latest / earliest datetime
    instead of failing the whole statement: they compare the same way in the dispatcher
    (an ``infinity`` deadline never passes, a ``-infinity`` one has passed)."""
    from psycopg import postgres
    from psycopg.errors import DataError
    from psycopg.pq import Format
    from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

    # psycopg's own loaders (its C ones where psycopg[binary] is installed, which cannot be
    # subclassed) do the parsing; only a value they refuse is looked at here
    oid = postgres.types["timestamptz"].oid
    fast_text = postgres.adapters.get_loader(oid, Format.TEXT) or TimestamptzLoader
    fast_binary = postgres.adapters.get_loader(oid, Format.BINARY) or TimestamptzBinaryLoader

    class Clamped(TimestamptzLoader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._fast: Callable[[Any], datetime] = fast_text(oid, context).load
            # by the connection's time zone too: the same text loads as another
            # datetime where the session's TimeZone differs
            self._seen = _LOADED_TIMES.setdefault(self._timezone, {})

        def load(self, data: Any) -> datetime:
            # a claim's rows share most of their timestamps (one statement set their
            # lease, start and update times): a text seen recently is not parsed again
            # (a read-only memoryview hashes and compares as its bytes)
            seen = self._seen
            try:
                value = seen.get(data)
            except (TypeError, ValueError):  # a writable buffer cannot be a key: parsed
                return self._parse(data)
            if value is not None:
                return value
            value = self._parse(data)
            if len(seen) >= PARSED_TIMES_KEPT:
                seen.clear()  # several threads may: the next load fills it again
            seen[bytes(data)] = value
            return value

        def _parse(self, data: Any) -> datetime:
            try:
                return self._fast(data)
            except DataError:
                return _clamped(bytes(data))

    def _clamped(raw: bytes) -> datetime:
        if raw == b"infinity":
            return LATEST
        if raw == b"-infinity":
            return EARLIEST
        return EARLIEST if raw.endswith(b"BC") else LATEST

    class ClampedBinary(TimestamptzBinaryLoader):
        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._fast: Callable[[Any], datetime] = fast_binary(oid, context).load

        def load(self, data: Any) -> datetime:
            try:
                return self._fast(data)
            except DataError:
                return EARLIEST if bytes(data)[:1] >= b"\x80" else LATEST

    connection.adapters.register_loader("timestamptz", Clamped)
    connection.adapters.register_loader("timestamptz", ClampedBinary)
