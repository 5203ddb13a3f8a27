"""A claim that comes back short (fewer rows than it asked for) found everything eligible:
the dispatch loop does not claim again at once — that claim would find nothing, and its
round trips would compete with the sends just started — but waits for a wake-up (a new
row's NOTIFY, a finished send, the poll interval). The daemon's loop runs in-process
against a real database; the provider holds its sends until the test lets them go."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from dispatcher.config import load_config
from dispatcher.daemon import Daemon
from outbox import db
from providers.base import Capabilities, Dispatch, LookupKind, LookupResult, Outcome, OutcomeKind
from tests.dispatcher import PROVIDER, stage
from tests.support.daemon import status_counts, wait_until, write_config


class Gate:
    """A receiver that holds every send until ``release`` is set, then applies it."""

    name = PROVIDER
    capabilities = Capabilities(dedup_retention_seconds=3600.0)

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held: list[str] = []
        self._lock = threading.Lock()

    def send(self, d: Dispatch) -> Outcome:
        with self._lock:
            self.held.append(d.idempotency_key)
        self.release.wait(30)
        return Outcome(OutcomeKind.APPLIED, status_code=201, receipt={"id": d.operation_id})

    def lookup(self, d: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.NOT_FOUND)

    def close(self) -> None:
        self.release.set()


def test_a_short_claim_waits_for_a_wake_up_instead_of_claiming_again(
    db_url: str, tmp_path: Path
) -> None:
    engine = db.create_engine(db_url)
    stage(engine, 3)
    gate = Gate()
    cfg = write_config(tmp_path, db_url, {PROVIDER: {"kind": "null"}},
                       dispatcher={"batch_size": 10, "concurrency": 10,
                                   "poll_interval_ms": 60_000})
    daemon = Daemon(load_config(cfg, env={}), providers={PROVIDER: gate})
    worker = daemon.worker
    claims: list[int] = []  # the claim statements run (rows each)
    at_first_wait: list[int] = []
    waiting = threading.Event()
    take, wait = worker._take, worker.kick.wait

    def counted_take(limit: int, **kw: Any) -> Any:
        taken = take(limit, **kw)
        if taken is not None:
            claims.append(taken[0])
        return taken

    def noted_wait(timeout: float | None = None) -> bool:
        if not waiting.is_set():
            at_first_wait.extend(claims)
            waiting.set()
        return wait(timeout)

    worker._take = counted_take  # type: ignore[method-assign]
    worker.kick.wait = noted_wait  # type: ignore[method-assign]
    loop = threading.Thread(target=daemon._loop, args=(False,), daemon=True)
    loop.start()
    try:
        assert waiting.wait(30), "the loop never waited"
        wait_until(lambda: len(gate.held) == 3, timeout=30, message="three sends held")
        # one claim took the three rows (of ten asked for) and the loop went to wait
        assert at_first_wait == [3]

        # a new row and its wake-up (as its NOTIFY would set it): claimed at once, though
        # the poll interval is a minute away
        stage(engine, 1, start=3)
        worker.kick.set()
        wait_until(lambda: len(gate.held) == 4, timeout=30, message="the new row sent")
        gate.release.set()
        wait_until(lambda: status_counts(engine) == {"applied": 4}, timeout=30,
                   message="all four recorded")
        assert sorted(gate.held) == sorted(set(gate.held))  # each sent once
    finally:
        gate.release.set()
        daemon.stopping.set()
        worker.kick.set()
        loop.join(30)
        worker.wait_in_flight(10)
        worker.close()
        daemon.engine.dispose()
        engine.dispose()
