"""The ``nats`` provider: publish to JetStream with ``Nats-Msg-Id`` = the idempotency key.

Deduplication window: JetStream drops a message whose ``Nats-Msg-Id`` it has seen within
the stream's ``duplicate_window`` (and acks it with ``duplicate: true``, reported as
``replayed``). The window belongs to the *stream*, so it is read from the server at
start-up and declared as ``dedup_retention_seconds``; configuring that key here is an
error (a configured value could only disagree with the truth). Past the window a re-send
with the same id is stored again: a duplicate. That is why the dispatcher never re-sends
blindly once the window may have passed.

Lookup: every operation has its own subject (the ``subject`` template must contain
``{operation_id}``); a lookup asks JetStream for the last message on that subject and
answers FOUND when its ``Nats-Msg-Id`` is the key, NOT_FOUND otherwise. The stream
acknowledges a publish only once stored, so this is declared ``strong``, valid as long as
the stream keeps messages (limits retention; see docs/providers.md for the ``max_age``
hazard). Streams with ``workqueue``/``interest`` retention remove consumed messages, so
their lookup is declared ``none`` (``UNSUPPORTED``).

nats-py is asyncio: a private event loop runs in a background thread and the synchronous
``send``/``lookup`` (called from many worker threads) submit coroutines to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js.api import RetentionPolicy

from outbox.credential_refs import resolve_secret
from outbox.errors import OutboxError, ProviderConfigError
from providers.base import (
    Capabilities,
    Dispatch,
    LookupConsistency,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
    TransportPhase,
)
from providers.options import SectionReader, read_capabilities

log = logging.getLogger("outboxd.providers.nats")
KIND: Final = "nats"
DEFAULT_SUBJECT: Final = "outbox.{tenant_id}.{operation_id}"
_SAFE = re.compile(r"[A-Za-z0-9_-]")
T = TypeVar("T")


class ProviderUnavailableError(OutboxError):
    """The provider's server cannot be reached at start-up."""


def subject_token(value: str) -> str:
    """An injective encoding of any string into one valid subject token.

    ``[A-Za-z0-9_-]`` pass through; every other byte of the UTF-8 form becomes ``~XX``;
    the empty string becomes ``~``. Distinct operations never share a subject.
    """
    if not value:
        return "~"
    out: list[str] = []
    for char in value:
        if _SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"~{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, a final ``>`` one or more."""
    parts, tokens = pattern.split("."), subject.split(".")
    for index, part in enumerate(parts):
        if part == ">":
            return len(tokens) > index
        if index >= len(tokens) or (part != "*" and part != tokens[index]):
            return False
    return len(parts) == len(tokens)


