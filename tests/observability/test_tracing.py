"""OpenTelemetry spans of dispatch attempts, checked with the SDK's in-memory exporter: the
real worker claims, sends and records on a real database of each dialect; the receiver is
an in-process object implementing the provider protocol that keeps the ``traceparent`` it
was given."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.engine import Engine

from dispatcher.engine.settings import WorkerSettings
from dispatcher.engine.worker import Worker
from dispatcher.observability.tracing import Tracing
from outbox.api import StagedOperation, advance
from outbox.errors import ConfigError
from providers.base import Capabilities, Dispatch, LookupKind, LookupResult, Outcome, OutcomeKind
from tests.support.daemon import REPO_ROOT

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SECRETISH = "the-payload-never-appears-in-a-span"


class Receiver:
    name = "tickets"
    capabilities = Capabilities(dedup_retention_seconds=3600.0)

    def __init__(self) -> None:
        self.traceparents: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def send(self, d: Dispatch) -> Outcome:
        with self._lock:
            self.traceparents[d.operation_id] = d.traceparent
        if d.operation_id == "refused":
            return Outcome(OutcomeKind.REJECTED, status_code=400, reason="HTTP 400")
        return Outcome(OutcomeKind.APPLIED, status_code=201, receipt={"id": "t-1"})

    def lookup(self, d: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.NOT_FOUND)

    def close(self) -> None:
        pass


def test_each_attempt_is_a_span_under_the_agents_trace(engine: Engine) -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    receiver = Receiver()
    with engine.begin() as conn:
        advance(conn, "case-1", tenant_id="acme", expected_revision=0, operations=[
            StagedOperation(operation_id=op_id, provider="tickets",
                            payload={"note": SECRETISH}, traceparent=f"00-{TRACE}-{PARENT}-01")
            for op_id in ("created", "refused")])
    worker = Worker(engine, {"tickets": receiver},
                    WorkerSettings(worker_id="w1", batch_size=5, concurrency=5),
                    tracing=Tracing(provider.get_tracer("test")))
    try:
        assert worker.claim_and_dispatch() == 2
        worker.wait_in_flight(30)
    finally:
        worker.close()
    spans = {s.attributes["outboxd.operation_id"]: s for s in exported.get_finished_spans()}
    assert set(spans) == {"created", "refused"}
    for op_id, span in spans.items():
        assert span.name == "outboxd.send" and span.kind is SpanKind.CLIENT
        assert span.parent is not None
        assert (f"{span.parent.trace_id:032x}", f"{span.parent.span_id:016x}") == (TRACE, PARENT)
        assert f"{span.context.trace_id:032x}" == TRACE
        # the receiver joins the trace under the attempt's span
        assert receiver.traceparents[op_id] == f"00-{TRACE}-{span.context.span_id:016x}-01"
        attrs = dict(span.attributes or {})
        assert attrs["outboxd.provider"] == "tickets" and attrs["outboxd.tenant"] == "acme"
        assert attrs["outboxd.attempt"] == 1 and attrs["outboxd.fencing_token"] >= 1
        assert SECRETISH not in span.to_json()
    assert spans["created"].attributes["outboxd.outcome"] == "applied"
    assert spans["created"].attributes["http.response.status_code"] == 201
    assert spans["refused"].attributes["outboxd.outcome"] == "rejected"
    assert spans["refused"].status.status_code is StatusCode.ERROR


def test_off_nothing_of_opentelemetry_is_imported_and_the_row_traceparent_travels() -> None:
    probe = ("import sys; import dispatcher.cli.main, dispatcher.daemon; "
             "from dispatcher.observability.tracing import Tracing; "
             "t = Tracing.build(enabled=False, exporter='otlp', service_name='x'); "
             "assert t.tracer is None; "
             "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_on_without_the_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "opentelemetry" or n.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigError) as caught:
        Tracing.build(enabled=True, exporter="otlp", service_name="outboxd")
    assert str(caught.value) == ("tracing.enabled needs the tracing extra: "
                                 "pip install 'outboxd[tracing]'")


def test_the_otlp_exporter_is_built_from_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    tracing = Tracing.build(enabled=True, exporter="otlp", service_name="outboxd-test")
    assert tracing.tracer is not None
    tracing.shutdown()  # nothing buffered: no export is tried
