"""Plain SQL from outside Python's ORM: the real ``psql`` and ``sqlite3`` command-line
clients, and raw driver connections that never take SQLite's write lock.

An agent that is not written in Python writes outbox rows exactly like this.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa


def dialect_of(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def sqlite_path(url: str) -> str:
    path = sa.engine.make_url(url).database
    assert path, url
    return path


def libpq_dsn(url: str) -> str:
    return (
        sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


class CliError(Exception):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"exit {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


def run_cli(url: str, sql: str) -> list[list[str]]:
    """Run ``sql`` with ``psql`` or ``sqlite3``; rows of the output, '|'-separated fields.

    Stops at the first error (``ON_ERROR_STOP`` / ``-bail``) and raises :class:`CliError`.
    """
    if dialect_of(url) == "sqlite":
        exe = shutil.which("sqlite3")
        if exe is None:
            pytest.fail("the sqlite3 command-line client is not installed")
        cmd = [exe, "-batch", "-bail", "-noheader", "-list", sqlite_path(url)]
    else:
        exe = shutil.which("psql")
        if exe is None:
            pytest.fail("the psql command-line client is not installed")
        cmd = [exe, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", libpq_dsn(url)]
    proc = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise CliError(proc.returncode, proc.stderr)
    return [line.split("|") for line in proc.stdout.splitlines() if line.strip()]


def peek(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read through a separate raw connection (SQLite: autocommit, no write lock taken).

    Placeholders: ``%s`` for both dialects.
    """
    if dialect_of(url) == "sqlite":
        conn = sqlite3.connect(sqlite_path(url), isolation_level=None, timeout=5)
        try:
            return [tuple(r) for r in conn.execute(sql.replace("%s", "?"), params).fetchall()]
        finally:
            conn.close()
    with psycopg.connect(libpq_dsn(url), autocommit=True) as pg:
        return [tuple(r) for r in pg.execute(sql, params).fetchall()]  # type: ignore[arg-type]


def count(url: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    rows = peek(url, sql, params)
    return int(rows[0][0])
