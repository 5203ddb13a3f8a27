"""Shared plumbing for the benchmarks: a throwaway PostgreSQL database, repetition with
median and spread, RSS of a process, and the final table."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
ADMIN_DSN = os.environ.get("OUTBOXD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def scratch_database(prefix: str = "outboxd_bench") -> Iterator[str]:
    """A fresh PostgreSQL database (DSN) dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_DSN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sa_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def writing_commits(dsn: str) -> int:
    """How many transactions that wrote have started on the server: the next transaction
    id (read without taking one). A commit that costs a WAL flush is one of these; a
    read-only transaction — a poll, or a LISTEN connection reading the notification queue
    after another session's NOTIFY — takes no transaction id and is not counted (the
    server's ``xact_commit`` counts both). Cluster-wide: the bench runs alone."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    """The write-ahead log's current position, in bytes (``bench.wal``)."""
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far (NaN once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backend_cpu(conn: psycopg.Connection[Any]) -> dict[int, float]:
    """CPU seconds used so far by each server process of ``conn``'s database other than
    ``conn``'s own: the daemon's connections and any autovacuum of this database. Read from
    ``/proc``, so only for a server on this machine (none for one elsewhere)."""
    pids = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    used = {int(p): cpu_seconds(int(p)) for (p,) in pids}
    return {p: s for p, s in used.items() if not math.isnan(s)}  # gone since: left out


@dataclass
class Figure:
    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def spread(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        return (max(self.samples) - min(self.samples)) / 2


def repeat(name: str, unit: str, runs: int, fn: Callable[[], float], note: str = "") -> Figure:
    fig = Figure(name, unit, note=note)
    for i in range(runs):
        value = fn()
        fig.samples.append(value)
        log(f"  {name} run {i + 1}/{runs}: {value:,.1f} {unit}")
    return fig


def log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"


def verdict(value: float, target: str) -> str:
    """``met`` / ``not met`` for a target written ``>= X`` or ``<= X``; empty for any
    other target (a figure only reported)."""
    op, _, bound = target.partition(" ")
    try:
        limit = float(bound)
    except ValueError:
        return ""
    if math.isnan(value) or op not in (">=", "<="):
        return ""
    ok = value >= limit if op == ">=" else value <= limit
    return "met" if ok else "**not met**"


def table(figures: list[Figure], ratios: list[tuple[str, float, str]]) -> str:
    lines = ["| figure | median | ± | unit | note |", "|---|---:|---:|---|---|"]
    for f in figures:
        lines.append(f"| {f.name} | {fmt(f.median)} | {fmt(f.spread)} | {f.unit} | {f.note} |")
    lines += ["", "| ratio or target | value | target | met? |", "|---|---:|---|---|"]
    for name, value, target in ratios:
        lines.append(f"| {name} | {fmt(value)} | {target} | {verdict(value, target)} |")
    return "\n".join(lines)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return "unknown"


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.end
