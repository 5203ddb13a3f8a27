"""Authority and limits, re-checked before every send and re-send (the built-in
:class:`~dispatcher.engine.checks.AuthorityCheck`).

Runs inside the transaction that commits ``dispatching`` (after admission, which resolved
any artifact and checked ``payload_schema``), on the database clock ``now``, in this order:

1. **version** — the row's ``workflow_version`` (or its task's) must be one the provider
   declares in ``workflow_versions`` (absent: any) → ``incompatible_version``;
2. **approval** — a ``requires_approval`` row needs a matching, unexpired, unrevoked
   approval (:func:`outbox.approvals.evaluate`) → ``approval_missing`` / ``_mismatch`` /
   ``_revoked`` / ``_expired``;
3. **policy** — the provider's ``policy = "package.module:function"``, called as
   ``function(operation_record, db_now)``; a string (or an exception) denies →
   ``policy_denied`` with the denial in the event's detail;
4. **task budget** — the task's ``max_attempts`` against the sum of its operations'
   persisted ``attempts`` (and ``max_elapsed_seconds`` since the task's first dispatch)
   → ``budget_exhausted``. Computed from the records, so a restart never resets it.

Deadlines and cancellation are enforced by the ``dispatching`` statement itself
(:meth:`dispatcher.store.interface.Store.mark_dispatching`). On PostgreSQL the task rows with
budgets and the approval rows are locked (``FOR UPDATE``) for the transaction, so two
replicas cannot both spend a task's last attempt, and a revocation waits for (or wins
against) a concurrent dispatch rather than racing it.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from dispatcher.config import Config
from dispatcher.engine.checks import Refusal
from dispatcher.store import journal, store_for
from dispatcher.store.common import budgeted_task
from outbox.admission import INCOMPATIBLE_VERSION
from outbox.approvals import Approval, evaluate
from outbox.digest import payload_digest
from outbox.errors import ConfigError
from outbox.protection.artifacts import LocalArtifactStore
from outbox.records import OperationRecord

POLICY_DENIED = "policy_denied"
BUDGET_EXHAUSTED = "budget_exhausted"
CONSUMED_EVENT = "approval_consumed"

Policy = Callable[[OperationRecord, datetime], "str | None"]


def load_policy(spec: str, key: str) -> Policy:
    """Import ``package.module:function``; a :class:`ConfigError` naming ``key`` if not."""
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name.strip())
        for part in attr.strip().split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise ConfigError(f"{key}: cannot import {spec!r}: {type(exc).__name__}: {exc}",
                          key=key) from None
    if not callable(target):
        raise ConfigError(f"{key}: {spec!r} is not callable", key=key)
    policy: Policy = target
    return policy


def artifact_store(config: Config) -> LocalArtifactStore | None:
    """The built-in store of ``[artifacts] root`` (relative to the configuration file)."""
    root = config.artifacts.root
    if root is None:
        return None
    path = Path(root)
    if not path.is_absolute() and config.source is not None:
        path = Path(config.source).parent / path
    return LocalArtifactStore(path)


class Authority:
    def __init__(
        self,
        *,
        workflow_versions: Mapping[str, frozenset[str] | None] | None = None,
        policies: Mapping[str, tuple[str, Policy]] | None = None,
    ) -> None:
        self.workflow_versions = dict(workflow_versions or {})
        self.policies = dict(policies or {})
        self._chosen: dict[int, int] = {}  # operation row id -> approval id, per check
        # the task rows needs_lock read (no lock) for the check that follows it
        self._read: dict[tuple[str, str], Mapping[str, Any]] | None = None

    @classmethod
    def from_config(cls, config: Config) -> Authority:
        versions: dict[str, frozenset[str] | None] = {}
        policies: dict[str, tuple[str, Policy]] = {}
        for name, section in config.providers.items():
            declared = section.get("workflow_versions")
            versions[name] = frozenset(declared) if declared is not None else None
            spec = section.get("policy")
            if spec is not None:
                policies[name] = (spec, load_policy(spec, f"providers.{name}.policy"))
        return cls(workflow_versions=versions, policies=policies)

    # -- the check ---------------------------------------------------------------------
    def needs_lock(
        self,
        rows: Sequence[OperationRecord],
        task_rows: Mapping[tuple[str, str], Mapping[str, Any]],
    ) -> bool:
        """Whether checking ``rows`` takes locks that must hold until their mark commits:
        an approval to consume, or a task budget to count. If not, the task rows the claim
        read serve the :meth:`check` that follows (no read of its own)."""
        self._read = None
        if any(r.requires_approval for r in rows):
            return True
        mine = {(r.tenant_id, r.task_id) for r in rows}
        if any(budgeted_task(t) for key, t in task_rows.items() if key in mine):
            return True
        self._read = dict(task_rows)
        return False

    def check(
        self, conn: Connection, rows: Sequence[OperationRecord], now: datetime
    ) -> Mapping[int, str]:
        self._chosen = {}
        read, self._read = self._read, None
        if not rows:
            return {}
        tasks = read if read is not None else self._tasks(conn, rows)
        approvals = self._approvals(conn, [r for r in rows if r.requires_approval])
        spent = self._task_spending(conn, tasks)
        refused: dict[int, str] = {}
        for op in rows:
            task = tasks.get((op.tenant_id, op.task_id))
            reason = (
                self._version(op, task)
                or self._approval(op, approvals.get((op.tenant_id, op.operation_id), []), now)
                or self._policy(op, now)
                or self._budget(op, task, spent, now)
            )
            if reason is not None:
                refused[op.id] = reason
                self._chosen.pop(op.id, None)
        return refused

    def _version(self, op: OperationRecord, task: Mapping[str, Any] | None) -> str | None:
        supported = self.workflow_versions.get(op.provider)
        version = op.workflow_version or (task["workflow_version"] if task else None)
        if supported is None or version in supported:
            return None
        return Refusal(INCOMPATIBLE_VERSION,
                       {"workflow_version": version, "supported": sorted(supported)})

    def _approval(self, op: OperationRecord, found: list[Approval], now: datetime) -> str | None:
        if not op.requires_approval:
            return None
        digest = op.payload_digest
        if digest is None and op.payload is not None:
            try:
                digest = payload_digest(op.payload)
            except Exception:
                digest = None
        approval, reason = evaluate(found, digest, now)
        if approval is not None:
            self._chosen[op.id] = approval.id
            return None
        assert reason is not None
        return Refusal(reason, {"payload_digest": digest, "approvals": len(found)})

    def _policy(self, op: OperationRecord, now: datetime) -> str | None:
        entry = self.policies.get(op.provider)
        if entry is None:
            return None
        spec, policy = entry
        try:
            denial = policy(op, now)
        except Exception as exc:  # a failing policy denies (fail closed), never crashes
            return Refusal(POLICY_DENIED, {"policy": spec, "error": type(exc).__name__})
        if denial is None:
            return None
        return Refusal(POLICY_DENIED, {"policy": spec, "denial": str(denial)[:500] or "denied"})

    def _budget(
        self,
        op: OperationRecord,
        task: Mapping[str, Any] | None,
        spent: dict[tuple[str, str], list[Any]],
        now: datetime,
    ) -> str | None:
        if task is None:
            return None
        key = (op.tenant_id, op.task_id)
        attempts, first = spent[key]
        limit, elapsed = task["max_attempts"], task["max_elapsed_seconds"]
        if limit is not None and attempts >= limit:
            return Refusal(BUDGET_EXHAUSTED,
                           {"scope": "task", "attempts": attempts, "max_attempts": limit})
        if elapsed is not None and first is not None and (now - first).total_seconds() > elapsed:
            return Refusal(BUDGET_EXHAUSTED, {"scope": "task", "max_elapsed_seconds": elapsed})
        spent[key][0] = attempts + 1  # this row's attempt counts against the next rows
        return None

    # -- reads (dispatcher.store) ---------------------------------------------------------
    def _tasks(
        self, conn: Connection, rows: Sequence[OperationRecord], *, lock: bool = True
    ) -> dict[tuple[str, str], Mapping[str, Any]]:
        return dict(store_for(conn.dialect.name).task_limits(
            conn, [(r.tenant_id, r.task_id) for r in rows], lock_budgeted=lock))

    def _task_spending(
        self, conn: Connection, tasks: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> dict[tuple[str, str], list[Any]]:
        """Per budgeted task: [attempts so far, first dispatch], read after the lock."""
        spent: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, None])
        pairs = [k for k, t in tasks.items() if budgeted_task(t)]
        for key, (attempts, first) in store_for(conn.dialect.name).task_spending(
                conn, pairs).items():
            spent[key] = [attempts, first]
        return spent

    def _approvals(
        self, conn: Connection, rows: Sequence[OperationRecord]
    ) -> dict[tuple[str, str], list[Approval]]:
        if not rows:
            return {}
        found: dict[tuple[str, str], list[Approval]] = defaultdict(list)
        for row in store_for(conn.dialect.name).approvals_for(
                conn, [(r.tenant_id, r.operation_id) for r in rows]):
            found[(row["tenant_id"], row["operation_id"])].append(Approval.from_row(row))
        return found

    # -- consumption -------------------------------------------------------------------
    def consume(self, conn: Connection, rows: Sequence[OperationRecord], token: int) -> None:
        """Mark each approval that authorised a now-``dispatching`` row consumed (once: a
        retry under an already consumed approval changes nothing), with an event."""
        used = {self._chosen[r.id]: r for r in rows if r.id in self._chosen}
        self._chosen = {}
        if not used:
            return
        consumed = store_for(conn.dialect.name).consume_approvals(conn, list(used), token)
        events = [
            {"tenant_id": op.tenant_id, "task_id": op.task_id, "operation_id": op.operation_id,
             "kind": CONSUMED_EVENT, "from_status": "claimed", "to_status": "dispatching",
             "actor": op.lease_owner or "outboxd", "reason": None,
             "detail": {"approval_id": approval_id}, "fencing_token": token}
            for approval_id, op in used.items() if approval_id in consumed
        ]
        journal.write(conn, events)

