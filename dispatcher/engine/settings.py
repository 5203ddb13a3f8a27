"""What one replica's dispatch cycle is told by the configuration: its identity, batch,
concurrency, lease, dedup margin, payload limit and payload protection."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.protection.envelopes import Protection

#: Share of the lease held back: a request leaves only within the first 90% of its lease.
LEASE_SEND_GUARD = 0.1


@dataclass(frozen=True)
class WorkerSettings:
    worker_id: str
    batch_size: int = 100
    concurrency: int = 32
    lease_seconds: float = 30.0
    dedup_safety_margin: float = 0.1
    max_payload_bytes: int = 262_144
    protection: Protection | None = None
    """Opens protected payloads before the send; seals receipts of protected providers."""

    @property
    def lease_send_seconds(self) -> float:
        """How long after a lease is set or extended a request may still leave: the lease
        less a tenth, so a send that checks just before its write still writes in time."""
        return self.lease_seconds * (1.0 - LEASE_SEND_GUARD)
