"""Failover with the real parts: a throwaway primary and a streaming standby of it
(``pg_basebackup -R``, own data directories and ports; the machine's server untouched), the
primary crash-stopped and the standby promoted.

Fencing tokens never go backwards across a promotion: the standby is stopped while the
primary hands out more tokens than its sequence logs ahead (what asynchronous replication
loses at a crash), the primary dies, the standby is promoted without them, and every token
the new primary issues — by the function and through a real claim and send — is above every
token the old one issued."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from dispatcher.config import load_config
from dispatcher.daemon import Daemon
from dispatcher.maintenance import replication
from dispatcher.observability import metrics
from dispatcher.store.postgres import TIMELINE_SHIFT, PostgresStore
from outbox import migrate
from outbox.errors import ConfigError
from tests.dispatcher import config, drain_once, engine_for, key_of, stage
from tests.support.daemon import DaemonProcess, settled, wait_until, write_config
from tests.support.pgcluster import ThrowawayCluster, server_binaries
from tests.support.sim import SimProcess

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
ACCEPT = {"standbys": "accept-asynchronous"}  # the loss this test makes on purpose
LOST = 100  # tokens issued after the standby's last copy: more than a sequence logs ahead


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[ThrowawayCluster]:
    if server_binaries() is None:
        pytest.fail("no PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup)")
    cluster = ThrowawayCluster(tmp_path / "primary")
    cluster.start()
    yield cluster
    cluster.cleanup()


def _max_token(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT coalesce(max(fencing_token), 0) FROM outbox_attempts")).scalar_one())


def test_tokens_never_go_backwards_across_a_promotion(
    primary: ThrowawayCluster, tmp_path: Path
) -> None:
    engine = engine_for(primary.url())
    migrate.upgrade(engine)
    standby = primary.standby(tmp_path / "standby")
    try:
        with SimProcess(tmp_path) as sim:
            stage(engine, 20, prefix="before")
            drain_once(config(tmp_path, primary.url(), sim, database=ACCEPT))
            sent_before = _max_token(engine)
            assert sent_before > 0
            # the standby stops receiving; the primary goes on handing out tokens
            standby.stop("fast")
            with engine.begin() as conn:
                lost = [PostgresStore().fencing_token(conn) for _ in range(LOST)]
            assert lost == sorted(lost) and lost[0] > sent_before
            engine.dispose()
            primary.immediate_shutdown()
            standby.start()
            standby.promote()

            promoted = engine_for(standby.url())
            try:
                with promoted.connect() as conn:  # the lost commits are not there
                    assert int(conn.execute(sa.text(
                        "SELECT count(*) FROM outbox_operations WHERE status = 'applied'"
                    )).scalar_one()) == 20
                with promoted.begin() as conn:
                    assert PostgresStore().fencing_token(conn) > max(lost)
                stage(promoted, 20, prefix="after")
                drain_once(config(tmp_path, standby.url(), sim))
                with promoted.connect() as conn:
                    after = [int(t) for t in conn.execute(sa.text(
                        "SELECT fencing_token FROM outbox_attempts"
                        " WHERE operation_id LIKE 'after-%'"
                    )).scalars()]
                assert len(after) == 20 and min(after) > max(lost)
            finally:
                promoted.dispose()
    finally:
        standby.cleanup()


def _daemon(url: str, tmp_path: Path, **database: str) -> Daemon:
    path = write_config(tmp_path, url, {"sink": {"kind": "null"}})
    extra = "".join(f'{k} = "{v}"\n' for k, v in database.items())
    path.write_text(path.read_text().replace("[database]\n", "[database]\n" + extra))
    return Daemon(load_config(path, env={}))


def test_asynchronous_standbys_are_refused_or_run_only_when_accepted_and_said(
    primary: ThrowawayCluster, tmp_path: Path
) -> None:
    engine = engine_for(primary.url())
    migrate.upgrade(engine)
    stage(engine, 5, provider="sink")
    engine.dispose()
    alone = _daemon(primary.url(), tmp_path)
    alone._check_replication()  # no standby: nothing to lose at failover
    assert alone.health.warnings == []
    standby = primary.standby(tmp_path / "standby")
    daemons: list[Daemon] = [alone]
    watch = engine_for(primary.url())
    try:
        wait_until(lambda: _standbys(watch) == 1, timeout=30, message="the standby to stream")
        # attached while running: the replica that started alone stops claiming, and says
        # why on /readyz, until commits wait for the standby
        alone._check_replication(starting=False)
        problem = alone._ready_problem()
        assert problem is not None and problem.startswith("database.standbys: PostgreSQL")
        assert alone._cycle() == (0, 0)
        refused = _daemon(primary.url(), tmp_path)
        daemons.append(refused)
        with pytest.raises(ConfigError) as info:
            refused._check_replication()
        assert str(info.value).startswith(
            "database.standbys: PostgreSQL streams to 1 standby(s) asynchronously"
            " (synchronous_standby_names is empty)")
        assert 'set [database] standbys = "accept-asynchronous"' in str(info.value)

        accepted = _daemon(primary.url(), tmp_path, standbys="accept-asynchronous")
        daemons.append(accepted)
        accepted._check_replication()
        assert "accept-asynchronous" in accepted.health.warnings[0]
        assert metrics.REPLICATION_ASYNCHRONOUS._value.get() == 1

        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")
        synchronous = _daemon(primary.url(), tmp_path)
        daemons.append(synchronous)
        def reloaded() -> bool:
            state = replication.read(synchronous.engine)
            return state is not None and not state.can_lose_commits

        wait_until(reloaded, timeout=30, message="the configuration reload")
        synchronous._check_replication()
        assert synchronous.health.warnings == []
        assert metrics.REPLICATION_ASYNCHRONOUS._value.get() == 0
        alone._check_replication(starting=False)  # synchronous now: it claims again
        assert alone._ready_problem() is None
        assert alone._cycle()[0] == 5
        alone.worker.wait_in_flight(10)

        # a synchronous standby, but the server's commits do not wait for it: refused,
        # unless outboxd's own commits wait ([database] synchronous_commit)
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("SELECT pg_reload_conf()")
        local = _daemon(primary.url(), tmp_path)
        daemons.append(local)
        wait_until(lambda: _commit_setting(local) == "local", timeout=30,
                   message="the configuration reload")
        with pytest.raises(ConfigError, match="synchronous_commit is 'local'"):
            local._check_replication()
        waiting = _daemon(primary.url(), tmp_path, synchronous_commit="remote_write")
        daemons.append(waiting)
        assert _commit_setting(waiting) == "remote_write"
        waiting._check_replication()
        assert waiting.health.warnings == []
    finally:
        for d in daemons:
            d.worker.close()
            d.engine.dispose()
        watch.dispose()
        standby.cleanup()


def _commit_setting(daemon: Daemon) -> str:
    state = replication.read(daemon.engine)
    assert state is not None
    return state.synchronous_commit


def _standbys(engine: sa.Engine) -> int:
    state = replication.read(engine)
    assert state is not None
    return state.standbys


DRILL_ROWS = 300


@pytest.mark.parametrize(("mode", "receiver"), [
    ("synchronous", "no-dedup"),
    ("synchronous", "dedup"),
    ("asynchronous-accepted", "no-dedup"),
    ("asynchronous-accepted", "dedup"),
])
def test_failover_drill_two_replicas(
    primary: ThrowawayCluster, tmp_path: Path, mode: str, receiver: str
) -> None:
    """Two replicas on a multi-host URL drain into the sim; the primary is crash-stopped
    mid-drain and the standby promoted. Synchronous (the server's synchronous_commit is
    local; outboxd's own commits wait for the standby through [database]
    synchronous_commit): 0 duplicates, 0 lost, with a receiver that ignores keys.
    Asynchronous (accepted): whatever duplicates the lost commits cause at a receiver that
    ignores keys are counted and printed, never hidden; one that deduplicates absorbs the
    re-sends (its replays are counted); nothing is lost either way."""
    engine = engine_for(primary.url())
    migrate.upgrade(engine)
    ids = stage(engine, DRILL_ROWS, per_task=100)
    standby = primary.standby(tmp_path / "standby")
    database = {"standbys": "accept-asynchronous"}
    if mode == "synchronous":
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("ALTER SYSTEM SET synchronous_commit = 'local'")
            conn.execute("SELECT pg_reload_conf()")
        wait_until(lambda: _sync_states(engine) == ["sync"], timeout=30,
                   message="the standby to be synchronous")
        database = {"synchronous_commit": "remote_apply"}
    url = (f"postgresql://postgres@/postgres?host=127.0.0.1,127.0.0.1&port={primary.port},"
           f"{standby.port}&target_session_attrs=read-write")
    promoted = engine_for(standby.url())
    dedup = receiver == "dedup"
    try:
        # every request takes 0.2 s: sends are in flight when the primary dies
        with SimProcess(tmp_path, *(() if dedup else ("--ignore-keys",)), "--p-slow", "1",
                        "--slow-seconds", "0.2") as sim:
            replicas = [DaemonProcess(config(
                tmp_path, url, sim, lease_seconds=2.0, worker_id=f"r{i}", name=f"r{i}.toml",
                database=database, dedup_retention_seconds=86400 if dedup else 0,
                timeout_seconds=1, in_flight_seconds=2.5,
                dispatcher={"batch_size": 10, "concurrency": 8}))
                for i in range(2)]
            with replicas[0], replicas[1]:
                wait_until(lambda: len(sim.effects()) >= DRILL_ROWS // 4, timeout=60,
                           message="a quarter applied")
                # the standby falls behind: asynchronous, the primary commits on (marks
                # and receipts the crash then loses); synchronous, its commits wait
                with primary.wal_senders_held():
                    held_at = len(sim.effects())
                    if mode == "synchronous":
                        wait_until(lambda: _waiting_for_standby(engine) > 0, timeout=30,
                                   message="a commit waiting for the standby")
                    else:
                        wait_until(lambda: len(sim.effects()) >= held_at + 20, timeout=60,
                                   message="sends committed on the primary alone")
                    engine.dispose()
                    primary.kill_all()
                before = sim.effects()
                standby.promote()
                promoted_at = time.time()
                wait_until(lambda: settled(promoted, DRILL_ROWS), timeout=120,
                           message="every row settled on the promoted standby")
                all_applied = time.time()
            effects = sim.effects()
            replays = int(sim.stats()["replays"])
        by_key = Counter(e["key"] for e in effects)
        duplicates = sum(n - 1 for n in by_key.values())
        lost = [i for i in ids if by_key[key_of(i)] == 0]
        after = [e for e in effects if e["applied_at"] > promoted_at]
        first_send = min((e["applied_at"] for e in after), default=float("nan")) - promoted_at
        max_before = max(int(e["fencing_token"]) for e in before)
        # tokens the new primary issued (claimed after the promotion) are above every token
        # the receiver saw before the crash; sends in flight at the crash carry old ones
        fresh = [e for e in after if int(e["fencing_token"]) >> TIMELINE_SHIFT > 1]
        monotonic = all(int(e["fencing_token"]) > max_before for e in fresh)
        print(f"failover drill: mode={mode} receiver={receiver} rows={DRILL_ROWS}"
              f" duplicates={duplicates} replays={replays} lost={len(lost)}"
              f" stuck={DRILL_ROWS - len(by_key)} tokens_monotonic={monotonic}"
              f" first_send_after_promote={first_send:.2f}s"
              f" all_applied_after_promote={all_applied - promoted_at:.2f}s")
        assert lost == [] and monotonic and fresh
        if mode == "synchronous" or dedup:
            assert duplicates == 0
        else:  # the drill is not blind: what the crash lost was sent again, and counted
            assert duplicates > 0
        if mode != "synchronous" and dedup:
            assert replays > 0  # the re-sends, absorbed by the receiver's keys
    finally:
        promoted.dispose()
        standby.cleanup()


def _waiting_for_standby(engine: sa.Engine) -> int:
    """Backends whose commit waits for a synchronous standby."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")).scalar_one())


def _sync_states(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [str(s) for s in conn.execute(sa.text(
            "SELECT sync_state FROM pg_stat_replication")).scalars()]
