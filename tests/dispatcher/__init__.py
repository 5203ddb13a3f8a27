"""End-to-end tests of the dispatcher: real ``outboxd`` processes, real signals, a real
``outboxd sim`` receiver, real databases. Shared helpers live here (no mocks).

Assertions are on the receiver's ledger (``effects_per_key``, ``duplicates``) and on the
records (``outbox_operations``, ``outbox_attempts``, ``outbox_events``), never on log text.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, schema
from outbox.api import StagedOperation, advance
from outbox.digest import default_idempotency_key
from tests.support.daemon import REPO_ROOT, http_provider, status_counts, write_config

TENANT = "t1"
PROVIDER = "sim"


def engine_for(url: str) -> Engine:
    return db.create_engine(url)


def stage(
    engine: Engine,
    count: int,
    *,
    prefix: str = "op",
    provider: str = PROVIDER,
    tenant: str = TENANT,
    task: str | None = None,
    per_task: int = 500,
    start: int = 0,
    **options: Any,
) -> list[str]:
    """Stage ``count`` operations through the agent API (``advance``), ``per_task`` per
    task transition. Returns the operation ids in insertion order."""
    ids = [f"{prefix}-{i:05d}" for i in range(start, start + count)]
    for n, chunk_start in enumerate(range(0, count, per_task)):
        chunk = ids[chunk_start : chunk_start + per_task]
        with engine.begin() as conn:
            advance(
                conn,
                task or f"{prefix}-task-{start}-{n}",
                tenant_id=tenant,
                expected_revision=0,
                phase="staged",
                operations=[
                    StagedOperation(
                        operation_id=op_id,
                        provider=provider,
                        payload={"n": i, "op": op_id, "note": "hello"},
                        **options,
                    )
                    for i, op_id in enumerate(chunk, start=chunk_start + start)
                ],
            )
    return ids


def key_of(operation_id: str, tenant: str = TENANT) -> str:
    return default_idempotency_key(tenant, operation_id)


def rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(sql), params).mappings()]


def _select(engine: Engine, table: sa.Table, operation_id: str | None) -> list[dict[str, Any]]:
    """Typed rows (JSON columns decoded on both dialects), in id order."""
    query = sa.select(table).order_by(table.c.id)
    if operation_id is not None:
        query = query.where(table.c.operation_id == operation_id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def operations(engine: Engine) -> dict[str, dict[str, Any]]:
    return {r["operation_id"]: r for r in _select(engine, schema.operations, None)}


def operation(engine: Engine, operation_id: str) -> dict[str, Any]:
    found = _select(engine, schema.operations, operation_id)
    assert len(found) == 1, operation_id
    return found[0]


def status_of(engine: Engine, operation_id: str) -> str:
    return str(operation(engine, operation_id)["status"])


def attempts_of(engine: Engine, operation_id: str | None = None) -> list[dict[str, Any]]:
    return _select(engine, schema.attempts, operation_id)


def events_of(engine: Engine, operation_id: str | None = None) -> list[dict[str, Any]]:
    return _select(engine, schema.events, operation_id)


def transitions(engine: Engine, operation_id: str) -> list[tuple[str | None, str | None]]:
    return [(e["from_status"], e["to_status"]) for e in events_of(engine, operation_id)]


def effects(sim: Any) -> dict[str, int]:
    stats = sim.stats()
    return {str(k): int(v) for k, v in stats["effects_per_key"].items()}


def assert_once_each(sim: Any, operation_ids: Iterable[str], tenant: str = TENANT) -> None:
    """The receiver holds exactly one effect for every key, and no duplicates at all."""
    stats = sim.stats()
    per_key = stats["effects_per_key"]
    wanted = [key_of(o, tenant) for o in operation_ids]
    missing = [k for k in wanted if per_key.get(k, 0) == 0]
    repeated = {k: per_key[k] for k in wanted if per_key.get(k, 0) > 1}
    assert not missing, f"{len(missing)} keys never applied, e.g. {missing[:5]}"
    assert not repeated, f"duplicate effects: {dict(list(repeated.items())[:5])}"
    assert stats["duplicates"] == 0


def fencing_monotonic(engine: Engine) -> list[str]:
    """Problems with fencing in the records (empty when none): per operation, the tokens of
    successive claims strictly increase in event order, and the attempts' tokens never go
    down by attempt number."""
    problems: list[str] = []
    claims: dict[str, list[int]] = {}
    for e in events_of(engine):
        if e["to_status"] == "claimed" and e["from_status"] == "pending":
            claims.setdefault(e["operation_id"], []).append(int(e["fencing_token"] or 0))
    for op_id, tokens in claims.items():
        if any(b <= a for a, b in itertools.pairwise(tokens)):
            problems.append(f"{op_id}: claim tokens {tokens}")
    by_op: dict[str, list[tuple[int, int]]] = {}
    for a in attempts_of(engine):
        by_op.setdefault(a["operation_id"], []).append(
            (int(a["attempt"]), int(a["fencing_token"] or 0))
        )
    for op_id, pairs in by_op.items():
        tokens = [t for _, t in sorted(pairs)]
        if any(b < a for a, b in itertools.pairwise(tokens)):
            problems.append(f"{op_id}: attempt tokens {sorted(pairs)}")
    return problems


def one_of(values: Sequence[Any]) -> Any:
    assert len(values) == 1, values
    return values[0]


def drain_once(config: Path, *, timeout: float = 60, env: dict[str, str] | None = None) -> str:
    """``outboxd run --once`` to completion; returns its output. On a hang, the process's
    thread stacks (faulthandler on SIGABRT) are put in the failure message."""
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "run", "--once", "--config", str(config)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        out, _ = process.communicate()
        raise AssertionError(f"`outboxd run --once` hung:\n{out[-8000:]}") from None
    assert process.returncode == 0, out[-4000:]
    return out


FAST_PROVIDER = {"timeout_seconds": 1, "in_flight_seconds": 1.5}
"""Short receiver timings, so that a not-found look-up counts soon after a crash."""


def config(
    directory: Path,
    db_url: str,
    sim: Any,
    *,
    lease_seconds: float = 1.0,
    worker_id: str | None = None,
    name: str | None = None,
    database: dict[str, Any] | None = None,
    dispatcher: dict[str, Any] | None = None,
    **provider: Any,
) -> Path:
    """A config for one replica against ``sim`` with short leases (a provider key given
    as None is left out)."""
    settings: dict[str, Any] = {"lease_seconds": lease_seconds, **(dispatcher or {})}
    if worker_id is not None:
        settings["worker_id"] = worker_id
    section = http_provider(sim, **{**FAST_PROVIDER, **provider})
    path = write_config(
        directory,
        db_url,
        {PROVIDER: {k: v for k, v in section.items() if v is not None}},
        dispatcher=settings,
        name=name,
    )
    if database:
        text = path.read_text()
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in database.items())
        path.write_text(text.replace("[database]\n", "[database]\n" + extra, 1))
    return path


def failpoints(spec: str) -> dict[str, str]:
    return {"OUTBOXD_FAILPOINTS": spec, "PYTHONFAULTHANDLER": "1"}


def is_stopped(pid: int) -> bool:
    """The process is stopped by a signal (state ``T`` in ``/proc/PID/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def db_now(engine: Engine) -> datetime:
    from dispatcher.store import store_for

    with engine.connect() as conn:
        return store_for(engine.dialect.name).db_now(conn)


def sim_bodies(sim: Any) -> dict[str, list[str]]:
    """The sha256 of every request body the receiver applied, per key (its ledger file)."""
    with contextlib.closing(sqlite3.connect(sim.ledger_path)) as conn:
        found: dict[str, list[str]] = {}
        for key, digest in conn.execute("SELECT key, body_sha256 FROM sim_effects ORDER BY seq"):
            found.setdefault(key, []).append(digest)
        return found


def sim_order(sim: Any) -> list[str]:
    """Keys in the order the receiver applied their effects."""
    with contextlib.closing(sqlite3.connect(sim.ledger_path)) as conn:
        return [k for (k,) in conn.execute("SELECT key FROM sim_effects ORDER BY seq")]


def wire_sha256(payload: Any) -> str:
    """The digest of the body the http provider sends for ``payload``."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(body).hexdigest()


def all_status(engine: Engine, status: str, total: int) -> Callable[[], bool]:
    return lambda: status_counts(engine).get(status, 0) == total


def on(dialect: str, *values: Any) -> Any:
    """A parametrize entry that runs on one dialect (``postgres`` entries carry the
    ``postgres`` mark), for tests too slow to run on both; see :func:`url_for`."""
    marks = [pytest.mark.postgres] if dialect == "postgres" else []
    return pytest.param(dialect, *values, marks=marks, id="-".join([dialect, *map(str, values)]))


def both(*values: Any) -> list[Any]:
    """The same scenario on each dialect: every dispatcher scenario runs on both."""
    return [on("sqlite", *values), on("postgres", *values)]


def url_for(request: pytest.FixtureRequest, dialect: str) -> str:
    url = request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url")
    assert isinstance(url, str)
    return url


@contextlib.contextmanager
def engine_at(url: str) -> Iterator[Engine]:
    engine = engine_for(url)
    try:
        yield engine
    finally:
        engine.dispose()
