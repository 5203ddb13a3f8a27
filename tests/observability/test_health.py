"""``/healthz`` and ``/readyz``: readiness follows the database (migrations current) and
the providers; several replicas run side by side on one host with ``port = 0``."""

from __future__ import annotations

import json
import signal
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from dispatcher.config import load_config
from dispatcher.daemon import Daemon
from dispatcher.observability import endpoint
from outbox import db, migrate
from tests.observability import http_get, http_json, json_lines, metrics_port
from tests.support.daemon import DaemonProcess, wait_until, write_config

NULL_PROVIDER = {"sink": {"kind": "null"}}


def _ready(port: int) -> bool:
    return http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200


def test_readyz_is_503_until_the_database_is_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    cfg = load_config(write_config(tmp_path, url, NULL_PROVIDER), env={})
    daemon = Daemon(cfg)
    server = endpoint.serve("127.0.0.1", 0, daemon.health)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        code, body = http_json(f"{base}/readyz")
        assert code == 503 and body["ready"] is False
        assert body["problem"].startswith("migrations:") and "not migrated" in body["problem"]
        # alive all the same: a restart would not migrate the database
        code, body = http_json(f"{base}/healthz")
        assert code == 200 and body["alive"] is True

        migrate.upgrade(daemon.engine)
        assert http_json(f"{base}/readyz") == (
            200, {"ready": True, "problem": None, "warnings": []})
    finally:
        server.shutdown()
        server.server_close()
        daemon.worker.close()
        daemon.engine.dispose()


def test_readyz_without_providers_and_healthz_when_the_loop_is_wedged(
    sqlite_url: str, tmp_path: Path
) -> None:
    cfg = load_config(write_config(tmp_path, sqlite_url, NULL_PROVIDER), env={})
    daemon = Daemon(cfg, providers={})
    daemon.health.wedged_after = 0.2  # the loop is not running in this test: it "wedges"
    server = endpoint.serve("127.0.0.1", 0, daemon.health)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        assert http_json(f"{base}/readyz") == (
            503, {"ready": False, "problem": "no providers configured", "warnings": []})
        daemon.health.beat()
        assert http_json(f"{base}/healthz")[0] == 200
        wait_until(lambda: http_json(f"{base}/healthz")[0] == 503, timeout=10,
                   message="/healthz to report the wedged loop")
        assert http_json(f"{base}/healthz")[1]["alive"] is False
    finally:
        server.shutdown()
        server.server_close()
        daemon.worker.close()
        daemon.engine.dispose()


@pytest.mark.slow
def test_replicas_side_by_side_with_port_zero(sqlite_url: str, tmp_path: Path) -> None:
    metrics = {"enabled": True, "host": "127.0.0.1", "port": 0}
    configs = [
        write_config(tmp_path, sqlite_url, NULL_PROVIDER, metrics=metrics,
                     dispatcher={"worker_id": f"replica-{i}"})
        for i in (1, 2)
    ]
    with DaemonProcess(configs[0]) as one, DaemonProcess(configs[1]) as two:
        ports = [metrics_port(one), metrics_port(two)]
        assert ports[0] != ports[1]
        for port in ports:
            assert http_json(f"http://127.0.0.1:{port}/healthz")[0] == 200
            wait_until(partial(_ready, port), timeout=20, message="ready")

        # the schema changes under the running replicas (a newer outboxd migrated it):
        # both become unready, stay alive, and recover when it is back
        engine = db.create_engine(sqlite_url)
        try:
            with engine.begin() as conn:
                real = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
                conn.execute(sa.text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
            for port in ports:
                code, body = http_json(f"http://127.0.0.1:{port}/readyz")
                assert code == 503 and "newer outboxd" in body["problem"], body
                assert http_json(f"http://127.0.0.1:{port}/healthz")[0] == 200
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": real})
            for port in ports:
                assert http_json(f"http://127.0.0.1:{port}/readyz")[0] == 200
        finally:
            engine.dispose()

        one.signal(signal.SIGTERM)
        two.signal(signal.SIGTERM)
        assert one.wait(30) == 0 and two.wait(30) == 0
        for d, port in ((one, ports[0]), (two, ports[1])):
            records = json_lines(d.log_text())
            listening = [r for r in records if r.get("msg") == "metrics endpoint listening"]
            assert [r["port"] for r in listening] == [port]
            assert listening[0]["url"] == f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_run_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    """``outboxd run`` exits 1 at start on an unmigrated database (so readiness can only be
    observed failing on a running daemon whose schema changed, as above)."""
    cfg = write_config(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}", NULL_PROVIDER,
                       metrics={"enabled": True, "host": "127.0.0.1", "port": 0})
    with DaemonProcess(cfg) as d:
        assert d.wait(30) == 1
    text = d.log_text()
    assert "outboxd migrate" in text
    assert json.dumps("metrics endpoint listening") not in text


@pytest.mark.postgres
def test_a_transaction_pooler_without_listen_url_is_said_on_readyz(
    pg_url: str, tmp_path: Path
) -> None:
    path = write_config(tmp_path, pg_url, NULL_PROVIDER)
    path.write_text(path.read_text().replace("[database]\n",
                                             '[database]\npooler = "transaction"\n'))
    daemon = Daemon(load_config(path, env={}))
    server = endpoint.serve("127.0.0.1", 0, daemon.health)
    try:
        assert daemon._start_listener() is None  # polling only, and said
        code, body = http_json(f"http://127.0.0.1:{server.server_port}/readyz")
        assert code == 200 and body["ready"] is True
        assert [w.split(";")[0] for w in body["warnings"]] == [
            "LISTEN is off: database.pooler = transaction and no database.listen_url (a direct"
            " or session-pooled URL)"]
    finally:
        server.shutdown()
        server.server_close()
        daemon.worker.close()
        daemon.engine.dispose()
