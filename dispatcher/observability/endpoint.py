"""The daemon's HTTP endpoint: ``/metrics`` (Prometheus), ``/healthz`` (process alive and
the loop not wedged), ``/readyz`` (database reachable, migrations current, providers
configured). Stdlib server on a daemon thread; port 0 picks a free port."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dispatcher.observability.metrics import REGISTRY

log = logging.getLogger("outboxd.http")


class Health:
    """Shared between the loop (heartbeats) and the endpoint."""

    def __init__(self, wedged_after: float = 60.0) -> None:
        self.last_beat = time.monotonic()
        self.wedged_after = wedged_after
        self.ready_check: Callable[[], str | None] = lambda: None
        self.warnings: list[str] = []  # said on /readyz without making it fail

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < self.wedged_after


def serve(host: str, port: int, health: Health) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif self.path.startswith("/healthz"):
                ok = health.alive()
                since = round(time.monotonic() - health.last_beat, 3)
                self._json(200 if ok else 503, {"alive": ok, "loop_seconds_since_beat": since})
            elif self.path.startswith("/readyz"):
                problem = health.ready_check()
                self._json(
                    200 if problem is None else 503,
                    {"ready": problem is None, "problem": problem, "warnings": health.warnings},
                )
            else:
                self._json(404, {"error": "not found"})

        def _json(self, code: int, body: object) -> None:
            self._send(code, json.dumps(body).encode(), "application/json")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="outboxd-http", daemon=True).start()
    log.info(
        "metrics endpoint listening",
        extra={"url": f"http://{host}:{server.server_port}", "port": server.server_port},
    )
    return server
