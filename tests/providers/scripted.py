"""A tiny real HTTP server whose replies a test scripts: for statuses and transport
failures the sim cannot produce. Records every request it receives (headers and body)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from providers.base import Dispatch


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"ok": true}'
    action: str = "respond"
    """``respond``; ``close`` (read the request, close without a response); ``hang``
    (read the request, never answer until the server closes); ``trickle`` (send headers,
    then the body one byte every ``delay`` seconds); ``partial`` (headers announce more
    body than is sent, then close)."""
    delay: float = 0.0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedServer:
    def __init__(self) -> None:
        self.replies: Callable[[Recorded], Reply] = lambda _request: Reply()
        self.requests: list[Recorded] = []
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorded = Recorded(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
                outer.requests.append(recorded)
                reply = outer.replies(recorded)
                if reply.action == "close":
                    self.close_connection = True
                    return
                if reply.action == "hang":
                    outer.closing.wait(30)
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                announced = len(reply.body) * (2 if reply.action == "partial" else 1)
                self.send_header("Content-Length", str(announced))
                self.end_headers()
                if reply.action == "trickle":
                    for index in range(len(reply.body)):
                        if outer.closing.wait(reply.delay):
                            break
                        try:
                            self.wfile.write(reply.body[index : index + 1])
                            self.wfile.flush()
                        except OSError:
                            break
                    self.close_connection = True
                    return
                self.wfile.write(reply.body)
                if reply.action == "partial":
                    self.wfile.flush()
                    self.close_connection = True

            do_GET = _handle
            do_POST = _handle

        class Server(ThreadingHTTPServer):
            request_queue_size = 128
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def always(self, reply: Reply) -> None:
        self.replies = lambda _request: reply

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        time.sleep(0.01)


_counter = 0


def make_dispatch(**overrides: Any) -> Dispatch:
    global _counter
    _counter += 1
    values: dict[str, Any] = {
        "tenant_id": "tenant-a",
        "task_id": "task-1",
        "operation_id": f"op-{_counter}",
        "idempotency_key": f"key-{_counter}-{time.monotonic_ns()}",
        "fencing_token": 1,
        "payload": {"amount": 100, "currency": "eur"},
    }
    values.update(overrides)
    return Dispatch(**values)
