"""Commit-to-send latency at low load (PostgreSQL LISTEN/NOTIFY wake-ups) and the cost of
an agent checkpoint (``advance()`` with one staged operation) on both dialects."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sqlalchemy.engine import Engine

import outbox
from bench.daemon_runs import prepare, write_config
from bench.harness import REPO, sa_url
from outbox import db, migrate


class _Receiver(ThreadingHTTPServer):
    arrivals: dict[str, float]
    request_queue_size = 256  # the stdlib default (5) resets bursts of concurrent connects


def _receiver() -> _Receiver:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(n)
            server.arrivals[self.headers["Outbox-Operation-Id"]] = time.perf_counter()
            self.send_response(201)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: object) -> None:
            return

    server = _Receiver(("127.0.0.1", 0), Handler)
    server.arrivals = {}
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@contextlib.contextmanager
def _dispatching(
    dsn: str, *, listen: bool = True, sqlite: str | None = None
) -> Iterator[tuple[Engine, _Receiver]]:
    """One ``outboxd run`` against a loopback receiver that notes when each request
    arrives; yields the agent's engine and the receiver. PostgreSQL (``dsn``) woken by
    NOTIFY, or polling (``listen=False``); or a SQLite file (``sqlite``: its URL)."""
    url = sqlite or sa_url(dsn)
    if sqlite is None:
        prepare(dsn)
    else:
        setup = db.create_engine(sqlite)
        migrate.upgrade(setup)
        setup.dispose()
    server = _receiver()
    provider = (
        f'[providers.rx]\nkind = "http"\nurl = "http://127.0.0.1:{server.server_port}/e"\n'
        "dedup_retention_seconds = 86400\n"
    )
    engine = db.create_engine(url)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(Path(tmp), dsn, batch=100, provider=provider)
        text = cfg.read_text()
        if sqlite is not None:
            text = text.replace(f'url = "{sa_url(dsn)}"', f'url = "{sqlite}"')
        if listen and sqlite is None:  # woken by NOTIFY: polling only as a fallback
            text = text.replace("poll_interval_ms = 20", "poll_interval_ms = 1000")
        else:  # the default poll interval: what a user without NOTIFY gets
            text = text.replace("poll_interval_ms = 20\n", "listen = false\n")
        cfg.write_text(text)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(cfg)],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(3)  # start-up, listener connected
            yield engine, server
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.shutdown()
            server.server_close()
            engine.dispose()


def _stage(engine: Engine, op: str, i: int) -> None:
    with engine.begin() as conn:
        outbox.enqueue(conn, tenant_id="bench", task_id="lat", operation_id=op,
                       provider="rx", payload={"i": i})


def commit_to_send(
    dsn: str, samples: int = 100, *, listen: bool = True, sqlite: str | None = None
) -> tuple[float, float]:
    """p50 and p99 milliseconds from the agent's COMMIT to the request arriving, one
    operation every 10 ms. PostgreSQL (``dsn``) woken by NOTIFY, or polling
    (``listen=False``); or a SQLite file (``sqlite``: its URL), which always polls."""
    lat: list[float] = []
    with _dispatching(dsn, listen=listen, sqlite=sqlite) as (engine, server):
        for i in range(samples):
            op = f"lat:{i}"
            _stage(engine, op, i)
            committed = time.perf_counter()
            deadline = committed + 5
            while op not in server.arrivals and time.perf_counter() < deadline:
                time.sleep(0.0002)
            if op in server.arrivals:
                lat.append((server.arrivals[op] - committed) * 1000)
            time.sleep(0.01)
    return percentile(lat, 50), percentile(lat, 99)


def receipt_latency(
    dsn: str, samples: int = 100, *, waiters: int = 1, sqlite: str | None = None
) -> tuple[float, float]:
    """p50 and p99 milliseconds from the request arriving at the receiver to
    ``outbox.wait_for`` returning the applied record to the agent (the response, the
    record step's commit and the waiter's wake-up and read), ``waiters`` agents at once,
    each staging its operation and waiting for it. PostgreSQL (``dsn``: woken by the
    record step's NOTIFY) or a SQLite file (``sqlite``: the waiter's reads)."""
    lat: list[float] = []
    lock = threading.Lock()
    with _dispatching(dsn, sqlite=sqlite) as (engine, server):

        def agent(first: int) -> None:
            for i in range(first, samples, waiters):
                op = f"wait:{i}"
                _stage(engine, op, i)
                outbox.wait_for(engine, tenant_id="bench", operation_id=op, timeout=30)
                returned = time.perf_counter()
                with lock:
                    lat.append((returned - server.arrivals[op]) * 1000)
                time.sleep(0.01)

        threads = [threading.Thread(target=agent, args=(w,)) for w in range(waiters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return percentile(lat, 50), percentile(lat, 99)


def checkpoint_cost(url: str, iterations: int = 300) -> tuple[float, float, float]:
    """``advance()`` with one staged operation, each in its own transaction:
    p50 ms, p99 ms and commits per second."""
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    times: list[float] = []
    t_all = time.perf_counter()
    for i in range(iterations):
        t0 = time.perf_counter()
        with engine.begin() as conn:
            outbox.advance(
                conn,
                f"cp-{i}",
                tenant_id="bench",
                expected_revision=0,
                phase="step",
                state={"i": i},
                operations=[
                    outbox.StagedOperation(f"cp:{i}", "sink", {"i": i, "note": "checkpoint cost"})
                ],
            )
        times.append((time.perf_counter() - t0) * 1000)
    rate = iterations / (time.perf_counter() - t_all)
    engine.dispose()
    return statistics.median(times), percentile(times, 99), rate
