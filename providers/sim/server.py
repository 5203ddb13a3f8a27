"""``outboxd sim``: a real HTTP receiver that honours ``Idempotency-Key``, with faults.

Endpoints:

* ``POST /effects`` (or any path not starting with ``/_``) — apply an effect. Requires
  ``Idempotency-Key`` (``ietf`` profile: 400 without; ``stripe``: applied without
  deduplication). Same key and body → the saved response again with
  ``Idempotent-Replayed: true``; same key, other body → 422 (``ietf``) or 400 with an
  ``idempotency_error`` body (``stripe``); same key still being applied → 409. With
  fencing enforced, an ``Outbox-Fencing-Token`` lower than the highest seen for the key →
  412 (not 409: 409 means "in flight, retry later", a stale token must never be retried).
  New effect → 201 ``{"effect_id", "idempotency_key", "applied_at"}``.
* ``GET /effects/by-key/{key}`` — 200 with the latest effect's receipt, 404 if none (or
  none older than the lookup lag).
* ``GET /_effects`` — every applied effect in order (key, fencing token, applied_at).
* ``GET /_stats``, ``GET|POST /_control`` (JSON settings), ``POST /_prune``
  (``{"all": true}`` forgets every completed key; otherwise keys past retention).

Fault order for an effect request: 429 / 503 / 500-before (nothing applied) → fencing →
key store (replay / mismatch / in flight) → slow (sleep, then apply) → apply and persist →
drop the connection without a response, or 500-after (applied).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import unquote

from providers.sim.faults import Decision, FaultDice, SettingsError, SimSettings
from providers.sim.ledger import Ledger

log = logging.getLogger("outboxd.sim")
MAX_BODY_BYTES: Final = 1024 * 1024
BY_KEY: Final = "/by-key/"
STRIPE_MISMATCH: Final = {
    "error": {
        "type": "idempotency_error",
        "message": "Keys for idempotent requests can only be used with the same parameters"
        " they were first used with.",
    }
}


class SimServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], ledger: Ledger, settings: SimSettings,
        dice: FaultDice,
    ) -> None:
        self.ledger = ledger
        self.settings = settings
        self.dice = dice
        self.settings_lock = threading.Lock()
        super().__init__(address, SimHandler)

    def current(self) -> SimSettings:
        with self.settings_lock:
            return self.settings.snapshot()


class SimHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SimServer
    server_version = "outboxd-sim"
    disable_nagle_algorithm = True  # headers and body go out as separate writes

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("sim %s", format % args)

    # -- plumbing ----------------------------------------------------------------------

    def _read_body(self) -> bytes | None:
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._send_json(411, {"error": "Content-Length required"}, close=True)
            return None
        try:
            length = int(length_text)
        except ValueError:
            self._send_json(400, {"error": "bad Content-Length"}, close=True)
            return None
        if length < 0 or length > MAX_BODY_BYTES:
            self._send_json(413, {"error": "body too large"}, close=True)
            return None
        return self.rfile.read(length)

    def _send_json(
        self, status: int, body: Any, headers: dict[str, str] | None = None, *,
        close: bool = False,
    ) -> None:
        data = json.dumps(body, sort_keys=True).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client gave up (e.g. timed out during a slow apply)
            self.close_connection = True

    # -- routing -----------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/_stats":
            self._send_json(200, self.server.ledger.stats())
        elif path == "/_effects":
            self._send_json(200, {"effects": self.server.ledger.effects()})
        elif path == "/_control":
            self._send_json(200, self.server.current().as_dict())
        elif not path.startswith("/_") and BY_KEY in path:
            self._lookup(unquote(path.rsplit(BY_KEY, 1)[1]))
        else:
            self._send_json(404, {"error": "not found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        body = self._read_body()
        if body is None:
            return
        if path == "/_control":
            self._control(body)
        elif path == "/_prune":
            self._prune(body)
        elif path.startswith("/_"):
            self._send_json(404, {"error": "not found"})
        else:
            self._effect(body)

    # -- endpoints ---------------------------------------------------------------------

    def _lookup(self, key: str) -> None:
        receipt = self.server.ledger.lookup(key, self.server.current().lookup_lag_seconds)
        if receipt is None:
            self._send_json(404, {"error": "no effect for this key"})
        else:
            self._send_json(200, receipt)

    def _control(self, body: bytes) -> None:
        try:
            changes = json.loads(body or b"{}")
            if not isinstance(changes, dict):
                raise SettingsError("a JSON object is required")
            with self.server.settings_lock:
                self.server.settings.update(changes)
        except (ValueError, SettingsError) as exc:
            self._send_json(400, {"error": str(exc)})
            return
        log.info("sim settings changed: %s", ", ".join(sorted(changes)))
        self._send_json(200, self.server.current().as_dict())

    def _prune(self, body: bytes) -> None:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict):
            self._send_json(400, {"error": "a JSON object is required"})
            return
        retention = None if request.get("all") else self.server.current().retention_seconds
        self._send_json(200, {"pruned": self.server.ledger.prune(retention)})

    def _fault(self, decision: Decision, name: str) -> None:
        self.server.ledger.count(f"fault:{name}")
        log.info("sim fault request=%d fault=%s", decision.index, name)

    def _effect(self, body: bytes) -> None:
        server, ledger = self.server, self.server.ledger
        settings = server.current()
        ledger.count("requests")
        decision = server.dice.decide(settings)
        key = self.headers.get("Idempotency-Key") or None
        if key is None and settings.profile == "ietf":
            self._send_json(400, {"type": "about:blank", "title": "Idempotency-Key is missing"})
            return
        try:
            json.loads(body)
        except ValueError:
            self._send_json(400, {"error": "the body is not JSON"})
            return
        retry = {"Retry-After": f"{settings.retry_after:g}"}
        if decision.fault_429:
            self._fault(decision, "429")
            self._send_json(429, {"error": "rate limited"}, retry)
            return
        if decision.fault_503:
            self._fault(decision, "503")
            self._send_json(503, {"error": "unavailable"}, retry)
            return
        if decision.fault_5xx_before:
            self._fault(decision, "5xx_before")
            self._send_json(500, {"error": "internal error (nothing applied)"})
            return
        if settings.enforce_fencing and key is not None and not self._fence_ok(key):
            return
        digest = hashlib.sha256(body).hexdigest()
        track = key is not None and not settings.ignore_keys
        if track and key is not None and not self._claim(key, digest, settings):
            return
        try:
            if decision.slow:
                self._fault(decision, "slow")
                time.sleep(settings.slow_seconds)
            receipt = ledger.apply(key, digest, track_key=track,
                                   fencing_token=self._fencing_token())
        except BaseException:
            if track and key is not None:
                ledger.abandon(key)
            raise
        if decision.drop_after_apply:
            self._fault(decision, "drop_after_apply")
            self.close_connection = True  # applied and persisted; no response at all
            return
        if decision.fault_5xx_after:
            self._fault(decision, "5xx_after")
            self._send_json(500, {"error": "internal error (after applying)"})
            return
        self._send_json(201, receipt)

    def _fencing_token(self) -> int | None:
        try:
            return int(self.headers.get("Outbox-Fencing-Token", ""))
        except ValueError:
            return None

    def _fence_ok(self, key: str) -> bool:
        try:
            token = int(self.headers.get("Outbox-Fencing-Token", ""))
        except ValueError:
            self._send_json(400, {"error": "Outbox-Fencing-Token must be an integer"})
            return False
        if self.server.ledger.check_fence(key, token):
            return True
        self.server.ledger.count("fenced")
        self._send_json(412, {"error": "stale fencing token", "fencing_token": token})
        return False

    def _claim(self, key: str, digest: str, settings: SimSettings) -> bool:
        ledger = self.server.ledger
        begin = ledger.begin(key, digest, settings.retention_seconds)
        if begin.state == "new":
            return True
        if begin.state == "replay":
            ledger.count("replays")
            self._send_json(
                begin.status or 201, begin.response, {"Idempotent-Replayed": "true"}
            )
        elif begin.state == "mismatch":
            ledger.count("mismatches")
            if settings.profile == "stripe":
                self._send_json(400, STRIPE_MISMATCH)
            else:
                self._send_json(
                    422, {"type": "about:blank",
                          "title": "Idempotency-Key reused with a different payload"},
                )
        else:
            ledger.count("in_flight_conflicts")
            body = (
                {"error": {"type": "idempotency_error",
                           "message": "A request with this key is in progress."}}
                if settings.profile == "stripe"
                else {"type": "about:blank", "title": "A request with this key is in progress"}
            )
            self._send_json(409, body)
        return False
