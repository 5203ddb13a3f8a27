"""outboxd's Redis Streams provider against a raw redis-py client doing plain ``XADD``: the
same throwaway ``redis-server`` (``appendonly yes``, ``appendfsync always``: the durability
the provider's declaration asks for), the same fields, the same number of threads.

The raw client appends without deduplication; outboxd appends through its script (a
``GET`` of the key, the ``XADD``, a ``SET`` of the key with its time to live) and records
every outcome in the database — the ratio is what the promise costs.

Run as ``python -m bench.redis_compare [MESSAGES]`` (a scratch database), or from
``make bench`` (skipped, with a line saying so, when ``redis-server`` is not installed).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import redis

from bench.daemon_runs import drain, fill, prepare


def available() -> bool:
    return shutil.which("redis-server") is not None


@contextmanager
def throwaway_server() -> Iterator[int]:
    """A ``redis-server`` on a free port with its own data directory; its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    with tempfile.TemporaryDirectory() as directory:
        process = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=port)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield port
        finally:
            client.close()
            process.kill()
            process.wait()


def raw_xadd(port: int, stream: str, messages: int, concurrency: int) -> float:
    """Entries per second, appended by ``concurrency`` threads sharing one pool."""
    client = redis.Redis(port=port, max_connections=concurrency)

    def append(i: int) -> None:
        client.xadd(stream, {
            "payload": json.dumps({"n": i, "text": "benchmark payload"}),
            "operation_id": f"op:{i}", "tenant": "bench", "fencing_token": "1",
            "idempotency_key": f"bench:op:{i}"})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(append, range(messages)))
    elapsed = time.perf_counter() - t0
    client.close()
    return messages / elapsed


def compare(dsn: str, messages: int, concurrency: int = 32) -> tuple[float, float]:
    """(outboxd rows/s, raw XADD entries/s), each into a stream of its own."""
    with throwaway_server() as port:
        raw = raw_xadd(port, "raw", messages, concurrency)
        prepare(dsn)
        fill(dsn, messages, provider="rs")
        provider = (f'[providers.rs]\nkind = "redis_stream"\n'
                    f'url = "redis://127.0.0.1:{port}/0"\nstream = "ours"\n')
        ours = drain(dsn, messages, batch=concurrency, provider=provider)["rows_per_s"]
        appended = redis.Redis(port=port).xlen("ours")
        if appended != messages:
            raise AssertionError(f"outboxd appended {appended} entries for {messages} rows")
    return ours, raw


if __name__ == "__main__":
    from bench.harness import scratch_database

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
    with scratch_database() as scratch:
        ours, raw = compare(scratch, count)
    print(f"outboxd redis_stream {ours:,.0f} rows/s, raw XADD {raw:,.0f} entries/s, "
          f"ratio {ours / raw:.2f}")
