"""The values the store's hot-path statements (:class:`.interface.Store`) take and return.

A claimed batch moves ``claimed -> dispatching`` (:class:`Dispatching` comes back per row
moved), then each finished send becomes a fenced :class:`Transition`, and the recording
step writes it with its event detail and attempt row as one :class:`Recorded`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.records import OperationRecord
from outbox.states import OperationStatus

__all__ = ["Dispatching", "Recorded", "Transition"]


@dataclass(frozen=True)
class Dispatching:
    """A row moved to ``dispatching``: its new revision and the attempt it starts."""

    id: int
    state_revision: int
    attempts: int
    first_dispatched_at: datetime
    last_attempt_started_at: datetime


@dataclass(frozen=True)
class Transition:
    """One fenced status change of a leased row."""

    id: int
    state_revision: int
    status: OperationStatus
    status_reason: str | None = None
    receipt: Any = None
    last_outcome: str | None = None
    delay_seconds: float | None = None
    """For ``pending``: not before now + delay on the database clock."""
    payload_digest: str | None = None


@dataclass(frozen=True)
class Recorded:
    """One finished send to record: its fenced transition, the ``detail`` of its event, and
    its ``outbox_attempts`` row (:func:`dispatcher.store.journal.attempt`, evidence not yet marked
    fenced: that is known only when the write has matched or not)."""

    op: OperationRecord
    transition: Transition
    detail: Mapping[str, Any] | None
    attempt: Mapping[str, Any]
