"""PostgreSQL's timestamps as the dispatcher's connections read them: loaded once per text
(a claim's rows share most of theirs), per session time zone, clamped where Python cannot
hold the value — the same datetimes as psycopg's own loader gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outbox import decoding

pytestmark = pytest.mark.postgres

TEXTS = ("2026-12-07 20:20:19.123456+00", "2026-12-07 21:20:19+01", "1999-01-01 00:00:00-05:30")


def _read(dsn: str, zone: str, texts: tuple[str, ...], *, clamped: bool) -> list[datetime]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if clamped:
            decoding.register_pg_time_loaders(conn)
        conn.execute(f"SET TimeZone = '{zone}'")
        out = []
        for _ in range(2):  # the second read is answered from the texts already loaded
            row = conn.execute(
                "SELECT " + ", ".join(f"%s::timestamptz AS t{n}" for n in range(len(texts))),
                texts).fetchone()
            assert row is not None
            out += list(row)
        return out


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/New_York"])
def test_the_same_datetimes_as_the_drivers_own_loader(pg_admin_dsn: str, zone: str) -> None:
    ours = _read(pg_admin_dsn, zone, TEXTS, clamped=True)
    theirs = _read(pg_admin_dsn, zone, TEXTS, clamped=False)
    assert ours == theirs
    # the same instant, and in the session's zone, as the driver gives it
    assert [t.utcoffset() for t in ours] == [t.utcoffset() for t in theirs]
    assert ours[0] == datetime(2026, 12, 7, 20, 20, 19, 123456, tzinfo=UTC)


def test_a_text_read_in_two_time_zones_keeps_each_zone(pg_admin_dsn: str) -> None:
    utc = _read(pg_admin_dsn, "UTC", TEXTS[:1], clamped=True)[0]
    kolkata = _read(pg_admin_dsn, "Asia/Kolkata", TEXTS[:1], clamped=True)[0]
    assert utc == kolkata
    assert utc.utcoffset() == timedelta(0)
    assert kolkata.utcoffset() == timedelta(hours=5, minutes=30)


def test_values_python_cannot_hold_are_clamped_every_time(pg_admin_dsn: str) -> None:
    got = _read(pg_admin_dsn, "UTC", ("infinity", "-infinity", "10000-01-01 00:00:00+00",
                                      "0044-03-15 00:00:00+00 BC"), clamped=True)
    assert got == [decoding.LATEST, decoding.EARLIEST, decoding.LATEST, decoding.EARLIEST] * 2


def test_the_loaded_texts_are_bounded(pg_admin_dsn: str) -> None:
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        decoding.register_pg_time_loaders(conn)
        rows = conn.execute(
            "SELECT timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second'"
            " FROM generate_series(1, %s) g", (decoding.PARSED_TIMES_KEPT + 10,)).fetchall()
    assert rows[-1][0] == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
        seconds=decoding.PARSED_TIMES_KEPT + 10)
    assert all(len(seen) <= decoding.PARSED_TIMES_KEPT
               for seen in decoding._LOADED_TIMES.values())


def test_a_buffer_that_cannot_be_a_key_is_parsed(pg_admin_dsn: str) -> None:
    """The driver hands the loader a read-only view of the result; any other buffer (a
    writable one cannot be hashed) is parsed as it was before texts were kept."""
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        decoding.register_pg_time_loaders(conn)
        oid = psycopg.postgres.types["timestamptz"].oid
        loader = conn.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
        assert loader is not None
        load = loader(oid, conn).load
        for text in (b"2026-12-07 20:20:19.5+00", b"infinity"):
            writable = memoryview(bytearray(text))
            assert load(writable) == load(text) == load(memoryview(text))
