"""The demo's scenario: a support-desk agent staging operations through
:func:`outbox.advance` (including one past its deadline and one refused for a credential in
its payload), and an operator approving those that wait for approval."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine

from dispatcher.demo.report import DemoReport

TENANT = "acme"
PROVIDER = "tickets"
ACTOR = "demo-operator"


def _secret_like() -> str:
    """A value shaped like a live payment API key (built here, never stored anywhere)."""
    return "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"


def stage_operations(
    engine: Engine, operations: int, rng: random.Random, report: DemoReport
) -> None:
    """The example agent: one checkpoint transition per support case, staging the effects
    it implies (create a ticket, message the customer, maybe a refund) in the same
    transaction as the compare-and-set of the case's revision."""
    import outbox
    from outbox.errors import SecretInPayload

    made, n = 0, 0
    while made < operations - 1:  # the last one is the late reminder below
        case = f"case-{8000 + n}"
        needs = n % 12 == 5  # large refunds wait for a person
        amount = rng.choice([15, 40, 75, 120, 250]) * (10 if needs else 1)
        ops = [
            outbox.StagedOperation(
                operation_id=f"ticket:create:{case}", provider=PROVIDER,
                payload={"case": case, "subject": "Refund follow-up", "priority": "high"},
            ),
            outbox.StagedOperation(
                operation_id=f"message:send:{case}", provider=PROVIDER,
                payload={"case": case, "template": "we-are-on-it"}, ordering_key=case,
            ),
            outbox.StagedOperation(
                operation_id=f"refund:issue:{case}", provider=PROVIDER,
                payload={"case": case, "amount_gbp": amount}, requires_approval=needs,
            ),
        ][: operations - 1 - made]
        if len(ops) == 3 and needs:
            report.needs_approval.append(f"refund:issue:{case}")
        with engine.begin() as conn:
            outbox.advance(
                conn, case, tenant_id=TENANT, expected_revision=0, phase="effects-requested",
                state={"case": case, "step": 1}, operations=ops,
            )
        made += len(ops)
        n += 1
    # One effect whose authority ended before the dispatcher ever saw it.
    late = "message:send:case-late"
    with engine.begin() as conn:
        outbox.advance(
            conn, "case-late", tenant_id=TENANT, expected_revision=0, phase="reminder",
            operations=[
                outbox.StagedOperation(
                    operation_id=late, provider=PROVIDER,
                    payload={"case": "case-late", "template": "reminder"},
                    deadline_at=datetime.now(UTC) - timedelta(minutes=1),
                )
            ],
        )
    made += 1
    report.late = late
    # And one the agent must never be able to stage: a credential in the payload.
    try:
        with engine.begin() as conn:
            outbox.advance(
                conn, "case-leaky", tenant_id=TENANT, expected_revision=0, phase="refund",
                operations=[
                    outbox.StagedOperation(
                        operation_id="refund:issue:case-leaky", provider=PROVIDER,
                        payload={"case": "case-leaky", "gateway": {"api_key": _secret_like()}},
                    )
                ],
            )
    except SecretInPayload as exc:
        report.refused_message = f"{type(exc).__name__}: {exc}"
    report.staged = made


def approve_waiting(engine: Engine, report: DemoReport) -> None:
    """The operator: approve (and requeue) each operation the agent staged for approval."""
    from outbox import approvals
    from outbox.errors import ApprovalError

    for op_id in report.needs_approval:
        with engine.begin() as conn:
            try:
                approvals.approve(
                    conn, tenant_id=TENANT, operation_id=op_id, actor=ACTOR,
                    expires_in=timedelta(minutes=10), reason="refund checked by a person",
                )
            except ApprovalError:
                continue  # already finished: it was sent before approval (see the summary)
        report.approved.append(op_id)
