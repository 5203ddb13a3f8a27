"""A small support-ticket agent that survives a crash without opening the ticket twice.

The agent handles one support case in two steps:

1. decide that a ticket is needed and stage ``ticket:create:<case>`` with
   :func:`outbox.advance` — the checkpoint's compare-and-set and the effect commit in ONE
   transaction of the agent's own database;
2. once outboxd has applied the ticket (its receipt is on the row), stage the customer
   reply ``message:send:<case>`` quoting the ticket's id, again with ``advance``.

It never calls the ticket system itself: ``outboxd run`` does, with a stable idempotency
key. After a crash it calls :func:`outbox.recovery.plan` first and follows the plan's
step for each operation, so it never re-stages (or re-sends) the ticket. Even if it did,
a regenerated payload under the same operation id is refused (``PayloadMismatch``).

Run it by hand (each line is a separate process; ``--crash`` SIGKILLs the agent right after
its first commit, before it can continue):

    outboxd sim --port 8080 &
    cat > outboxd.toml <<'EOF'
    [database]
    url = "sqlite:///agent.db"
    [providers.tickets]
    kind = "http"
    url = "http://127.0.0.1:8080/tickets"
    lookup_url = "http://127.0.0.1:8080/tickets/by-key/{idempotency_key}"
    EOF
    outboxd migrate --config outboxd.toml
    python examples/python_agent.py --database sqlite:///agent.db --case case-8472 --crash
    python examples/python_agent.py --database sqlite:///agent.db --case case-8472
    outboxd run --once --config outboxd.toml
    python examples/python_agent.py --database sqlite:///agent.db --case case-8472
    outboxd run --once --config outboxd.toml
    python examples/python_agent.py --database sqlite:///agent.db --case case-8472

Exit codes: 0 the agent did what it could (finished, or waits for outboxd), 1 error.
Each run prints one ``agent: ...`` line per decision, for people and for the test.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import sqlalchemy as sa

import outbox
from outbox import db, recovery
from outbox.errors import PayloadMismatch, TaskNotFound

TENANT = "acme"
PROVIDER = "tickets"


def say(text: str) -> None:
    print(f"agent: {text}", flush=True)


def draft_ticket(case: str, attempt: int) -> dict[str, Any]:
    """Stands in for the model. Like a model, it may phrase things differently each time."""
    wording = ["Customer asks about a refund", "Refund question from customer"][attempt % 2]
    return {"case": case, "subject": wording, "priority": "high", "queue": "billing"}


def find_effect_id(receipt: Any) -> str | None:
    """The receiver's id for the effect, wherever the receipt keeps it (a send's response
    body, or a reconciliation look-up's)."""
    if isinstance(receipt, dict):
        if isinstance(receipt.get("effect_id"), str):
            return str(receipt["effect_id"])
        for value in receipt.values():
            found = find_effect_id(value)
            if found:
                return found
    return None


def start(engine: sa.Engine, case: str, *, crash: bool) -> None:
    """First run: decide and stage the ticket, in the same transaction as the checkpoint."""
    with engine.begin() as conn:
        task = outbox.advance(
            conn, case, tenant_id=TENANT, expected_revision=0, phase="ticket-requested",
            state={"case": case, "step": "ticket"},
            operations=[
                outbox.StagedOperation(
                    operation_id=f"ticket:create:{case}", provider=PROVIDER,
                    payload=draft_ticket(case, 0),
                )
            ],
        )
    say(f"staged ticket:create:{case} at revision {task.state_revision}")
    if crash:
        say("crashing now (SIGKILL), before continuing")
        os.kill(os.getpid(), signal.SIGKILL)


def resume(engine: sa.Engine, case: str) -> int:
    """Every later run: ask the durable records what may happen next, then do only that."""
    with engine.connect() as conn:
        the_plan = recovery.plan(conn, tenant_id=TENANT, task_id=case)
        task = outbox.load_task(conn, tenant_id=TENANT, task_id=case)
    say(f"resuming {case} at revision {task.state_revision}, phase {task.phase}: "
        f"plan {the_plan.step.value}")
    steps = {p.operation_id: p for p in the_plan.operations}
    for p in the_plan.operations:
        say(f"  {p.operation_id}: {p.step.value} ({p.why})")

    # A naive agent would re-run its model and stage the ticket again. The outbox refuses a
    # regenerated, different payload under the same operation id instead of sending it.
    try:
        with engine.begin() as conn:
            outbox.enqueue(conn, tenant_id=TENANT, task_id=case,
                           operation_id=f"ticket:create:{case}", provider=PROVIDER,
                           payload=draft_ticket(case, 1))
    except PayloadMismatch:
        say("a regenerated ticket was refused (PayloadMismatch): the staged one stands")

    ticket = steps[f"ticket:create:{case}"]
    if ticket.step != recovery.Step.CONTINUE:
        say(f"waiting for outboxd: the ticket is {ticket.evidence.status} ({ticket.step.value})")
        return 0
    with engine.connect() as conn:
        receipt = outbox.get_operation(
            conn, tenant_id=TENANT, operation_id=f"ticket:create:{case}"
        ).receipt
    ticket_ref = find_effect_id(receipt)
    reply = f"message:send:{case}"
    if reply not in steps:
        with engine.begin() as conn:
            task = outbox.advance(
                conn, case, tenant_id=TENANT, expected_revision=task.state_revision,
                phase="customer-notified", state={"case": case, "ticket": ticket_ref},
                operations=[
                    outbox.StagedOperation(
                        operation_id=reply, provider=PROVIDER,
                        payload={"case": case, "template": "ticket-opened",
                                 "ticket": ticket_ref},
                    )
                ],
            )
        say(f"ticket {ticket_ref} exists; staged {reply} at revision {task.state_revision}")
        return 0
    if steps[reply].step == recovery.Step.CONTINUE:
        say(f"done: ticket {ticket_ref} opened once and the customer was told")
    else:
        say(f"waiting for outboxd: the reply is {steps[reply].evidence.status}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", required=True, help="SQLAlchemy URL (migrated)")
    parser.add_argument("--case", default="case-8472")
    parser.add_argument("--crash", action="store_true",
                        help="SIGKILL this process right after the first commit")
    args = parser.parse_args(argv)
    engine = db.create_engine(args.database)
    try:
        with engine.connect() as conn:
            try:
                outbox.load_task(conn, tenant_id=TENANT, task_id=args.case)
            except TaskNotFound:
                exists = False
            else:
                exists = True
        if not exists:
            start(engine, args.case, crash=args.crash)
            return 0
        return resume(engine, args.case)
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
