"""``outboxd run``: the sidecar's life cycle around :class:`dispatcher.engine.worker.Worker`.

Start: check the schema is current, build providers, then — before claiming anything —
recover expired leases and reconcile what it finds (a starting replica trusts the
records, not its memory). Run: claim while there is room, record what finished, extend
leases; wake on PostgreSQL ``NOTIFY`` or every ``poll_interval_ms``. Periodic jobs
(lease recovery, reconciliation, gauges) run on APScheduler. A database outage is
survived with reconnection back-off; nothing is lost (unrecorded outcomes are kept and
recorded when it is back; if the process dies first, lease recovery and reconciliation
settle them). SIGTERM/SIGINT: stop claiming, wait ``shutdown_grace_seconds`` for sends in
flight, leave the rest recoverable, exit 0.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import sqlalchemy as sa
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Engine

from dispatcher.config import Config, protection_of
from dispatcher.engine.authority import Authority, artifact_store
from dispatcher.engine.settings import WorkerSettings
from dispatcher.engine.worker import RECORD_LINGER_SECONDS, Worker
from dispatcher.maintenance import gauges, replication
from dispatcher.maintenance.lease_recovery import LeaseRecovery
from dispatcher.maintenance.reconcile import Reconciler
from dispatcher.maintenance.retention import RetentionJob
from dispatcher.maintenance.verifier import Verifier
from dispatcher.observability import endpoint, metrics
from dispatcher.observability.tracing import Tracing
from outbox import db, migrate
from outbox.errors import ConfigError, MigrationError
from outbox.stop_signals import StopSignals
from providers.base import Provider
from providers.registry import build_providers, close_providers

PREPARE_THRESHOLD = 5
"""Executions of a statement on one connection before psycopg prepares it (its default)."""
log = logging.getLogger("outboxd.daemon")
MAX_BACKOFF_SECONDS = 5.0


YOUNG_COLLECTION_THRESHOLD = 20_000
"""Allocations (less deallocations) of container objects between two collections of the
youngest generation in the daemon's process; Python's default is 700."""


def settle_heap() -> None:
    """The ``outboxd run`` process's garbage collector, once its start-up is done: what
    start-up built (modules, the engine, the providers, the configuration) is collected
    once and then frozen out of every later collection (``gc.freeze``), and the youngest
    generation is collected every 20,000 allocations instead of 700. Every claimed row and
    recorded send allocates dictionaries, tuples and records, freed by reference counting
    (a drain leaves almost no cycles for the collector to find); at the default it still
    ran 540 young, 49 middle and 2 full collections over a 30,000-row drain at batch 100
    (each full one a pass over some 113,000 objects start-up made): 0.21 s of CPU, 7 µs an
    operation, and none with this. For the process that runs the daemon only (not a library
    user's interpreter): the command line calls it."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        providers: Mapping[str, Provider] | None = None,
        authority: Any = None,
    ) -> None:
        self.config = config
        d = config.dispatcher
        if authority is None:  # imports configured policies: a bad one stops start-up here
            authority = Authority.from_config(config)
        self.worker_id = d.worker_id or default_worker_id()
        self.protection = protection_of(config)  # keys resolved now: a bad one stops start-up
        self.engine: Engine = db.create_engine(
            config.database.url,
            **config.database.engine_args(),
            pre_ping=False,  # see outbox.db.create_engine
        )
        self.providers = (
            dict(providers) if providers is not None else build_providers(config.providers)
        )
        self.worker = Worker(
            self.engine,
            self.providers,
            WorkerSettings(
                worker_id=self.worker_id,
                batch_size=d.batch_size,
                concurrency=d.concurrency,
                lease_seconds=d.lease_seconds,
                dedup_safety_margin=d.dedup_safety_margin,
                max_payload_bytes=config.database.max_payload_bytes,
                protection=self.protection,
            ),
            authority=authority,
            artifacts=artifact_store(config),
            tracing=Tracing.build(enabled=config.tracing.enabled,
                                  exporter=config.tracing.exporter,
                                  service_name=config.tracing.service_name),
        )
        self.recovery = LeaseRecovery(self.engine, actor=self.worker_id)
        self.reconciler = Reconciler(
            self.engine, self.providers, actor=self.worker_id, protection=self.protection
        )
        self.verifier = Verifier(
            self.engine, self.providers, actor=self.worker_id, protection=self.protection
        )
        self.health = endpoint.Health(wedged_after=max(60.0, d.lease_seconds * 2))
        self.health.ready_check = self._ready_problem
        self.gauges = gauges.GaugeRefresher(self.engine)
        self.stopping = threading.Event()
        self._server: Any = None
        self._signals: StopSignals | None = None
        self._replication_problem: str | None = None
        self._replication_warning: str | None = None

    # -- readiness ---------------------------------------------------------------------
    def _ready_problem(self) -> str | None:
        try:
            migrate.check_current(self.engine, self.config.database.schema)
        except MigrationError as exc:
            return f"migrations: {exc}"[:300]
        except Exception as exc:  # the class only: a driver's message may quote SQL or DSNs
            return f"database unreachable: {type(exc).__name__}"
        if not self.providers:
            return "no providers configured"
        if self._replication_problem is not None:
            return self._replication_problem[:300]
        return None

    # -- life cycle --------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self.stopping.set()
        self.worker.kick.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT request a stop, from a thread of their own: a handler that set
        an event itself could wait forever on a lock its own thread holds (see
        outbox.stop_signals)."""
        def on_signal(name: str) -> None:
            log.info("stopping", extra={"reason": name})
            self.request_stop()

        self._signals = StopSignals(on_signal).install()

    def _wait_for_database(self) -> bool:
        """Check the schema and the replication (:meth:`_check_replication`), waiting with
        back-off while the database is unreachable (a sidecar may start before its
        database; a connection may drop between the two checks). A schema that is not
        current, or replication that can lose commits, is an error."""
        backoff = 0.0
        while True:
            try:
                migrate.check_current(self.engine, self.config.database.schema)
                self._check_replication()
                return True
            except sa.exc.DBAPIError as exc:
                url = self.config.database.url
                permanent, reason = db.connect_failure(exc, url)
                if permanent:  # waiting cannot help: say why, and stop
                    what = ("cannot open the SQLite database (does its directory exist, and "
                            "is it writable?)" if self.engine.dialect.name == "sqlite"
                            else "the database server refused the connection")
                    raise ConfigError(f"database.url: {what}: {reason}",
                                      key="database.url") from None
                if self.stopping.is_set():
                    return False
                backoff = min(MAX_BACKOFF_SECONDS, max(0.2, backoff * 2))
                log.warning(
                    "database unreachable at start-up; waiting",
                    extra={"error": type(exc.orig or exc).__name__, "reason": reason,
                           "count": backoff},
                )
                self.stopping.wait(backoff)

    def run(self, *, once: bool = False) -> int:
        if not self._wait_for_database():
            log.info("stopped before the database was reachable")
            return 0
        self._guarded("statement preparation", self._choose_preparation)
        m = self.config.metrics
        metrics.init_labels(self.providers)
        if m.enabled and not once:
            try:
                self._server = endpoint.serve(m.host, m.port, self.health)
            except OSError as exc:
                raise ConfigError(
                    f"metrics.port: cannot listen on {m.host}:{m.port}: {exc.strerror}. "
                    "Replicas on one host need distinct ports, or [metrics] port = 0 for a "
                    "free one (or enabled = false)", key="metrics.port") from None
            self._guarded("gauges", self.gauges)
        self._guarded("startup recovery", self.recovery.run_once)
        self._guarded("startup reconciliation", self.reconciler.run_once)
        self._guarded("verifier publication", self.verifier.publish)
        self._guarded("startup verification", self.verifier.run_once)
        scheduler = None if once else self._start_scheduler()
        listener = None if once else self._start_listener()
        log.info("dispatcher started", extra={"worker": self.worker_id})
        try:
            self._loop(once)
            if once:  # verify what this drain applied (verification only reads)
                self._guarded("verification", self.verifier.run_once)
        finally:
            self.stopping.set()
            grace = self.config.dispatcher.shutdown_grace_seconds
            try:
                self.worker.wait_in_flight(grace)
            except Exception:
                log.exception("could not record outcomes at shutdown; leases will expire")
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            if listener is not None:
                listener.join(timeout=2)
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()
            self.worker.close()
            self.worker.tracing.shutdown()
            close_providers(self.providers)
            self.engine.dispose()
            log.info("dispatcher stopped", extra={"worker": self.worker_id})
        return 0

    def _loop(self, once: bool) -> None:
        poll = self.config.dispatcher.poll_interval_ms / 1000
        backoff = 0.0
        while not self.stopping.is_set():
            self.health.beat()
            try:
                claimed, recorded = self._cycle()
                backoff = 0.0
            except Exception as exc:  # never crash the fleet: see outbox.db.is_outage
                backoff = min(MAX_BACKOFF_SECONDS, max(0.1, backoff * 2))
                self._cycle_failed(exc, backoff)
                self.stopping.wait(backoff)
                continue
            if once and claimed == 0 and recorded == 0 and self.worker.in_flight() == 0:
                return
            # a short claim found everything eligible: the next waits for a wake-up (a
            # claim straight after it finds nothing, and its round trips compete with
            # the sends it has just started)
            if recorded == 0 and (claimed == 0 or self.worker.claimed_short):
                self.worker.kick.wait(RECORD_LINGER_SECONDS if self.worker.has_done() else poll)
                self.worker.kick.clear()

    def _cycle(self) -> tuple[int, int]:
        """Claim and send one batch (unless replication forbids it: see
        :meth:`_check_replication`), record finished sends, extend leases in flight.
        Returns (claimed, recorded)."""
        claimed = 0 if self._replication_problem else self.worker.claim_and_dispatch()
        recorded = self.worker.record_done()
        self.worker.extend_leases()
        return claimed, recorded

    @staticmethod
    def _cycle_failed(exc: Exception, backoff: float) -> None:
        """An outage is waited out quietly; any other error is logged with its class (one
        line, no row content) and counted, and the cycle is tried again after the same
        back-off so a persistent one cannot spin."""
        orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else None
        error = type(orig or exc).__name__
        if db.is_outage(exc):
            metrics.CYCLE_ERRORS.labels("outage").inc()
            log.warning("database unavailable; backing off",
                        extra={"error": error, "count": backoff})
            return
        metrics.CYCLE_ERRORS.labels("error").inc()
        log.error("dispatch cycle failed; retrying",
                  extra={"error": error, "sqlstate": getattr(orig, "sqlstate", None),
                         "count": backoff})

    def _guarded(self, what: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception(f"{what} failed")

    def _start_scheduler(self) -> BackgroundScheduler:
        d, m = self.config.dispatcher, self.config.metrics
        scheduler = BackgroundScheduler(daemon=True)
        jobs: list[tuple[str, Callable[[], object], float]] = [
            ("lease recovery", self.recovery.run_once, d.recovery_interval_seconds),
            ("reconciliation", self._reconcile_and_kick, d.reconcile_interval_seconds),
            ("verification", self.verifier.run_once, d.reconcile_interval_seconds),
        ]
        if m.enabled:  # the gauges' queries serve only the exporter
            jobs.append(("gauges", self.gauges, m.gauge_refresh_seconds))
        if self.engine.dialect.name == "postgresql":
            jobs.append(("replication check", partial(self._check_replication, starting=False),
                         m.gauge_refresh_seconds))
        if self.config.retention.enabled:  # once per cluster: see dispatcher.maintenance.retention
            purge = RetentionJob(self.engine, self.config.retention).run_once
            jobs.append(("retention purge", purge, self.config.retention.interval_seconds))
        for name, fn, every in jobs:
            scheduler.add_job(
                self._guarded,
                "interval",
                args=(name, fn),
                seconds=every,
                max_instances=1,
                coalesce=True,
                id=name,
            )
        scheduler.start()
        return scheduler

    def _reconcile_and_kick(self) -> None:
        counts = self.reconciler.run_once()
        if counts.requeued:
            self.worker.kick.set()

    def _check_replication(self, *, starting: bool = True) -> None:
        """Refuse to start where a failover can lose commits, unless the operator accepted
        it (see :mod:`dispatcher.maintenance.replication`). Checked again while running (a standby
        attached later): a replica that would refuse to start stops claiming and says why
        on ``/readyz`` until commits wait for the standby again (or it is gone)."""
        state = replication.read(self.engine)
        if state is None or not state.can_lose_commits:
            metrics.REPLICATION_ASYNCHRONOUS.set(0)
            self._say_replication(None)
            if self._replication_problem is not None:
                log.warning("replication: commits wait for the standbys again; claiming")
                self._replication_problem = None
            return
        metrics.REPLICATION_ASYNCHRONOUS.set(1)
        if self.config.database.standbys == "accept-asynchronous":
            self._say_replication(f"{state.describe()}; running because database.standbys"
                                  " = accept-asynchronous")
            return
        problem = (f"database.standbys: {state.describe()}. Make commits wait for a standby"
                   " (synchronous_standby_names on the server, and synchronous_commit there"
                   ' or in [database]), or set [database] standbys = "accept-asynchronous"'
                   " to run with that risk")
        if starting:
            raise ConfigError(problem, key="database.standbys")
        if self._replication_problem is None:
            log.error("replication: not claiming until commits wait for the standbys",
                      extra={"reason": problem})
        self._replication_problem = problem

    def _say_replication(self, warning: str | None) -> None:
        """The one replication warning on ``/readyz`` (and in the log, once)."""
        if warning == self._replication_warning:
            return
        if self._replication_warning in self.health.warnings:
            self.health.warnings.remove(self._replication_warning)
        self._replication_warning = warning
        if warning is not None:
            log.warning(warning)
            self.health.warnings.append(warning)

    def _choose_preparation(self) -> None:
        """Prepare the daemon's statements server-side where nothing can hand them to
        another client: PostgreSQL reached directly (``database.pooler = "none"`` and
        :meth:`_check_for_a_pooler` finds no pooler) or through a session pooler, and no
        ``prepare_threshold`` of the user's. Its few statements, each run once per batch,
        are then parsed and planned once per connection instead of on every execution
        (``make bench``: docs/performance.md). Anywhere else nothing is prepared
        (:func:`outbox.db.driver_options`)."""
        d = self.config.database
        if self.engine.dialect.name != "postgresql" or d.pooler == "transaction":
            return
        direct = self._check_for_a_pooler()
        if db.prepare_threshold_given(sa.engine.make_url(db.normalise_url(d.url)), d.options):
            return  # the user's choice, applied by the engine already
        if d.pooler == "none" and not direct:
            return

        def prepare(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.prepare_threshold = PREPARE_THRESHOLD

        sa.event.listen(self.engine, "connect", prepare)
        self.engine.dispose()  # the connections made so far reconnect with it
        log.info("statements are prepared server-side",
                 extra={"prepare_threshold": PREPARE_THRESHOLD})

    def _check_for_a_pooler(self) -> bool:
        """Say so when something sits between this replica and PostgreSQL that
        ``database.pooler`` does not mention: the server's port is not the one connected
        to (what a transaction pooler would break unseen is LISTEN, and prepared
        statements, which are then not used). Returns whether the replica reaches the
        server directly (True, too, for a declared pooler, which is not checked)."""
        if self.engine.dialect.name != "postgresql" or self.config.database.pooler != "none":
            return True
        with self.engine.connect() as conn:
            server_port = self.worker.store.server_port(conn)
            dbapi = conn.connection.dbapi_connection
            client_port = getattr(getattr(dbapi, "info", None), "port", None)
        if server_port is None or client_port is None or int(client_port) == int(server_port):
            return True  # a Unix socket, or the server itself
        warning = (f"connected to port {client_port} but the server listens on {server_port}:"
                   " a pooler or proxy sits in between; if it pools transactions (PgBouncer"
                   ' pool_mode = transaction), set database.pooler = "transaction", or'
                   " LISTEN through it hears nothing")
        log.warning(warning)
        self.health.warnings.append(warning)
        return False

    def _listen_args(self) -> tuple[list[Any], dict[str, Any]] | None:
        """How the LISTEN connection connects: over ``database.listen_url`` when given, else
        as the engine does; None (polling only, said once at start-up and on ``/readyz``)
        behind a transaction pooler without a listen_url, where a LISTEN would hold a server
        connection the pooler hands to others and hear nothing."""
        d = self.config.database
        if self.worker.store.listen_statement is None or not self.config.dispatcher.listen:
            return None
        if d.listen_url is None and d.pooler == "transaction":
            warning = ("LISTEN is off: database.pooler = transaction and no database.listen_url"
                       " (a direct or session-pooled URL); new rows are found by polling every"
                       f" {self.config.dispatcher.poll_interval_ms} ms")
            log.warning(warning)
            self.health.warnings.append(warning)
            return None
        url = self.engine.url
        if d.listen_url is not None:
            url = sa.engine.make_url(db.normalise_url(d.listen_url))
        # the dialect's own translation of the URL: every multi-host form the engine takes
        url, options = db.driver_options(url, d.options, "session")
        cargs, cparams = self.engine.dialect.create_connect_args(url)
        options.pop("prepare_threshold", None)
        options.setdefault("connect_timeout", max(1, int(d.connect_timeout_seconds)))
        return list(cargs), {**cparams, **options, "autocommit": True}

    def _start_listener(self) -> threading.Thread | None:
        args = self._listen_args()
        if args is None:
            return None
        thread = threading.Thread(
            target=self._listen, args=args, name="outboxd-listen", daemon=True
        )
        thread.start()
        return thread

    def _listen(self, cargs: list[Any], cparams: dict[str, Any]) -> None:
        import psycopg

        statement = self.worker.store.listen_statement
        assert statement is not None  # _listen_args said so

        while not self.stopping.is_set():
            try:
                with psycopg.connect(*cargs, **cparams) as conn:
                    conn.execute(statement)
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self.worker.kick.set()
            except Exception:
                log.debug("notification listener reconnecting")
                time.sleep(1.0)
