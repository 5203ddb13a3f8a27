"""outboxd, agent side: the records, the state machine, and the API an agent calls inside
its own database transaction. Importing this package never imports the daemon."""

from outbox.api import (
    CancelResult,
    StagedOperation,
    advance,
    cancel_task,
    enqueue,
    get_operation,
    list_operations,
    load_task,
)
from outbox.approvals import approve, revoke
from outbox.digest import default_idempotency_key, payload_digest
from outbox.errors import (
    OutboxError,
    PayloadMismatch,
    RevisionConflict,
    SecretInPayload,
    WaitTimeout,
)
from outbox.records import OperationRecord, TaskRecord
from outbox.recovery import RecoveryPlan, Step
from outbox.recovery import plan as recovery_plan
from outbox.states import OperationStatus
from outbox.waiting import wait_for

__all__ = [
    "CancelResult",
    "OperationRecord",
    "OperationStatus",
    "OutboxError",
    "PayloadMismatch",
    "RecoveryPlan",
    "RevisionConflict",
    "SecretInPayload",
    "StagedOperation",
    "Step",
    "TaskRecord",
    "WaitTimeout",
    "advance",
    "approve",
    "cancel_task",
    "default_idempotency_key",
    "enqueue",
    "get_operation",
    "list_operations",
    "load_task",
    "payload_digest",
    "recovery_plan",
    "revoke",
    "wait_for",
]
