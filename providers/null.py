"""The ``null`` provider: every send is applied at once and nothing happens. For benchmarks.

Keys it remembers are those it applied *in this process*: a repeat send of one of them is
reported as a replay (as a deduplicating receiver would), and a lookup of one of them is
``FOUND``. For any other key the honest answer is ``UNSUPPORTED``, not ``NOT_FOUND``: the
key may have been applied by an earlier process, and a ``NOT_FOUND`` would be taken as
evidence that it was not. Accordingly it declares ``lookup_consistency = "none"``. It
never produces an ambiguous outcome, so the dispatcher never needs its lookup anyway.

Configuration: the common capability keys (``dedup_retention_seconds`` defaults to one
day: re-sending to a sink is harmless) and ``delay_seconds`` (default 0), a sleep per send
to model receiver latency.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Final

from providers.base import (
    Capabilities,
    Dispatch,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
)
from providers.options import SectionReader, read_capabilities

KIND: Final = "null"
MAX_REMEMBERED_KEYS: Final = 1_000_000


class NullProvider:
    def __init__(
        self, name: str, capabilities: Capabilities, *, delay_seconds: float = 0.0
    ) -> None:
        self.name = name
        self.capabilities = capabilities
        self.delay_seconds = delay_seconds
        self._applied: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"NullProvider(name={self.name!r})"

    @property
    def applied_count(self) -> int:
        """Distinct keys applied in this process."""
        with self._lock:
            return len(self._applied)

    def send(self, dispatch: Dispatch) -> Outcome:
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        key = dispatch.idempotency_key
        with self._lock:
            replayed = key in self._applied
            if replayed:
                self._applied[key] += 1
            elif len(self._applied) < MAX_REMEMBERED_KEYS:
                self._applied[key] = 1
        return Outcome(
            kind=OutcomeKind.APPLIED,
            status_code=None,
            receipt={"null": True},
            replayed=replayed,
            evidence={"provider": "null"},
        )

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        with self._lock:
            found = dispatch.idempotency_key in self._applied
        if not found:
            return LookupResult(kind=LookupKind.UNSUPPORTED)
        return LookupResult(
            kind=LookupKind.FOUND, receipt={"null": True}, observed_at=datetime.now(UTC)
        )

    def close(self) -> None:
        with self._lock:
            self._applied.clear()


def build_null(name: str, reader: SectionReader) -> NullProvider:
    capabilities = read_capabilities(reader, lookup_available=False, default_retention=86_400.0)
    delay = reader.number("delay_seconds", 0.0)
    reader.finish()
    return NullProvider(name, capabilities, delay_seconds=delay)
