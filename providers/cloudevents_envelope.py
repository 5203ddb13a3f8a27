"""CloudEvents 1.0 envelopes for the ``http`` provider (``envelope = "cloudevents-binary"`` or
``"cloudevents-structured"``), per the CloudEvents HTTP protocol binding.

The event's attributes come from the operation, so every re-send is the same event:

* ``id`` — the idempotency key (a receiver deduplicating on ``source`` + ``id``, as the
  specification suggests, sees one event);
* ``source`` and ``type`` — ``event_source`` / ``event_type`` from the configuration,
  defaulting to ``/outboxd/providers/<name>`` and ``dev.outboxd.<name>``;
* ``time`` — when the agent staged the operation (the row's ``created_at``);
* ``subject`` — the operation id; ``datacontenttype`` — ``application/json``; ``data`` —
  the payload.

Binary mode sends the payload as the body and the attributes as ``ce-`` headers
(percent-encoded where the binding says so); structured mode sends one
``application/cloudevents+json`` document holding both. Either way the body is built once
per attempt, and a signature (:mod:`providers.webhook_signing`) covers its exact bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

from providers.base import Dispatch

BINARY: Final = "cloudevents-binary"
STRUCTURED: Final = "cloudevents-structured"
MODES: Final = (BINARY, STRUCTURED)
SPECVERSION: Final = "1.0"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"
# the binding's header encoding: printable ASCII but space, '"' and '%' is sent as is
_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')


def default_source(provider: str) -> str:
    return f"/outboxd/providers/{provider}"


def default_type(provider: str) -> str:
    return f"dev.outboxd.{provider}"


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _rfc3339(moment: datetime) -> str:
    utc = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    return utc.isoformat(timespec="microseconds").replace("+00:00", "Z")


class Envelope:
    """Builds one attempt's body and content headers."""

    __slots__ = ("mode", "source", "type")

    def __init__(self, mode: str, *, source: str, type_: str) -> None:
        if mode not in MODES:
            raise ValueError(f"envelope must be one of {', '.join(MODES)}")
        self.mode, self.source, self.type = mode, source, type_

    def attributes(self, dispatch: Dispatch) -> dict[str, str]:
        attributes = {
            "specversion": SPECVERSION,
            "id": dispatch.idempotency_key,
            "source": self.source,
            "type": self.type,
            "subject": dispatch.operation_id,
            "datacontenttype": "application/json",
        }
        if dispatch.created_at is not None:
            attributes["time"] = _rfc3339(dispatch.created_at)
        return attributes

    def wrap(self, dispatch: Dispatch, payload: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
        """The body bytes and the headers that describe them (``Content-Type`` and, in
        binary mode, the ``ce-`` attributes)."""
        attributes = self.attributes(dispatch)
        if self.mode == STRUCTURED:
            return (_json({**attributes, "data": dict(payload)}),
                    {"Content-Type": STRUCTURED_CONTENT_TYPE})
        content_type = attributes.pop("datacontenttype")
        headers = {f"ce-{name}": quote(value, safe=_SAFE) for name, value in attributes.items()}
        headers["Content-Type"] = content_type
        return _json(dict(payload)), headers
