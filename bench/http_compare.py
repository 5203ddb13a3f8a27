"""outboxd's HTTP provider against a raw httpx client: the same loopback receiver, the
same concurrency, the same requests (headers included)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.daemon_runs import drain, fill, prepare
from bench.latency import _receiver


def raw_httpx(url: str, requests: int, concurrency: int) -> float:
    with httpx.Client(limits=httpx.Limits(max_connections=concurrency)) as client:

        def send(i: int) -> int:
            r = client.post(
                url,
                json={"n": i, "text": "benchmark payload"},
                headers={
                    "Idempotency-Key": f"bench:op:{i}",
                    "Outbox-Operation-Id": f"op:{i}",
                    "Outbox-Fencing-Token": "1",
                    "Outbox-Tenant": "bench",
                },
            )
            return r.status_code

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(send, range(requests)))
        return requests / (time.perf_counter() - t0)


def compare(dsn: str, requests: int, concurrency: int = 32) -> tuple[float, float]:
    """(outboxd rows/s, raw httpx requests/s)."""
    server = _receiver()
    url = f"http://127.0.0.1:{server.server_port}/e"
    try:
        raw = raw_httpx(url, requests, concurrency)
        prepare(dsn)
        fill(dsn, requests, provider="rx")
        provider = (
            f'[providers.rx]\nkind = "http"\nurl = "{url}"\ndedup_retention_seconds = 86400\n'
        )
        ours = drain(dsn, requests, batch=concurrency, provider=provider)["rows_per_s"]
    finally:
        server.shutdown()
    return ours, raw