class _LoopThread:
    """A private asyncio loop in a daemon thread, driven from synchronous code."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class NatsProvider:
    def __init__(
        self, name: str, *, servers: list[str], stream: str, subject: str,
        capabilities: Capabilities | None = None, connect_options: dict[str, Any] | None = None,
        connect_timeout_seconds: float = 5.0,
    ) -> None:
        """Connect and read the stream; ``capabilities`` from the caller are refined with
        the stream's duplicate window and retention."""
        self.name = name
        self.stream = stream
        self.subject_template = subject
        self._loop = _LoopThread(f"nats-{name}")
        base = capabilities or Capabilities(dedup_retention_seconds=0.0)
        self._timeout = base.timeout_seconds
        try:
            self._nc = self._loop.run(
                nats.connect(
                    servers=servers, connect_timeout=connect_timeout_seconds,
                    allow_reconnect=True, max_reconnect_attempts=-1,
                    **(connect_options or {}),
                ),
                connect_timeout_seconds + 1,
            )
        except Exception as exc:
            self._loop.stop()
            raise ProviderUnavailableError(
                provider=name, error_class=type(exc).__name__
            ) from None
        try:
            self._js = self._nc.jetstream(timeout=self._timeout)
            info = self._loop.run(self._nc.jsm().stream_info(stream),
                                  self._timeout + 1)
        except Exception as exc:
            self.close()
            raise ProviderConfigError(
                f"providers.{name}.stream: cannot read stream {stream!r}"
                f" ({type(exc).__name__})"
            ) from None
        config = info.config
        sample = self.subject_for("tenant", "operation")
        if not any(subject_matches(p, sample) for p in (config.subjects or [])):
            self.close()
            raise ProviderConfigError(
                f"providers.{name}.subject: subjects like {sample!r} are not in stream {stream!r}"
            )
        keeps_messages = config.retention in (None, RetentionPolicy.LIMITS)
        self.capabilities = Capabilities(
            dedup_retention_seconds=float(config.duplicate_window or 0.0),
            lookup_consistency=(
                base.lookup_consistency if keeps_messages else LookupConsistency.NONE
            ),
            lookup_settle_seconds=base.lookup_settle_seconds,
            in_flight_seconds=base.in_flight_seconds,
            fencing=False,
            payload_schemas=base.payload_schemas,
            max_attempts=base.max_attempts,
            max_elapsed_seconds=base.max_elapsed_seconds,
            timeout_seconds=base.timeout_seconds,
            retry_max_delay_seconds=base.retry_max_delay_seconds,
        )
        self.stream_max_age_seconds = float(config.max_age or 0.0)
        log.info("nats provider=%s stream=%s duplicate_window=%gs lookup=%s",
                 name, stream, self.capabilities.dedup_retention_seconds,
                 self.capabilities.lookup_consistency.value)

    def __repr__(self) -> str:
        return f"NatsProvider(name={self.name!r}, stream={self.stream!r})"

    def subject_for(self, tenant_id: str, operation_id: str) -> str:
        return self.subject_template.replace("{tenant_id}", subject_token(tenant_id)).replace(
            "{operation_id}", subject_token(operation_id)
        )

    def send(self, dispatch: Dispatch) -> Outcome:
        subject = self.subject_for(dispatch.tenant_id, dispatch.operation_id)
        headers = {
            "Nats-Msg-Id": dispatch.idempotency_key,
            "Outbox-Operation-Id": dispatch.operation_id,
            "Outbox-Fencing-Token": str(dispatch.fencing_token),
            "Outbox-Tenant": dispatch.tenant_id,
        }
        if dispatch.traceparent:
            headers["traceparent"] = dispatch.traceparent
        try:
            data = json.dumps(dispatch.payload, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            return self._failure(OutcomeKind.REJECTED, TransportPhase.BEFORE_WRITE, exc)
        if self._nc.is_closed:
            return self._failure(OutcomeKind.RETRYABLE, TransportPhase.BEFORE_WRITE,
                                 nats.errors.ConnectionClosedError())
        try:
            ack = self._loop.run(
                self._js.publish(subject, data, timeout=self._timeout, stream=self.stream,
                                 headers=headers),
                self._timeout + 1,
            )
        except nats.errors.NoRespondersError as exc:  # no stream took it: not stored
            outcome = self._failure(OutcomeKind.RETRYABLE, TransportPhase.RESPONSE, exc)
        except nats.js.errors.ServiceUnavailableError as exc:
            outcome = self._failure(OutcomeKind.RETRYABLE, TransportPhase.RESPONSE, exc)
        except nats.js.errors.APIError as exc:  # JetStream refused to store it
            outcome = self._failure(OutcomeKind.REJECTED, TransportPhase.RESPONSE, exc,
                                    code=getattr(exc, "err_code", None))
        except Exception as exc:  # timeout, lost connection: it may have been stored
            outcome = self._failure(OutcomeKind.AMBIGUOUS, TransportPhase.AFTER_WRITE, exc)
        else:
            receipt = {"stream": ack.stream, "seq": ack.seq, "duplicate": bool(ack.duplicate),
                       "domain": ack.domain, "subject": subject}
            outcome = Outcome(kind=OutcomeKind.APPLIED, receipt=receipt,
                              replayed=bool(ack.duplicate), evidence={"seq": ack.seq})
        log.debug("nats send provider=%s operation_id=%s outcome=%s replayed=%s", self.name,
                  dispatch.operation_id, outcome.kind.value, outcome.replayed)
        return outcome

    @staticmethod
    def _failure(kind: OutcomeKind, phase: TransportPhase, exc: BaseException,
                 code: int | None = None) -> Outcome:
        name = type(exc).__name__
        reason = name if code is None else f"{name} (JetStream error code {code})"
        return Outcome(kind=kind, reason=reason, transport_phase=phase, error_class=name,
                       evidence={"error_class": name, "transport_phase": phase.value})

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        if self.capabilities.lookup_consistency is LookupConsistency.NONE:
            return LookupResult(kind=LookupKind.UNSUPPORTED)
        subject = self.subject_for(dispatch.tenant_id, dispatch.operation_id)
        observed = datetime.now(UTC)
        try:
            message = self._loop.run(
                self._nc.jsm().get_last_msg(self.stream, subject),
                self._timeout + 1,
            )
        except nats.js.errors.NotFoundError:
            return LookupResult(kind=LookupKind.NOT_FOUND, observed_at=observed,
                                evidence={"subject": subject})
        except Exception as exc:
            return LookupResult(kind=LookupKind.INDETERMINATE, observed_at=observed,
                                evidence={"error_class": type(exc).__name__})
        msg_id = (message.headers or {}).get("Nats-Msg-Id")
        if msg_id != dispatch.idempotency_key:
            return LookupResult(kind=LookupKind.NOT_FOUND, observed_at=observed,
                                evidence={"subject": subject, "last_seq": message.seq})
        receipt = {"stream": self.stream, "seq": message.seq, "subject": subject,
                   "time": message.time.isoformat() if message.time else None}
        return LookupResult(kind=LookupKind.FOUND, receipt=receipt, observed_at=observed,
                            evidence={"seq": message.seq})

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self._nc.close(), 10)
        except Exception as exc:  # best effort on the way out
            log.debug("nats close provider=%s error=%s", self.name, type(exc).__name__)
        self._loop.stop()


