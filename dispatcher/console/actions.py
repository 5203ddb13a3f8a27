"""The console's actions: the same audited functions the CLI calls, never a status UPDATE
of its own. Approve and revoke are :mod:`outbox.approvals`; resolve, requeue and cancel
are :mod:`outbox.overrides`; reading a payload is :func:`outbox.tenancy.reveal_payload`.
Each runs in one transaction with the logged-in user as the actor, so the change and its
``outbox_events`` row commit together.

The forms ask for what the override layer requires, and this module checks it again
before calling it: a reason for everything, an evidence reference for every resolution
(so an ``unknown`` never becomes ``applied`` on someone's say-so alone) and for
requeueing an ``unknown`` operation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine

from outbox import approvals, errors, overrides, tenancy
from outbox.durations import parse_duration

__all__ = ["ACTIONS", "Done", "Refused", "parse_duration", "perform"]

log = logging.getLogger("outboxd.console")
ACTIONS = ("approve", "revoke", "resolve", "requeue", "cancel", "reveal")
MAX_FIELD = 2000


class Refused(Exception):
    """The form is incomplete or the action was refused; nothing was written."""


@dataclass(frozen=True)
class Done:
    message: str
    revealed: Any = None
    """The payload, for a ``reveal`` (shown once, never stored in the session)."""


def _field(form: Mapping[str, str], name: str, *, required: bool, label: str = "") -> str:
    value = (form.get(name) or "").strip()
    if required and not value:
        raise Refused(f"{label or name} is required")
    if len(value) > MAX_FIELD:
        raise Refused(f"{label or name} is longer than {MAX_FIELD} characters")
    return value


def perform(engine: Engine, actor: str, tenant_id: str, operation_id: str,
            form: Mapping[str, str]) -> Done:
    """Run one action; :class:`Refused` (with a message for the person) if it is not done."""
    action = form.get("action", "")
    if action not in ACTIONS:
        raise Refused("unknown action")
    reason = _field(form, "reason", required=action != "approve", label="a reason")
    evidence = _field(form, "evidence", required=action == "resolve",
                      label="an evidence reference")
    try:
        with engine.begin() as conn:
            tenancy.set_tenant(conn, tenant_id)
            done = _dispatch(conn, action, Who(tenant_id, operation_id, actor), form,
                             reason=reason, evidence=evidence)
    except (errors.OutboxError, ValueError) as exc:
        log.info("console: %s was refused %s", actor, action,
                 extra={"tenant": tenant_id, "operation_id": operation_id,
                        "error": type(exc).__name__})
        raise Refused(str(exc)) from None
    log.info("console: %s did %s", actor, action,
             extra={"tenant": tenant_id, "operation_id": operation_id})
    return done


@dataclass(frozen=True)
class Who:
    tenant_id: str
    operation_id: str
    actor: str


def _dispatch(conn: Any, action: str, w: Who, form: Mapping[str, str], *, reason: str,
              evidence: str) -> Done:
    who: dict[str, Any] = {"tenant_id": w.tenant_id, "operation_id": w.operation_id,
                           "actor": w.actor}
    if action == "approve":
        expires = (form.get("expires") or "").strip()
        try:
            expires_in = parse_duration(expires) if expires else None
        except ValueError as exc:
            raise Refused(str(exc)) from None
        result = approvals.approve(
            conn, **who, reason=reason or None,
            expires_in=expires_in,
            release=form.get("release") == "1")
        return Done(f"approved (approval {result.approval.id}); {result.next_step()}")
    if action == "revoke":
        n = approvals.revoke(conn, **who, reason=reason)
        return Done(f"revoked {n} approval(s)")
    if action == "reveal":
        value = tenancy.reveal_payload(conn, **who, reason=reason)
        return Done("payload revealed (recorded in outbox_events)", revealed=value)
    if action == "resolve":
        outcome = form.get("outcome", "")
        if outcome not in overrides.OUTCOMES:
            raise Refused("choose an outcome: applied, not_applied or rejected")
        r = overrides.resolve(conn, **who, outcome=outcome, reason=reason, evidence=evidence)
    elif action == "requeue":
        r = overrides.requeue(conn, **who, reason=reason, evidence=evidence or None)
    else:
        r = overrides.cancel(conn, **who, reason=reason)
    return Done(f"{action}: {r.from_status} -> {r.to_status} (event {r.event_id})")
