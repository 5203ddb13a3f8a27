"""What ``[tracing]`` costs: the null-provider drain with a span per attempt, exported over
OTLP/HTTP to a loopback collector that accepts and counts them. Off (the default) is the
ordinary null-provider drain: nothing of OpenTelemetry is imported there.
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.daemon_runs import drain, fill, prepare

TRACING_ON = '[tracing]\nenabled = true\nexporter = "otlp"\nservice_name = "outboxd-bench"\n'


class Collector(ThreadingHTTPServer):
    """Accepts OTLP/HTTP trace exports (an empty protobuf response is a valid success)."""

    daemon_threads = True
    exports = 0


def collector() -> Collector:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            server.exports += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = Collector(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def drain_traced(dsn: str, rows: int, batch: int) -> float:
    """rows/s of the null-provider drain with ``[tracing]`` on."""
    server = collector()
    before = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_port}"
    try:
        prepare(dsn)
        fill(dsn, rows)
        return drain(dsn, rows, batch=batch, extra=TRACING_ON)["rows_per_s"]
    finally:
        if before is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        else:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = before
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    import sys

    from bench.harness import scratch_database

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    off, on = [], []
    for _ in range(3):  # alternately, so a drifting machine weighs on both
        with scratch_database() as scratch:
            prepare(scratch)
            fill(scratch, count)
            off.append(drain(scratch, count, batch=100)["rows_per_s"])
        with scratch_database() as scratch:
            on.append(drain_traced(scratch, count, 100))
    off.sort()
    on.sort()
    print(f"null provider, batch 100: [tracing] off {off[1]:,.0f} rows/s, on {on[1]:,.0f} "
          f"rows/s (medians of 3); on / off {on[1] / off[1]:.2f}")