def build_nats(name: str, reader: SectionReader) -> NatsProvider:
    if reader.has("dedup_retention_seconds"):
        raise reader.error("dedup_retention_seconds",
                           "is read from the stream's duplicate_window; do not configure it")
    servers_raw = reader.raw("servers")
    if servers_raw is None:
        servers = ["nats://127.0.0.1:4222"]
    elif isinstance(servers_raw, str) and servers_raw:
        servers = [servers_raw]
    elif isinstance(servers_raw, list) and servers_raw and all(
        isinstance(s, str) and s for s in servers_raw
    ):
        servers = list(servers_raw)
    else:
        raise reader.error("servers", "must be a URL or a list of URLs")
    stream = reader.string("stream", required=True)
    subject = reader.string("subject", DEFAULT_SUBJECT)
    if "{operation_id}" not in subject:
        raise reader.error("subject", "must contain {operation_id}: one subject per operation")
    rest = subject.replace("{operation_id}", "o").replace("{tenant_id}", "t")
    if not re.fullmatch(r"[A-Za-z0-9_~=-]+(\.[A-Za-z0-9_~=-]+)*", rest):
        raise reader.error("subject", "must be dot-separated tokens without wildcards")
    options: dict[str, Any] = {}
    if reader.has("token"):
        options["token"] = resolve_secret(reader.raw("token"), reader.key("token")).reveal()
    if reader.has("user"):
        options["user"] = reader.string("user", required=True)
        options["password"] = resolve_secret(
            reader.raw("password"), reader.key("password")
        ).reveal()
    connect_timeout = reader.number("connect_timeout_seconds", 5.0, exclusive_minimum=True)
    capabilities = read_capabilities(
        reader, lookup_available=True, default_consistency=LookupConsistency.STRONG
    )
    reader.finish()
    return NatsProvider(
        name, servers=servers, stream=stream, subject=subject, capabilities=capabilities,
        connect_options=options, connect_timeout_seconds=connect_timeout,
    )
