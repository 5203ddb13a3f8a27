"""The verifier: ``applied`` -> ``verified`` through a provider's ``verify(receipt)``, and a
crash between the receipt and its verification re-runs only the verifier (the receiver
sees no second request)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.config import load_config
from dispatcher.daemon import Daemon
from outbox import db, migrate, recovery
from outbox.recovery import Step
from providers.base import verifier_of
from providers.registry import build_provider
from tests.dispatcher import config, failpoints
from tests.operator import run_verifying_host, stage, verifying_providers
from tests.support.sim import SimProcess


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(tmp_path_factory.mktemp("sim")) as s:
        yield s


def _status(engine: Engine, operation_id: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text(
            "SELECT status FROM outbox_operations WHERE operation_id = :o"),
            {"o": operation_id}).scalar_one())


def _plan_step(engine: Engine, tenant: str, task: str) -> Step:
    with engine.connect() as conn:
        [o] = recovery.plan(conn, tenant_id=tenant, task_id=task).operations
    return o.step


def test_verify_is_optional_for_providers() -> None:
    null = build_provider("n", {"kind": "null"})
    assert verifier_of(null) is None  # the Provider protocol is still satisfied without it


def test_applied_becomes_verified(db_url: str, tmp_path: Path, sim: SimProcess) -> None:
    tenant = f"tv-{uuid.uuid4().hex[:8]}"  # keys are unique in the shared sim
    engine = db.create_engine(db_url)
    try:
        stage(engine, "task-v", ["op-v"], tenant=tenant)
        cfg = config(tmp_path, db_url, sim)
        calls = tmp_path / "calls"
        before = sim.stats()["requests"]
        Daemon(load_config(cfg), providers=verifying_providers(cfg, calls)).run(once=True)
        assert _status(engine, "op-v") == "verified"
        assert sim.stats()["requests"] == before + 1
        with engine.connect() as conn:
            kinds = conn.execute(sa.text(
                "SELECT kind, from_status, to_status FROM outbox_events "
                "WHERE operation_id = 'op-v' AND kind = 'verification'")).all()
            assert recovery.published_verifiers(conn) == {"sim"}
        assert [tuple(k) for k in kinds] == [("verification", "applied", "verified")]
        assert _plan_step(engine, tenant, "task-v") == Step.CONTINUE
    finally:
        engine.dispose()


def test_crash_between_receipt_and_verification_reruns_only_the_verifier(
    tmp_path: Path, sim: SimProcess
) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    tenant = f"tc-{uuid.uuid4().hex[:8]}"
    try:
        stage(engine, "task-c", ["op-c"], tenant=tenant)
        cfg = config(tmp_path, url, sim)
        calls = tmp_path / "calls"
        before = sim.stats()["requests"]

        crashed = run_verifying_host(cfg, calls, env=failpoints("in_verify=kill"))
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        assert _status(engine, "op-c") == "applied"  # the receipt is durable
        assert calls.read_text().count("verify") == 1
        assert sim.stats()["requests"] == before + 1
        assert _plan_step(engine, tenant, "task-c") == Step.VERIFY  # not "continue"

        resumed = run_verifying_host(cfg, calls)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert _status(engine, "op-c") == "verified"
        assert calls.read_text().count("verify") == 2  # only the verifier ran again
        stats = sim.stats()
        assert stats["requests"] == before + 1 and stats["duplicates"] == 0
        assert _plan_step(engine, tenant, "task-c") == Step.CONTINUE
    finally:
        engine.dispose()
