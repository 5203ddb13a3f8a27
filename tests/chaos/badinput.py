"""Bad input at volume: rows written by plain SQL, malformed on purpose, mixed with good ones.

:func:`generate` makes ``rows`` seeded rows of the kinds in :data:`KINDS`: good rows (plain,
every nullable column an explicit NULL, unicode and nesting, an empty object, long strings
in the text columns, the same ``operation_id`` under a second tenant) and malformed ones
(a JSON array / string / number / boolean / null payload, unknown providers, payloads
over ``max_payload_bytes``, credentials in the payload, a wrong stored digest, a missing
artifact, an approval that was never given, a header-unsafe operation id or traceparent,
NUL bytes, non-finite numbers, text that is not JSON, NULL in a NOT NULL column, a status
the writer may not set, and on PostgreSQL a row for a foreign tenant written through the
agent role scoped to another tenant). :func:`insert` writes them with raw ``INSERT``
statements, as an agent in another language would — each malformed row in a transaction
of its own, because the database itself refuses some of them (that refusal is the
expected outcome, per dialect, in :class:`Kind`). :func:`run` then starts real ``outboxd
run`` replicas against the real database and ``outboxd sim``, waits until nothing is left
to dispatch, and checks:

* no replica crashed (each still running, and exits 0 on SIGTERM);
* every malformed row that the database accepted is parked (``blocked`` or ``rejected``)
  with the expected reason and has no effect at the receiver;
* every good row is ``applied``, with exactly one effect under its own key.

The CI test (:mod:`tests.chaos.test_bad_input`) runs a few thousand rows;
``python -m tests.chaos.badinput --rows 100000`` runs the soak size and prints the time
the good rows took next to a run of good rows alone (the throughput comparison).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, migrate
from outbox.digest import default_idempotency_key
from tests.support.daemon import DaemonProcess, http_provider, status_counts, write_config
from tests.support.sim import SimProcess

TENANT = "t1"
OTHER_TENANT = "t2"
PROVIDER = "sim"
MAX_PAYLOAD_BYTES = 4096
AWS_KEY = "AKIA" + "Q3V7ZK2M9XW4B8TR"
NON_FINAL = ("pending", "claimed", "dispatching", "unknown")
REFUSED = "refused"  # the database (or its driver) refused the INSERT
APPLIED = "applied"

Columns = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    name: str
    make: Callable[[int, random.Random], Columns]
    postgres: str  # expected outcome: "applied", "refused", or "<status>:<reason>"
    sqlite: str
    weight: int = 1
    raw_payload: bool = False  # ``payload`` is SQL text as written, not a value to encode

    def expected(self, dialect: str) -> str:
        return self.postgres if dialect == "postgresql" else self.sqlite


def _same(outcome: str) -> tuple[str, str]:
    return outcome, outcome


def _k(name: str, make: Callable[[int, random.Random], Columns], outcomes: tuple[str, str],
       weight: int = 1, raw: bool = False) -> Kind:
    return Kind(name, make, outcomes[0], outcomes[1], weight, raw)


KINDS: tuple[Kind, ...] = (
    # -- good rows ---------------------------------------------------------------------
    _k("good", lambda i, r: {"payload": {"n": i, "note": "hello"}}, _same(APPLIED), 30),
    _k("good-nulls", lambda i, r: {
        "payload": {"n": i}, "payload_ref": None, "payload_digest": None,
        "idempotency_key": None, "deadline_at": None, "ordering_key": None,
        "max_attempts": None, "max_elapsed_seconds": None, "workflow_version": None,
        "payload_schema": None, "traceparent": None}, _same(APPLIED), 6),
    _k("good-unicode", lambda i, r: {"payload": {
        "text": "h\u00e9llo \u2713 \U0001d11e \u05e9\u05dc\u05d5\u05dd", "n": i,
        "nested": {"a": [1, {"b": None, "c": [True, False]}], "e": {}},
        "float": r.random(), "big": 2 ** 53 - 1}}, _same(APPLIED), 5),
    _k("good-empty", lambda i, r: {"payload": {}}, _same(APPLIED), 2),
    _k("good-long-strings", lambda i, r: {
        "payload": {"n": i}, "task_id": f"long-{i}-" + "t" * 2000,
        "traceparent": "x" * 8000}, _same(APPLIED), 2),
    # the same operation id under a second tenant: its own key, its own effect
    _k("good-foreign-tenant", lambda i, r: {"payload": {"n": i}, "tenant_id": OTHER_TENANT,
                                            "operation_id": f"good-{i:07d}"},
       _same(APPLIED), 3),
    # NUL: PostgreSQL refuses it in jsonb and in text; SQLite stores and sends it
    _k("nul-in-json", lambda i, r: {"payload": {"s": "a\u0000b", "n": i}},
       (REFUSED, APPLIED)),
    _k("nul-in-text", lambda i, r: {"payload": {"n": i}, "task_id": f"nul\x00task-{i}"},
       (REFUSED, APPLIED)),
    # -- malformed rows --------------------------------------------------------------
    _k("bad-array", lambda i, r: {"payload": [1, 2, i]},
       _same("blocked:payload_not_object"), 2),
    _k("bad-string", lambda i, r: {"payload": f"just text {i}"},
       _same("blocked:payload_not_object")),
    _k("bad-number", lambda i, r: {"payload": i}, _same("blocked:payload_not_object")),
    _k("bad-bool", lambda i, r: {"payload": True}, _same("blocked:payload_not_object")),
    _k("bad-json-null", lambda i, r: {"payload": None, "payload_sql_null": False},
       _same("blocked:payload_not_object")),
    _k("bad-provider", lambda i, r: {"payload": {"n": i}, "provider": f"nope-{i % 7}"},
       _same("blocked:unknown_provider"), 2),
    _k("bad-huge", lambda i, r: {"payload": {"blob": "x" * (MAX_PAYLOAD_BYTES * 3)}},
       _same("blocked:payload_too_large")),
    _k("bad-huge-nested", lambda i, r: {"payload": {"list": [{"v": "y" * 100}] * 80}},
       _same("blocked:payload_too_large")),
    _k("bad-aws-key", lambda i, r: {"payload": {"note": f"use {AWS_KEY} please", "n": i}},
       _same("blocked:credential_in_payload")),
    _k("bad-password", lambda i, r: {"payload": {"user": {"password": "hunter2hunter2"}}},
       _same("blocked:credential_in_payload")),
    _k("bad-digest", lambda i, r: {"payload": {"n": i}, "payload_digest": "sha256:" + "0" * 64},
       _same("blocked:digest_mismatch")),
    _k("bad-artifact", lambda i, r: {
        "payload": None, "payload_sql_null": True, "payload_ref": f"s3://nowhere/{i}",
        "payload_digest": "sha256:" + "1" * 64}, _same("blocked:artifact_missing")),
    _k("bad-no-approval", lambda i, r: {"payload": {"n": i}, "requires_approval": True},
       _same("blocked:approval_missing")),
    # header-unsafe values: refused before anything is written (never ambiguous)
    _k("bad-header-traceparent", lambda i, r: {"payload": {"n": i},
                                               "traceparent": "00-abc\r\nX-Evil: 1"},
       _same("rejected:"), 1),
    _k("bad-header-op-id", lambda i, r: {"payload": {"n": i},
                                         "operation_id": f"bad-header-op-id-\u00fc-{i:07d}"},
       _same("rejected:")),
    # text that JSON does not allow: jsonb on PostgreSQL, a json_valid CHECK on SQLite
    _k("bad-nan", lambda i, r: {"payload": f'{{"a": NaN, "n": {i}}}'}, _same(REFUSED),
       raw=True),
    _k("bad-not-json", lambda i, r: {"payload": f'{{"unterminated": {i}'}, _same(REFUSED),
       raw=True),
    # the database's own constraints
    _k("bad-null-provider", lambda i, r: {"payload": {"n": i}, "provider": None},
       _same(REFUSED)),
    _k("bad-null-payload-and-ref", lambda i, r: {"payload": None, "payload_sql_null": True},
       _same(REFUSED)),
    _k("bad-status", lambda i, r: {"payload": {"n": i}, "status": "dispatching"},
       _same(REFUSED)),
    _k("bad-status-unknown", lambda i, r: {"payload": {"n": i}, "status": "bogus"},
       _same(REFUSED)),
    # a row for another tenant through the agent role scoped to this one (PostgreSQL RLS;
    # SQLite is single-tenant: there it is just a row of that tenant)
    _k("foreign-tenant-as-agent", lambda i, r: {"payload": {"n": i}, "tenant_id": "intruder",
                                                "as_agent": True}, (REFUSED, APPLIED)),
)
BY_NAME = {k.name: k for k in KINDS}


@dataclass
class Row:
    kind: Kind
    tenant_id: str
    operation_id: str
    columns: Columns
    outcome: str = ""  # after insert: "inserted" or "refused: <error class>"


def generate(count: int, seed: int) -> list[Row]:
    """``count`` rows: every kind at least once, the rest drawn by weight (seeded)."""
    rng = random.Random(f"badinput:{seed}")
    kinds = list(KINDS) + rng.choices(KINDS, weights=[k.weight for k in KINDS],
                                      k=max(0, count - len(KINDS)))
    rng.shuffle(kinds)
    rows: list[Row] = []
    for i, kind in enumerate(kinds):
        cols = kind.make(i, rng)
        tenant = cols.pop("tenant_id", TENANT)
        op_id = cols.pop("operation_id", f"{kind.name}-{i:07d}")
        rows.append(Row(kind, tenant, op_id, cols))
    return rows


def _statement(engine: Engine, row: Row) -> tuple[str, dict[str, Any]]:
    cols = dict(row.columns)
    cols.pop("as_agent", None)
    sql_null = cols.pop("payload_sql_null", None)
    values: dict[str, Any] = {"tenant_id": row.tenant_id,
                              "task_id": cols.pop("task_id", f"bad-input-{row.tenant_id}"),
                              "operation_id": row.operation_id,
                              "provider": cols.pop("provider", PROVIDER), **cols}
    if "payload" in values:
        payload = values["payload"]
        if sql_null or (payload is None and sql_null is None):
            values["payload"] = None
        elif not row.kind.raw_payload:
            values["payload"] = json.dumps(payload)
    pg = engine.dialect.name == "postgresql"
    names = ", ".join(values)
    params = ", ".join(
        "CAST(:payload AS jsonb)" if n == "payload" and pg and values[n] is not None
        else f":{n}" for n in values)
    return f"INSERT INTO outbox_operations ({names}) VALUES ({params})", values


def insert(engine: Engine, rows: list[Row], *, batch: int = 500) -> Counter[str]:
    """Insert every row with plain SQL. Good rows of plain kinds go in batches; every
    other row in a transaction of its own, so the database's refusal of one row (the
    expected outcome for some kinds) refuses that row only. Returns outcome counts."""
    pg = engine.dialect.name == "postgresql"
    plain = [r for r in rows if r.kind.name in ("good", "good-nulls", "good-empty")]
    single = [r for r in rows if r.kind.name not in ("good", "good-nulls", "good-empty")]
    for start in range(0, len(plain), batch):
        chunk = plain[start:start + batch]
        with engine.begin() as conn:
            for r in chunk:
                sql, values = _statement(engine, r)
                conn.execute(sa.text(sql), values)
                r.outcome = "inserted"
    for r in single:
        sql, values = _statement(engine, r)
        try:
            with engine.begin() as conn:
                if r.columns.get("as_agent") and pg:
                    conn.execute(sa.text("SET LOCAL ROLE outbox_agent"))
                    conn.execute(sa.text("SELECT set_config('outbox.tenant_id', :t, true)"),
                                 {"t": TENANT})
                conn.execute(sa.text(sql), values)
            r.outcome = "inserted"
        except (sa.exc.SQLAlchemyError, psycopg.Error, ValueError) as exc:
            cause = getattr(exc, "orig", None) or exc
            r.outcome = f"refused: {type(cause).__name__}"
    return Counter(r.outcome.split(":")[0] for r in rows)


@dataclass
class Result:
    rows: int
    dialect: str
    seed: int
    inserted: int = 0
    refused: int = 0
    good: int = 0
    bad_parked: int = 0
    seconds_to_settle: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        head = "PASS" if not self.problems else "FAIL"
        lines = [f"{head} bad input seed={self.seed} dialect={self.dialect} rows={self.rows}"
                 f"  reproduce: python -m tests.chaos.badinput --seed {self.seed}"
                 f" --rows {self.rows} --dialect"
                 f" {'postgres' if self.dialect == 'postgresql' else self.dialect}",
                 f"inserted={self.inserted} refused_by_database={self.refused}"
                 f" good_applied={self.good} bad_parked={self.bad_parked}"
                 f" settle_seconds={self.seconds_to_settle:.1f}",
                 f"statuses: {self.statuses}", f"parked reasons: {self.reasons}"]
        lines.extend(f"PROBLEM: {p}" for p in self.problems[:20])
        return "\n".join(lines)


def _config(workdir: Path, url: str, sim: SimProcess, name: str) -> Path:
    provider = http_provider(sim, dedup_retention_seconds=86_400, timeout_seconds=5,
                             in_flight_seconds=5)
    path = write_config(workdir, url, {PROVIDER: provider},
                        dispatcher={"lease_seconds": 10, "batch_size": 100, "concurrency": 32,
                                    "poll_interval_ms": 50}, name=name)
    text = path.read_text()
    path.write_text(text.replace("[database]\n",
                                 f"[database]\nmax_payload_bytes = {MAX_PAYLOAD_BYTES}\n", 1))
    return path


def _effects(sim: SimProcess) -> dict[str, int]:
    return {str(k): int(v) for k, v in sim.stats()["effects_per_key"].items()}


def check(engine: Engine, rows: list[Row], sim: SimProcess, result: Result) -> None:
    dialect = engine.dialect.name
    with engine.connect() as conn:
        found = {(t, o): (s, r, a) for t, o, s, r, a in conn.execute(sa.text(
            "SELECT tenant_id, operation_id, status, status_reason, attempts"
            " FROM outbox_operations")).all()}
    effects = _effects(sim)
    keys = set()
    reasons: Counter[str] = Counter()
    for row in rows:
        want = row.kind.expected(dialect)
        key = default_idempotency_key(row.tenant_id, row.operation_id)
        keys.add(key)
        label = f"{row.kind.name} {row.tenant_id}:{row.operation_id[:60]!r}"
        if want == REFUSED:
            if row.outcome == "inserted":
                result.problems.append(f"{label}: the database accepted it")
            continue
        if row.outcome != "inserted":
            result.problems.append(f"{label}: insert {row.outcome}")
            continue
        got = found.get((row.tenant_id, row.operation_id))
        if got is None:
            result.problems.append(f"{label}: inserted but no row")
            continue
        status, reason, attempts = got
        n = effects.get(key, 0)
        if want == APPLIED:
            if status != "applied" or n != 1:
                result.problems.append(f"{label}: {status} ({reason}), {n} effects")
            else:
                result.good += 1
            continue
        want_status, _, want_reason = want.partition(":")
        ok = (status == want_status and bool(reason)
              and (not want_reason or reason == want_reason) and n == 0)
        if want_status == "blocked" and attempts:
            ok = False  # parked by admission: never sent
        if ok:
            result.bad_parked += 1
            reasons[f"{status}:{reason}"] += 1
        else:
            result.problems.append(f"{label}: {status} ({reason}), {attempts} attempts,"
                                   f" {n} effects; wanted {want}")
    stray = {k: v for k, v in effects.items() if k not in keys}
    if stray:
        result.problems.append(f"effects under keys no row owns: {list(stray)[:3]}")
    result.reasons = dict(sorted(reasons.items()))


def run(url: str, *, rows: int, seed: int, workdir: Path, replicas: int = 2,
        timeout: float | None = None) -> Result:
    """Insert ``rows`` generated rows into the migrated database at ``url``, dispatch them
    with ``replicas`` real daemons against a real ``outboxd sim``, and check."""
    engine = db.create_engine(url)
    result = Result(rows=rows, dialect=engine.dialect.name, seed=seed)
    try:
        generated = generate(rows, seed)
        counts = insert(engine, generated)
        result.inserted, result.refused = counts.get("inserted", 0), counts.get("refused", 0)
        with SimProcess(workdir) as sim:
            conf = _config(workdir, url, sim, "bad-input.toml")
            daemons = [DaemonProcess(conf, env={"OUTBOXD_DISPATCHER_WORKER_ID": f"bad{i}"})
                       for i in range(replicas)]
            try:
                t0 = time.monotonic()
                deadline = t0 + (timeout if timeout is not None else 60 + rows / 20)
                while time.monotonic() < deadline:
                    counts_now = status_counts(engine)
                    if not any(counts_now.get(s, 0) for s in NON_FINAL):
                        break
                    if not all(d.alive() for d in daemons):
                        break
                    time.sleep(0.25)
                result.seconds_to_settle = time.monotonic() - t0
                result.statuses = status_counts(engine)
                if any(result.statuses.get(s, 0) for s in NON_FINAL):
                    result.problems.append(f"not settled: {result.statuses}")
                for d in daemons:
                    if not d.alive():
                        result.problems.append(f"a replica died: {d.log_text()[-1500:]}")
                check(engine, generated, sim, result)
            finally:
                for d in daemons:
                    if d.alive():
                        code = d.stop()
                        if code != 0:
                            result.problems.append(f"a replica exited {code} on SIGTERM:"
                                                   f" {d.log_text()[-1500:]}")
                    if d._log is not None:
                        d._log.close()
                for d in daemons:
                    if "Traceback" in d.log_text():
                        result.problems.append("a replica logged a traceback: "
                                               + d.log_text()[-2000:])
                        break
    finally:
        engine.dispose()
    return result


def _database(dialect: str, workdir: Path) -> tuple[str, Callable[[], None]]:
    if dialect == "sqlite":
        url = f"sqlite:///{workdir / 'outbox.db'}"
        eng = db.create_engine(url)
        migrate.upgrade(eng)
        eng.dispose()
        return url, lambda: None
    from tests.support.pgcluster import ThrowawayCluster

    cluster = ThrowawayCluster(workdir / "pg")
    cluster.start()
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE outbox")
    url = cluster.url("outbox")
    eng = db.create_engine(url)
    migrate.upgrade(eng)
    eng.dispose()
    return url, cluster.cleanup


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.badinput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dialect", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--compare", action="store_true",
                   help="also time the same number of good rows alone (throughput ratio)")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="outboxd-badinput-"))
    url, cleanup = _database(args.dialect, workdir)
    try:
        result = run(url, rows=args.rows, seed=args.seed, workdir=workdir,
                     replicas=args.replicas, timeout=3600)
    finally:
        cleanup()
    print(result.summary(), flush=True)
    if args.compare and not result.problems:
        clean = Path(tempfile.mkdtemp(prefix="outboxd-badinput-clean-"))
        url, cleanup = _database(args.dialect, clean)
        try:
            good_only = _good_only(url, result.good, args.seed, clean, args.replicas)
        finally:
            cleanup()
        print(f"throughput: {result.good} good rows among {args.rows} mixed rows settled in"
              f" {result.seconds_to_settle:.1f} s; {result.good} good rows alone in"
              f" {good_only:.1f} s (ratio {result.seconds_to_settle / good_only:.2f})")
        shutil.rmtree(clean, ignore_errors=True)
    if result.problems:
        print(f"work directory kept: {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _good_only(url: str, count: int, seed: int, workdir: Path, replicas: int) -> float:
    """Seconds the same daemons take for ``count`` plain good rows alone."""
    rows = [Row(BY_NAME["good"], TENANT, f"good-{i:07d}", {"payload": {"n": i}})
            for i in range(count)]
    engine = db.create_engine(url)
    insert(engine, rows)
    engine.dispose()
    result = run_prepared(url, rows, seed=seed, workdir=workdir, replicas=replicas)
    return result.seconds_to_settle


def run_prepared(url: str, rows: list[Row], *, seed: int, workdir: Path,
                 replicas: int) -> Result:
    """:func:`run` for rows already inserted (the good-rows-alone comparison)."""
    engine = db.create_engine(url)
    result = Result(rows=len(rows), dialect=engine.dialect.name, seed=seed)
    with SimProcess(workdir) as sim:
        conf = _config(workdir, url, sim, "good-only.toml")
        daemons = [DaemonProcess(conf) for _ in range(replicas)]
        t0 = time.monotonic()
        while any(status_counts(engine).get(s, 0) for s in NON_FINAL):
            time.sleep(0.25)
        result.seconds_to_settle = time.monotonic() - t0
        for d in daemons:
            d.stop()
            if d._log is not None:
                d._log.close()
    engine.dispose()
    return result


if __name__ == "__main__":
    sys.exit(main())
