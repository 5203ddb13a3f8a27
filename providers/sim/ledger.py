"""The simulated receiver's ledger: idempotency keys, applied effects, counters (SQLite).

Two things are kept apart, as in a real receiver:

* ``sim_keys`` — the idempotency-key store: one row per key with the request digest and
  the saved response. Keys expire after the retention window (pruned lazily on use and by
  :meth:`Ledger.prune`); after that, reusing a key creates a *new* effect.
* ``sim_effects`` — the business records: one row per applied effect, never pruned. The
  lookup endpoint and the duplicate count read this table, so a duplicate created past the
  retention window is visible.

Everything goes through one connection under one lock; the file (when given) survives a
restart of the sim. Rows left ``in_flight`` by a crash are removed at open: the effect and
the key's completion are written in one transaction, so such a key has no effect.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS sim_keys (
    key TEXT PRIMARY KEY, body_sha256 TEXT NOT NULL, state TEXT NOT NULL,
    status INTEGER, response TEXT, created_at REAL NOT NULL, completed_at REAL
);
CREATE TABLE IF NOT EXISTS sim_effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, effect_id TEXT NOT NULL, key TEXT,
    body_sha256 TEXT NOT NULL, receipt TEXT NOT NULL, applied_at REAL NOT NULL,
    fencing_token INTEGER
);
CREATE INDEX IF NOT EXISTS sim_effects_key ON sim_effects (key, seq);
CREATE TABLE IF NOT EXISTS sim_fences (key TEXT PRIMARY KEY, highest INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sim_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class Begin:
    """What the key store says about a new request: ``new``, ``replay``, ``mismatch``,
    or ``in_flight``. A replay carries the saved response."""

    state: str
    status: int | None = None
    response: dict[str, Any] | None = None


class Ledger:
    def __init__(self, path: str = ":memory:") -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL" if path != ":memory:" else "SELECT 1")
            self._db.executescript(SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(sim_effects)")}
            if "fencing_token" not in columns:  # a ledger file written by an older sim
                self._db.execute("ALTER TABLE sim_effects ADD COLUMN fencing_token INTEGER")
            self._db.execute("DELETE FROM sim_keys WHERE state = 'in_flight'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def begin(self, key: str, body_sha256: str, retention_seconds: float) -> Begin:
        """Claim ``key`` for a request with this body digest, or say why not."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT body_sha256, state, status, response, created_at"
                    " FROM sim_keys WHERE key = ?",
                    (key,),
                ).fetchone()
                if row is not None and row[4] + retention_seconds <= now:
                    self._db.execute("DELETE FROM sim_keys WHERE key = ?", (key,))
                    row = None
                if row is None:
                    self._db.execute(
                        "INSERT INTO sim_keys (key, body_sha256, state, created_at)"
                        " VALUES (?, ?, 'in_flight', ?)",
                        (key, body_sha256, now),
                    )
                    result = Begin("new")
                elif row[0] != body_sha256:
                    result = Begin("mismatch")
                elif row[1] == "in_flight":
                    result = Begin("in_flight")
                else:
                    result = Begin("replay", row[2], json.loads(row[3]))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return result

    def abandon(self, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sim_keys WHERE key = ? AND state = 'in_flight'", (key,))

    def apply(self, key: str | None, body_sha256: str, *, track_key: bool,
              fencing_token: int | None = None) -> dict[str, Any]:
        """Create one effect; when ``track_key``, save it as the key's response (201).
        ``fencing_token``: the request's ``Outbox-Fencing-Token``, kept with the effect so a
        checker can tell which dispatch of an operation created it."""
        now = time.time()
        effect_id = f"eff_{uuid.uuid4().hex[:20]}"
        receipt = {"effect_id": effect_id, "idempotency_key": key, "applied_at": now}
        text = json.dumps(receipt, sort_keys=True)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO sim_effects (effect_id, key, body_sha256, receipt, applied_at,"
                    " fencing_token) VALUES (?, ?, ?, ?, ?, ?)",
                    (effect_id, key, body_sha256, text, now, fencing_token),
                )
                if track_key and key is not None:
                    self._db.execute(
                        "UPDATE sim_keys SET state = 'done', status = 201, response = ?,"
                        " completed_at = ? WHERE key = ?",
                        (text, now, key),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return receipt

    def check_fence(self, key: str, token: int) -> bool:
        """False if ``token`` is lower than the highest seen for ``key``; else record it."""
        with self._lock:
            row = self._db.execute(
                "SELECT highest FROM sim_fences WHERE key = ?", (key,)
            ).fetchone()
            if row is not None and token < row[0]:
                return False
            self._db.execute(
                "INSERT INTO sim_fences (key, highest) VALUES (?, ?)"
                " ON CONFLICT (key) DO UPDATE SET highest = MAX(highest, excluded.highest)",
                (key, token),
            )
            return True

    def lookup(self, key: str, lag_seconds: float) -> dict[str, Any] | None:
        """The latest effect for ``key`` that is at least ``lag_seconds`` old."""
        with self._lock:
            row = self._db.execute(
                "SELECT receipt FROM sim_effects WHERE key = ? AND applied_at <= ?"
                " ORDER BY seq DESC LIMIT 1",
                (key, time.time() - lag_seconds),
            ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def effects(self) -> list[dict[str, Any]]:
        """Every applied effect in order: key, fencing token (or None), applied_at."""
        with self._lock:
            rows = self._db.execute(
                "SELECT key, fencing_token, applied_at FROM sim_effects ORDER BY seq"
            ).fetchall()
        return [{"key": k, "fencing_token": t, "applied_at": a} for k, t, a in rows]

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO sim_counters (name, value) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                (name, amount),
            )

    def prune(self, retention_seconds: float | None) -> int:
        """Forget idempotency keys older than the retention window (``None``: all done keys).

        Effects are kept: they are the receiver's business records.
        """
        with self._lock:
            if retention_seconds is None:
                cursor = self._db.execute("DELETE FROM sim_keys WHERE state = 'done'")
            else:
                cursor = self._db.execute(
                    "DELETE FROM sim_keys WHERE state = 'done' AND created_at <= ?",
                    (time.time() - retention_seconds,),
                )
            return cursor.rowcount

    def stats(self) -> dict[str, Any]:
        with self._lock:
            per_key = dict(
                self._db.execute(
                    "SELECT key, COUNT(*) FROM sim_effects WHERE key IS NOT NULL GROUP BY key"
                ).fetchall()
            )
            total = self._db.execute("SELECT COUNT(*) FROM sim_effects").fetchone()[0]
            counters = dict(self._db.execute("SELECT name, value FROM sim_counters").fetchall())
            keys = self._db.execute("SELECT COUNT(*) FROM sim_keys").fetchone()[0]
        faults = {
            name.removeprefix("fault:"): value
            for name, value in counters.items()
            if name.startswith("fault:")
        }
        return {
            "effects_per_key": per_key,
            "duplicates": sum(count - 1 for count in per_key.values()),
            "total_effects": total,
            "replays": counters.get("replays", 0),
            "fenced": counters.get("fenced", 0),
            "requests": counters.get("requests", 0),
            "mismatches": counters.get("mismatches", 0),
            "in_flight_conflicts": counters.get("in_flight_conflicts", 0),
            "faults": faults,
            "keys_retained": keys,
        }
