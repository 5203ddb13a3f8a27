"""The ``http`` provider: POST the payload with its idempotency key; GET to look it up.

Wire protocol (DESIGN.md, contract): see :mod:`providers.http_response` for the status
table. Request headers: ``Idempotency-Key``, ``Outbox-Operation-Id``,
``Outbox-Fencing-Token``, ``Outbox-Tenant``, ``traceparent`` (when the row has one), and
the configured ``headers`` whose values are ``env:``/``file:`` references; with
``signing = "standard-webhooks"``, the Standard Webhooks headers
(:mod:`providers.webhook_signing`) over the exact body bytes sent.

Transport failures are split by whether the request may have reached the receiver:
connect errors, connect timeouts and pool timeouts happen before a byte is written
(``RETRYABLE``, ``BEFORE_WRITE``); anything later (read timeout, connection reset, the
server closing without a response, write errors) is ``AMBIGUOUS``, ``AFTER_WRITE``.

One ``httpx.Client`` (thread-safe, pooled) serves every worker thread. Redirects are not
followed; the response body is read up to ``max_response_bytes`` and the rest dropped.
Logs carry the provider name, operation id, status and outcome: never payloads, response
bodies or header values.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

import httpx

from outbox.credential_refs import Secret, resolve_secret
from providers import cloudevents_envelope, webhook_signing
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
from providers.cloudevents_envelope import Envelope
from providers.http_response import build_receipt, classify_response, transport_outcome
from providers.options import SectionReader, read_capabilities
from providers.webhook_signing import WebhookSigner

log = logging.getLogger("outboxd.providers.http")

KIND: Final = "http"
PROTOCOL_HEADERS: Final = frozenset(
    {"idempotency-key", "outbox-operation-id", "outbox-fencing-token", "outbox-tenant",
     "traceparent", "content-type", "content-length", "host", "accept-encoding"}
) | webhook_signing.HEADERS
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
BEFORE_WRITE_ERRORS: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class TotalTimeout(Exception):
    """The whole exchange took longer than ``timeout_seconds``."""


class HttpProvider:
    """Sends one dispatch per call; safe to call from many threads at once."""

    def __init__(
        self,
        name: str,
        *,
        url: str,
        capabilities: Capabilities,
        lookup_url: str | None = None,
        headers: Mapping[str, Secret] | None = None,
        mismatch_status: int = 422,
        connect_timeout_seconds: float = 5.0,
        max_response_bytes: int = 64 * 1024,
        max_connections: int = 64,
        signer: WebhookSigner | None = None,
        envelope: Envelope | None = None,
    ) -> None:
        self.name = name
        self._signer = signer
        self._envelope = envelope
        self.capabilities = capabilities
        self.url = url
        self.lookup_url = lookup_url
        self._headers = dict(headers or {})
        self.mismatch_status = mismatch_status
        self.max_response_bytes = max_response_bytes
        total = capabilities.timeout_seconds
        self._total = total
        connect = min(connect_timeout_seconds, total)  # also bounds the wait for a pooled slot
        self._client = httpx.Client(
            timeout=httpx.Timeout(total, connect=connect, pool=connect),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            follow_redirects=False,
            trust_env=False,
        )

    def __repr__(self) -> str:
        return f"HttpProvider(name={self.name!r}, url={self.url!r})"

    # -- sending -----------------------------------------------------------------------

    def _request_headers(self, dispatch: Dispatch) -> dict[str, str]:
        headers = {name: secret.reveal() for name, secret in self._headers.items()}
        headers.update(
            {
                "Content-Type": "application/json",
                "Accept-Encoding": "identity",  # the body is read raw and bounded
                "Idempotency-Key": dispatch.idempotency_key,
                "Outbox-Operation-Id": dispatch.operation_id,
                "Outbox-Fencing-Token": str(dispatch.fencing_token),
                "Outbox-Tenant": dispatch.tenant_id,
            }
        )
        if dispatch.traceparent:
            headers["traceparent"] = dispatch.traceparent
        for name, value in headers.items():
            if not _HEADER_VALUE.match(value):
                # refused here, before anything is written: never an ambiguous outcome
                raise ValueError(f"the {name} header value is not printable ASCII")
        return headers

    def send(self, dispatch: Dispatch) -> Outcome:
        try:
            headers = self._request_headers(dispatch)
            if self._envelope is not None:
                body, described = self._envelope.wrap(dispatch, dispatch.payload)
                headers.update(described)
            else:
                body = json.dumps(dispatch.payload, separators=(",", ":"),
                                  ensure_ascii=False).encode("utf-8")
            if self._signer is not None:  # over the exact bytes sent, at this attempt
                headers.update(self._signer.headers(dispatch.idempotency_key, body))
            request = self._client.build_request("POST", self.url, content=body,
                                                 headers=headers)
        except Exception as exc:  # nothing left the process: a definite, local refusal
            outcome = transport_outcome(
                OutcomeKind.REJECTED, TransportPhase.BEFORE_WRITE, exc,
                "the request could not be built",
            )
        else:
            outcome = self._exchange(request)
        log.debug(
            "http send provider=%s operation_id=%s attempt=%d status=%s outcome=%s phase=%s",
            self.name, dispatch.operation_id, dispatch.attempt, outcome.status_code,
            outcome.kind.value, outcome.transport_phase.value,
        )
        return outcome

    def _exchange(self, request: httpx.Request) -> Outcome:
        deadline = time.monotonic() + self._total
        try:
            response = self._client.send(request, stream=True, follow_redirects=False)
            try:
                body, truncated = self._read_bounded(response, deadline)
            finally:
                response.close()
        except BEFORE_WRITE_ERRORS as exc:
            return transport_outcome(
                OutcomeKind.RETRYABLE, TransportPhase.BEFORE_WRITE, exc,
                "no connection: the request was not sent",
            )
        except (httpx.TransportError, TotalTimeout) as exc:
            return transport_outcome(
                OutcomeKind.AMBIGUOUS, TransportPhase.AFTER_WRITE, exc,
                "the request may have been received; no complete response",
            )
        headers = {k.lower(): v for k, v in response.headers.items()}
        receipt = build_receipt(response.status_code, headers, body, truncated=truncated)
        return classify_response(
            response.status_code, response.reason_phrase, headers, receipt,
            mismatch_status=self.mismatch_status,
        )

    def _read_bounded(self, response: httpx.Response, deadline: float) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_raw():
            if time.monotonic() > deadline:
                raise TotalTimeout
            room = self.max_response_bytes - size
            if len(chunk) >= room + 1:
                chunks.append(chunk[:room])
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), False

    # -- lookup ------------------------------------------------------------------------

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        if self.lookup_url is None:
            return LookupResult(kind=LookupKind.UNSUPPORTED)
        url = self.lookup_url.replace(
            "{idempotency_key}", quote(dispatch.idempotency_key, safe="")
        ).replace("{operation_id}", quote(dispatch.operation_id, safe=""))
        observed = datetime.now(UTC)
        headers = {name: secret.reveal() for name, secret in self._headers.items()}
        headers["Accept"] = "application/json"
        headers["Accept-Encoding"] = "identity"
        try:
            request = self._client.build_request("GET", url, headers=headers)
            response = self._client.send(request, stream=True, follow_redirects=False)
            try:
                body, truncated = self._read_bounded(response, time.monotonic() + self._total)
            finally:
                response.close()
        except (httpx.HTTPError, TotalTimeout, ValueError) as exc:
            name = type(exc).__name__
            log.debug("http lookup provider=%s operation_id=%s error=%s",
                      self.name, dispatch.operation_id, name)
            return LookupResult(
                kind=LookupKind.INDETERMINATE, evidence={"error_class": name},
                observed_at=observed,
            )
        status = response.status_code
        headers_lc = {k.lower(): v for k, v in response.headers.items()}
        receipt = build_receipt(status, headers_lc, body, truncated=truncated)
        kind = {200: LookupKind.FOUND, 404: LookupKind.NOT_FOUND}.get(
            status, LookupKind.INDETERMINATE
        )
        log.debug("http lookup provider=%s operation_id=%s status=%d result=%s",
                  self.name, dispatch.operation_id, status, kind.value)
        return LookupResult(
            kind=kind,
            receipt=receipt if kind is LookupKind.FOUND else None,
            evidence={"status_code": status, "body_sha256": receipt["body_sha256"]},
            observed_at=observed,
        )

    def close(self) -> None:
        self._client.close()


def _check_url(reader: SectionReader, key: str, value: str) -> str:
    try:
        parsed = httpx.URL(value)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise reader.error(key, "is not a valid URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise reader.error(key, "must be an http:// or https:// URL with a host")
    return value


def _read_signing(reader: SectionReader) -> WebhookSigner | None:
    """``signing = "standard-webhooks"`` with ``signing_secrets`` (references), or None."""
    scheme = reader.choice("signing", "none", ("none", webhook_signing.SCHEME))
    references = reader.raw("signing_secrets")
    if scheme == "none":
        if references is not None:
            raise reader.error("signing_secrets", "is set but signing is not: add "
                               f'signing = "{webhook_signing.SCHEME}"')
        return None
    if not isinstance(references, list) or not references:
        raise reader.error("signing_secrets", 'needs at least one secret reference, e.g. '
                           '["env:WEBHOOK_SECRET"] (the newest first while rotating)')
    keys = []
    for i, reference in enumerate(references):
        key = f"signing_secrets[{i}]"
        secret = resolve_secret(reference, reader.key(key))
        try:
            keys.append(webhook_signing.secret_key(secret))
        except ValueError as exc:
            raise reader.error(key, f"{secret.reference} {exc}") from None
    return WebhookSigner(keys)


def _read_envelope(name: str, reader: SectionReader) -> Envelope | None:
    """``envelope = "cloudevents-binary" | "cloudevents-structured"``, or None."""
    mode = reader.choice("envelope", "none", ("none", *cloudevents_envelope.MODES))
    source = reader.optional_string("event_source")
    type_ = reader.optional_string("event_type")
    if mode == "none":
        for key, value in (("event_source", source), ("event_type", type_)):
            if value is not None:
                raise reader.error(key, "is set but envelope is not: add envelope = "
                                   f'"{cloudevents_envelope.BINARY}" or '
                                   f'"{cloudevents_envelope.STRUCTURED}"')
        return None
    return Envelope(mode, source=source or cloudevents_envelope.default_source(name),
                    type_=type_ or cloudevents_envelope.default_type(name))


def build_http(name: str, reader: SectionReader) -> HttpProvider:
    """Build from a ``[providers.NAME]`` table with ``kind = "http"``."""
    url = _check_url(reader, "url", reader.string("url", required=True))
    lookup_url = reader.optional_string("lookup_url")
    if lookup_url is not None:
        if "{idempotency_key}" not in lookup_url and "{operation_id}" not in lookup_url:
            raise reader.error("lookup_url", "needs {idempotency_key} or {operation_id}")
        _check_url(reader, "lookup_url", lookup_url.replace("{", "").replace("}", ""))
    headers: dict[str, Secret] = {}
    for header, reference in reader.table("headers").items():
        key = f"headers.{header}"
        if not isinstance(header, str) or not _TOKEN.match(header):
            raise reader.error("headers", "header names must be HTTP tokens")
        if header.lower() in PROTOCOL_HEADERS:
            raise reader.error(key, "is set by the provider and cannot be configured")
        headers[header] = resolve_secret(reference, reader.key(key))
    signer = _read_signing(reader)
    envelope = _read_envelope(name, reader)
    if envelope is not None and any(h.lower().startswith("ce-") for h in headers):
        raise reader.error("headers", "ce- headers are the CloudEvents envelope's")
    mismatch = reader.integer("mismatch_status", 422)
    if mismatch not in (400, 422):
        raise reader.error("mismatch_status", "must be 422 or 400")
    capabilities = read_capabilities(
        reader,
        lookup_available=lookup_url is not None,
        default_consistency=LookupConsistency.STRONG,
    )
    provider_args: dict[str, Any] = {
        "connect_timeout_seconds": reader.number(
            "connect_timeout_seconds", min(5.0, capabilities.timeout_seconds),
            exclusive_minimum=True,
        ),
        "max_response_bytes": reader.integer("max_response_bytes", 64 * 1024, minimum=1024),
        "max_connections": reader.integer("max_connections", 64, minimum=1),
        "signer": signer,
        "envelope": envelope,
    }
    reader.finish()
    return HttpProvider(
        name, url=url, lookup_url=lookup_url, headers=headers, mismatch_status=mismatch,
        capabilities=capabilities, **provider_args,
    )
