"""Protected payloads end to end: the agent API seals, the database holds only envelopes,
the real dispatcher opens them in memory and sends the plaintext; rotation; a row copied
to another tenant does not open; and the canary line of issue #6: a canary in payloads and
in a provider credential appears nowhere in logs, the metrics page or ``outboxd ops
show``, and ``pg_dump`` holds it only encrypted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.config import load_config, protection_of
from dispatcher.engine.checks import pre_dispatch
from outbox import db, errors
from outbox.api import StagedOperation, advance, enqueue, get_operation
from outbox.digest import payload_digest
from outbox.protection import envelopes as protect
from outbox.protection.envelopes import (
    ENVELOPE_KEY,
    KeyRing,
    Protection,
    envelope_key_id,
    generate_key,
)
from outbox.states import OperationStatus
from providers.registry import build_provider
from tests.dispatcher import assert_once_each, key_of, sim_bodies, wire_sha256
from tests.observability import http_get, metrics_port
from tests.support.daemon import (
    REPO_ROOT,
    DaemonProcess,
    http_provider,
    run_once,
    status_counts,
    wait_until,
    write_config,
)
from tests.support.sim import SimProcess

TENANT = "t1"
PROVIDER = "sim"
PAYLOAD_CANARY = "canary-5d0c7e13-protected-payload"
CREDENTIAL_CANARY = "canary-a4e9b2f0-provider-credential"
CONTROL_CANARY = "canary-91c3f6d8-unprotected-control"


def _protection(active: str = "k1", **keys: str) -> Protection:
    return Protection.from_references(
        {kid: f"env:{var}" for kid, var in (keys or {"k1": "KEK1"}).items()}, active,
        {PROVIDER}, environ=dict(_KEYS))


_KEYS = {"KEK1": generate_key(), "KEK2": generate_key()}


def _raw(engine: sa.Engine, column: str, operation_id: str, tenant: str = TENANT) -> Any:
    with engine.connect() as conn:
        value = conn.execute(sa.text(
            f"SELECT {column} FROM outbox_operations WHERE tenant_id = :t AND operation_id = :o"),
            {"t": tenant, "o": operation_id}).scalar_one()
    return json.loads(value) if isinstance(value, str) else value


def _append_protection(cfg: Path, active: str, keys: dict[str, str]) -> None:
    refs = ", ".join(f'"{kid}" = "env:{var}"' for kid, var in keys.items())
    with cfg.open("a") as fh:
        fh.write(f'\n[protection]\nactive_key = "{active}"\nkeys = {{ {refs} }}\n')


def test_api_seals_protected_providers_and_digests_the_plaintext(db_url: str) -> None:
    engine = db.create_engine(db_url)
    prot = _protection()
    body = {"note": PAYLOAD_CANARY, "amount": 12.5}
    try:
        with engine.begin() as conn:
            rec = enqueue(conn, tenant_id=TENANT, task_id="task", operation_id="op-1",
                          provider=PROVIDER, payload=body, protection=prot)
            enqueue(conn, tenant_id=TENANT, task_id="task", operation_id="op-plain",
                    provider="other", payload={"note": CONTROL_CANARY}, protection=prot)
        stored = _raw(engine, "payload", "op-1")
        assert envelope_key_id(stored) == "k1" and PAYLOAD_CANARY not in json.dumps(stored)
        assert rec.payload_digest == payload_digest(body)  # approvals bind to the plaintext
        assert _raw(engine, "payload", "op-plain") == {"note": CONTROL_CANARY}
        with engine.begin() as conn:  # the same operation again: idempotent, not a mismatch
            again = enqueue(conn, tenant_id=TENANT, task_id="task", operation_id="op-1",
                            provider=PROVIDER, payload=dict(body), protection=prot)
            assert again.id == rec.id
        with engine.begin() as conn, pytest.raises(errors.PayloadMismatch):
            enqueue(conn, tenant_id=TENANT, task_id="task", operation_id="op-1",
                    provider=PROVIDER, payload={"note": "other"}, protection=prot)
        with engine.begin() as conn, pytest.raises(errors.InvalidPayload, match="reserved"):
            enqueue(conn, tenant_id=TENANT, task_id="task", operation_id="op-2",
                    provider=PROVIDER, payload={ENVELOPE_KEY: {}}, protection=prot)
        protect.configure(prot)  # the process default, for agents that stage deep inside
        try:
            with engine.begin() as conn:
                advance(conn, "task-2", tenant_id=TENANT, expected_revision=0, operations=[
                    StagedOperation("op-3", PROVIDER, {"note": PAYLOAD_CANARY})])
        finally:
            protect.configure(None)
        assert envelope_key_id(_raw(engine, "payload", "op-3")) == "k1"
    finally:
        engine.dispose()


def test_pre_dispatch_opens_in_memory_and_refuses_what_it_cannot_open(db_url: str) -> None:
    engine = db.create_engine(db_url)
    prot = _protection()
    body = {"note": PAYLOAD_CANARY}
    providers = {PROVIDER: build_provider(PROVIDER, {"kind": "null"})}
    try:
        with engine.begin() as conn:
            for tenant in ("A", "B"):
                enqueue(conn, tenant_id=tenant, task_id="task", operation_id="op-1",
                        provider=PROVIDER, payload=body, protection=prot)
        with engine.begin() as conn:  # as the owner: copy A's envelope into a new row of B
            conn.execute(sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                "payload, payload_digest) SELECT 'B', task_id, 'op-copied', provider, payload, "
                "payload_digest FROM outbox_operations WHERE tenant_id = 'A'"))
        with engine.connect() as conn:
            op_a = get_operation(conn, tenant_id="A", operation_id="op-1")
            copied = get_operation(conn, tenant_id="B", operation_id="op-copied")

        def check(op: Any, protection: Protection | None) -> Any:
            return pre_dispatch(op, providers=providers, max_payload_bytes=262144, margin=0.1,
                                now=datetime.now(UTC), protection=protection)

        ok = check(op_a, prot)
        assert ok.status is None and ok.payload == body and ok.digest == payload_digest(body)
        assert op_a.payload != body  # the record itself still holds the envelope
        missing = check(op_a, None)
        assert (missing.status, missing.reason) == (OperationStatus.BLOCKED,
                                                    protect.PAYLOAD_KEY_UNAVAILABLE)
        other = Protection(KeyRing({"k1": os.urandom(32)}, "k1"), frozenset({PROVIDER}))
        wrong = check(op_a, other)
        assert (wrong.status, wrong.reason) == (OperationStatus.BLOCKED,
                                                protect.PAYLOAD_UNDECRYPTABLE)
        swapped = check(copied, prot)  # B's data key and B's row: A's ciphertext is refused
        assert swapped.reason == protect.PAYLOAD_UNDECRYPTABLE
        for verdict in (missing, wrong, swapped):
            assert PAYLOAD_CANARY not in str(verdict.detail)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_rows_written_under_the_old_key_are_dispatched_after_rotation(
    db_url: str, tmp_path: Path
) -> None:
    engine = db.create_engine(db_url)
    bodies = {f"op-{i}": {"note": PAYLOAD_CANARY, "i": i, "z": "last", "a": "first"}
              for i in range(8)}
    try:
        with engine.begin() as conn:  # before the rotation: k1 is the only key
            advance(conn, "task-old", tenant_id=TENANT, expected_revision=0, operations=[
                StagedOperation(o, PROVIDER, bodies[o]) for o in list(bodies)[:4]],
                protection=_protection())
        with SimProcess(tmp_path) as sim:
            cfg = write_config(tmp_path, db_url, {PROVIDER: {
                **http_provider(sim), "protect_payloads": True}})
            _append_protection(cfg, "k2", {"k1": "KEK1", "k2": "KEK2"})
            rotated = protection_of(load_config(cfg, {}), _KEYS)  # the agent reads it too
            assert rotated is not None and rotated.ring.active == "k2"
            with engine.begin() as conn:
                advance(conn, "task-new", tenant_id=TENANT, expected_revision=0, operations=[
                    StagedOperation(o, PROVIDER, bodies[o]) for o in list(bodies)[4:]],
                    protection=rotated)
            kids = {o: envelope_key_id(_raw(engine, "payload", o)) for o in bodies}
            assert sorted(kids.values()) == ["k1"] * 4 + ["k2"] * 4

            result = run_once(cfg, env=_KEYS)
            assert result.returncode == 0, result.stderr[-3000:]
            assert status_counts(engine) == {"applied": 8}
            assert_once_each(sim, bodies, tenant=TENANT)
            sent = sim_bodies(sim)  # the receiver got the plaintext, byte for byte
            for o, body in bodies.items():
                assert sent[key_of(o, TENANT)] == [wire_sha256(body)]
        for o in bodies:  # receipts are sealed under the active key; payloads keep theirs
            assert envelope_key_id(_raw(engine, "receipt", o)) == "k2"
            assert envelope_key_id(_raw(engine, "payload", o)) == kids[o]
        logs = result.stdout + result.stderr
        assert PAYLOAD_CANARY not in logs
    finally:
        engine.dispose()


def _pg_dump() -> str:
    found = shutil.which("pg_dump")
    if found is None:
        from tests.support.pgcluster import server_binaries

        bindir = server_binaries()
        if bindir is not None and (bindir / "pg_dump").is_file():
            found = str(bindir / "pg_dump")
    if found is None:
        message = "pg_dump NOT FOUND: install postgresql-client"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: this check may not be skipped)")
        pytest.skip(message)
    return found


def _outboxd(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", *args, "--config", str(config)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.postgres
@pytest.mark.slow
def test_canary_in_payloads_and_credentials_is_nowhere_in_the_clear(
    pg_url: str, tmp_path: Path
) -> None:
    pg_dump = _pg_dump()
    engine = db.create_engine(pg_url)
    ids = [f"op-{i}" for i in range(6)]
    env = {**_KEYS, "CANARY_TOKEN": f"Bearer {CREDENTIAL_CANARY}"}
    try:
        with engine.begin() as conn:
            advance(conn, "task", tenant_id=TENANT, expected_revision=0, operations=[
                *(StagedOperation(o, PROVIDER, {"note": PAYLOAD_CANARY, "n": n})
                  for n, o in enumerate(ids)),
                StagedOperation("op-control", "plain", {"note": CONTROL_CANARY})],
                protection=_protection())
        with SimProcess(tmp_path) as sim:
            cfg = write_config(
                tmp_path, pg_url,
                {PROVIDER: {**http_provider(sim), "protect_payloads": True,
                            "headers": {"Authorization": "env:CANARY_TOKEN"}},
                 "plain": http_provider(sim)},
                dispatcher={"log_level": "DEBUG", "log_format": "json"},
                metrics={"enabled": True, "port": 0, "gauge_refresh_seconds": 0.2})
            _append_protection(cfg, "k1", {"k1": "KEK1"})
            with DaemonProcess(cfg, env=env) as daemon:
                port = metrics_port(daemon)
                wait_until(lambda: status_counts(engine).get("applied") == 7,
                           message="every operation applied")
                code, page, _ = http_get(f"http://127.0.0.1:{port}/metrics")
                assert code == 200 and b"outbox_" in page
                assert daemon.stop() == 0
                logs = daemon.log_text()
            assert_once_each(sim, ids, tenant=TENANT)

        assert "dispatch outcome" in logs
        for canary in (PAYLOAD_CANARY, CREDENTIAL_CANARY, CONTROL_CANARY):
            assert canary not in logs
            assert canary.encode() not in page

        shown = [_outboxd("ops", *a, config=cfg) for a in (
            ("show", "op-1"), ("show", "op-1", "--json"), ("list",),
            ("show", "op-1", "--show-payload", "--actor", "alice", "--reason", "audit"))]
        for result in shown:
            assert result.returncode == 0, result.stderr
            for canary in (PAYLOAD_CANARY, CREDENTIAL_CANARY):
                assert canary not in result.stdout + result.stderr
        assert ENVELOPE_KEY in shown[-1].stdout  # the audited read shows only ciphertext

        dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
        dump = subprocess.run([pg_dump, "--no-owner", "--dbname", dsn], capture_output=True,
                              text=True, timeout=120, check=True).stdout
        assert CONTROL_CANARY in dump  # the control: an unprotected body is in the clear
        assert PAYLOAD_CANARY not in dump and CREDENTIAL_CANARY not in dump
        assert dump.count(ENVELOPE_KEY) >= 2 * len(ids)  # payloads and receipts
        # ... and the canary is in there, encrypted: the key ring opens every row's envelope
        prot = _protection()
        with engine.connect() as conn:
            for o in ids:
                op = get_operation(conn, tenant_id=TENANT, operation_id=o)
                assert prot.open_payload(op)["note"] == PAYLOAD_CANARY
                assert isinstance(prot.open_receipt(op), dict)
    finally:
        engine.dispose()
