"""Hygiene and the seed 001 "Access control/encryption/logging" checklist line, with the
real daemon running as the dispatcher role (a login role granted it) under FORCED RLS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import api, db
from outbox.tenancy import reveal_payload
from tests.dispatcher import PROVIDER, assert_once_each
from tests.security import SecureDb, as_role, outcome, secure_db  # noqa: F401  (fixture)
from tests.support.daemon import http_provider, run_once, status_counts, write_config
from tests.support.sim import SimProcess

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
CANARY = "canary-0b5e2a91-payload"


@pytest.mark.postgres
def test_release_checklist_access_control_encryption_logging(
    secure_db: SecureDb, tmp_path: Path  # noqa: F811
) -> None:
    """Cross-tenant access is blocked; access to bodies is logged; payloads never reach
    logs or ``outboxd status``. Encryption: in transit through the URL's ``sslmode``
    (libpq options pass through, see docs/security.md); envelope encryption of payloads
    and receipts at rest is tested in ``test_payload_protection.py`` (the canary in
    ``ops show``, the metrics page and ``pg_dump``)."""
    agent = db.create_engine(secure_db.login("agent"))
    owner = db.create_engine(secure_db.url)
    dispatcher_url = secure_db.login("dispatcher")
    try:
        ids = [f"op-{i}" for i in range(5)]
        for tenant in ("A", "B"):
            with agent.begin() as conn:
                api.advance(conn, "task", tenant_id=tenant, expected_revision=0, operations=[
                    api.StagedOperation(i, PROVIDER, {"note": CANARY, "i": n})
                    for n, i in enumerate(ids)])
        with agent.begin() as conn:  # cross-tenant access blocked
            api.get_operation(conn, tenant_id="A", operation_id="op-0")
            seen = conn.exec_driver_sql("SELECT DISTINCT tenant_id FROM outbox_operations").all()
        assert seen == [("A",)]

        with SimProcess(tmp_path) as sim:
            cfg = write_config(tmp_path, dispatcher_url, {PROVIDER: http_provider(sim)},
                               dispatcher={"log_level": "DEBUG", "log_format": "json"})
            result = run_once(cfg)
            assert result.returncode == 0, result.stderr[-3000:]
            assert status_counts(owner) == {"applied": 10}
            assert_once_each(sim, ids, tenant="A")
            assert_once_each(sim, ids, tenant="B")
        logs = result.stdout + result.stderr
        assert "dispatcher started" in logs and CANARY not in logs

        for args in (["status"], ["status", "--json"]):
            shown = subprocess.run(
                [sys.executable, "-m", "dispatcher.cli", *args, "--config", str(cfg)],
                capture_output=True, text=True, timeout=60, check=False)
            assert shown.returncode == 0, shown.stderr
            assert "applied" in shown.stdout
            assert CANARY not in shown.stdout + shown.stderr

        operator = secure_db.roles["operator"]
        assert outcome(owner, operator, "A", "SELECT payload FROM outbox_operations") == "42501"
        with owner.begin() as conn:  # the audited path
            as_role(conn, operator, "A")
            body = reveal_payload(conn, tenant_id="A", operation_id="op-1", actor="alice",
                                  reason="dispute 9")
        assert body == {"note": CANARY, "i": 1}
        with owner.connect() as conn:
            logged = conn.execute(sa.text(
                "SELECT actor, reason FROM outbox_events WHERE kind = 'payload_revealed'"
            )).all()
        assert [tuple(r) for r in logged] == [("alice", "dispute 9")]
        ssl_url = dispatcher_url + "?sslmode=disable"  # TLS settings are libpq's, unchanged
        engine = db.create_engine(ssl_url)
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        finally:
            engine.dispose()
    finally:
        agent.dispose()
        owner.dispose()
