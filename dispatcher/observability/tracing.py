"""OpenTelemetry spans of dispatch attempts (``[tracing] enabled = true``, the ``tracing``
extra).

Each attempt to send an operation is one span, ``outboxd.send``, of kind CLIENT, under the
agent's trace: its parent is the row's ``traceparent`` (the W3C trace context the agent
staged the operation under), and the ``traceparent`` sent to the receiver is the span's
own, so the receiver's work joins the same trace. Its attributes are identifiers — the
operation id, the tenant, the provider, the fencing token, the attempt number, the outcome
and the receiver's status code — never the payload, a receipt or a header value.

Off (the default), nothing of OpenTelemetry is imported and the send path costs one test
of ``None``; the row's ``traceparent`` still travels to the receiver unchanged.
"""

from __future__ import annotations

from typing import Any

from outbox.errors import ConfigError
from outbox.records import OperationRecord
from providers.base import Outcome, OutcomeKind

SPAN_NAME = "outboxd.send"
FAILED = frozenset({OutcomeKind.REJECTED, OutcomeKind.AMBIGUOUS, OutcomeKind.KEY_MISMATCH})


class Attempt:
    """One attempt's span: the ``traceparent`` to send, and its end with the outcome."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Any, traceparent: str | None) -> None:
        self._span = span
        self.traceparent = traceparent

    def end(self, outcome: Outcome | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if outcome is not None:
            self._span.set_attribute("outboxd.outcome", outcome.kind.value)
            if outcome.status_code is not None:
                self._span.set_attribute("http.response.status_code", outcome.status_code)
            if outcome.kind in FAILED:
                self._span.set_status(Status(StatusCode.ERROR, outcome.kind.value))
        self._span.end()


class Tracing:
    """Starts attempt spans on ``tracer`` (an OpenTelemetry ``Tracer``), or nothing."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self.tracer = tracer
        self._provider = provider

    @classmethod
    def build(cls, *, enabled: bool, exporter: str, service_name: str) -> Tracing:
        """Off, or an SDK tracer provider exporting to ``exporter`` (``otlp``: the OTLP
        exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables; ``console``)."""
        if not enabled:
            return cls()
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                BatchSpanProcessor,
                ConsoleSpanExporter,
                SpanExporter,
            )
        except ImportError:
            raise ConfigError("tracing.enabled needs the tracing extra: "
                              "pip install 'outboxd[tracing]'") from None
        out: SpanExporter
        if exporter == "console":
            out = ConsoleSpanExporter()
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                raise ConfigError('tracing.exporter = "otlp" needs the tracing extra: '
                                  "pip install 'outboxd[tracing]'") from None
            out = OTLPSpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        provider.add_span_processor(BatchSpanProcessor(out))
        return cls(provider.get_tracer("outboxd"), provider)

    def start(self, op: OperationRecord, *, provider: str, token: int,
              attempt: int) -> Attempt | None:
        """The span of this attempt (None when tracing is off)."""
        if self.tracer is None:
            return None
        from opentelemetry.trace import SpanKind, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        propagator = TraceContextTextMapPropagator()
        parent = propagator.extract({"traceparent": op.traceparent}) if op.traceparent else None
        span = self.tracer.start_span(
            SPAN_NAME, context=parent, kind=SpanKind.CLIENT,
            attributes={"outboxd.operation_id": op.operation_id, "outboxd.tenant": op.tenant_id,
                        "outboxd.provider": provider, "outboxd.fencing_token": token,
                        "outboxd.attempt": attempt})
        carrier: dict[str, str] = {}
        propagator.inject(carrier, context=set_span_in_context(span))
        return Attempt(span, carrier.get("traceparent", op.traceparent))

    def shutdown(self) -> None:
        """Export what is buffered (at the daemon's stop)."""
        if self._provider is not None:
            self._provider.shutdown()
