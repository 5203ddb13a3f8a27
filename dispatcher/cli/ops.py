"""``outboxd ops``: what an operator sees and the overrides a person may make.

    outboxd ops list [--status S] [--task T] [--provider P] [--reason R] [--limit N] [--json]
    outboxd ops show OPERATION_ID [--json] [--show-payload --actor A [--reason R]]
    outboxd ops plan TASK_ID [--json]
    outboxd ops resolve OPERATION_ID --outcome applied|not_applied|rejected \\
        --actor A --reason R --evidence REF
    outboxd ops requeue OPERATION_ID --actor A --reason R [--evidence REF]
    outboxd ops cancel OPERATION_ID --actor A --reason R
    outboxd ops cancel --task TASK_ID --actor A --reason R

Overrides go through :mod:`outbox.overrides` (audited in ``outbox_events``); the plan is
:func:`outbox.recovery.plan`. ``--tenant T`` where an operation or task is named: default
the only tenant, else exit 2. Payload bodies and receipts are never printed unless
``--show-payload`` (an audited read, :func:`outbox.tenancy.reveal_payload`). Exit codes:
0 ok, 1 operational failure (not found, refused), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    common_options,
    load,
    resolve_tenant,
)
from outbox import api, db, decoding, overrides, recovery, schema, tenancy
from outbox.states import OperationStatus

ops_t, att_t, ev_t, appr_t = schema.operations, schema.attempts, schema.events, schema.approvals
LIST_COLUMNS = (
    "operation_id",
    "task_id",
    "provider",
    "status",
    "status_reason",
    "attempts",
    "last_outcome",
    "updated_at",
)
SHOW_COLUMNS = {
    "attempts": "id attempt started_at result_class status_code transport_phase error_class "
    "fencing_token worker evidence_ref evidence",
    "events": "id created_at kind from_status to_status actor reason evidence_ref",
    "approvals": "id approved_by payload_hash expires_at revoked_at consumed_at",
}
Action = Callable[[Connection, argparse.Namespace], int]


def _dump(value: Any) -> str:
    return json.dumps(recovery.jsonable(value), indent=2, default=str)


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[("-" if r.get(c) is None else str(r[c])) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _run(args: argparse.Namespace, action: Action, *, tenant: bool = True) -> int:
    cfg = load(args)
    engine = db.create_engine(cfg.database.url, **cfg.database.engine_args())
    try:
        with engine.begin() as conn:
            if tenant:
                args.tenant = resolve_tenant(conn, args.tenant)
            return action(conn, args)
    except UsageError as exc:
        sys.stderr.write(f"outboxd: error: {exc}\n")
        return EXIT_USAGE
    except sa.exc.DBAPIError as exc:  # the driver's first line, never the SQL
        permanent, reason = db.connect_failure(exc, cfg.database.url)
        sys.stderr.write(f"outboxd: database error: {reason}\n")
        return EXIT_USAGE if permanent else EXIT_FAILURE
    except sa.exc.SQLAlchemyError as exc:  # the class only: messages may quote SQL
        sys.stderr.write(f"outboxd: database error: {type(exc).__name__}\n")
        return EXIT_FAILURE
    finally:
        engine.dispose()


# -- read ---------------------------------------------------------------------------------


def _list(conn: Connection, args: argparse.Namespace) -> int:
    q = sa.select(ops_t.c.tenant_id, *(ops_t.c[c] for c in LIST_COLUMNS))
    if args.tenant:
        tenancy.set_tenant(conn, args.tenant)
        q = q.where(ops_t.c.tenant_id == args.tenant)
    if args.status:
        q = q.where(ops_t.c.status.in_(args.status))
    for flag, column in (
        ("task", "task_id"),
        ("provider", "provider"),
        ("reason", "status_reason"),
    ):
        if getattr(args, flag):
            q = q.where(ops_t.c[column] == getattr(args, flag))
    rows = [
        dict(r) for r in conn.execute(q.order_by(ops_t.c.id.desc()).limit(args.limit)).mappings()
    ]
    if args.json:
        print(_dump(rows))
    elif rows:
        print(_table(rows, ("tenant_id", *LIST_COLUMNS)))
    else:
        print("no operations match")
    return EXIT_OK


def _rows(conn: Connection, table: sa.Table, args: argparse.Namespace) -> list[dict[str, Any]]:
    q = sa.select(table).where(
        table.c.tenant_id == args.tenant, table.c.operation_id == args.operation_id
    )
    return [dict(r) for r in conn.execute(q.order_by(table.c.id)).mappings()]


def _show(conn: Connection, args: argparse.Namespace) -> int:
    if args.show_payload and not args.actor:
        raise UsageError("--show-payload is an audited read: give --actor (and --reason)")
    tenancy.set_tenant(conn, args.tenant)
    hidden = {"payload", "receipt"}
    row = conn.execute(
        sa.select(
            *(c for c in ops_t.c if c.name not in hidden),
            ops_t.c.receipt.isnot(None).label("receipt_present"),
        ).where(ops_t.c.tenant_id == args.tenant, ops_t.c.operation_id == args.operation_id)
    ).first()
    if row is None:
        api.get_operation(conn, tenant_id=args.tenant, operation_id=args.operation_id)  # raises
        return EXIT_FAILURE
    op = dict(row._mapping)
    op["receipt_present"] = bool(op["receipt_present"])
    report: dict[str, Any] = {
        "operation": op,
        "attempts": _rows(conn, att_t, args),
        "events": _rows(conn, ev_t, args),
        "approvals": _rows(conn, appr_t, args),
    }
    if args.show_payload:
        reason = args.reason or "outboxd ops show --show-payload"
        report["payload"] = tenancy.reveal_payload(
            conn,
            tenant_id=args.tenant,
            operation_id=args.operation_id,
            actor=args.actor,
            reason=reason,
        )
        receipt = decoding.decode_json(conn.execute(
            sa.select(sa.cast(ops_t.c.receipt, sa.Text)).where(ops_t.c.id == op["id"])
        ).scalar(), "receipt")
        report["receipt"] = (f"(cannot be decoded: {receipt.why})"
                             if isinstance(receipt, decoding.Undecodable) else receipt)
    if args.json:
        print(_dump(report))
        return EXIT_OK
    print("\n".join(f"{k:<24} {'-' if v is None else v}" for k, v in op.items()))
    for title, cols in SHOW_COLUMNS.items():
        rows = [
            {**r, "evidence": json.dumps(r["evidence"], sort_keys=True)}
            if r.get("evidence") is not None
            else r
            for r in report[title]
        ]
        print(f"\n{title}:")
        print(_table(rows, cols.split()) if rows else "  none")
    for name in ("payload", "receipt"):
        if name in report:
            print(f"\n{name}:\n{_dump(report[name])}")
    return EXIT_OK


def _plan(conn: Connection, args: argparse.Namespace) -> int:
    p = recovery.plan(conn, tenant_id=args.tenant, task_id=args.task_id)
    if args.json:
        print(_dump(p.records()))
        return EXIT_OK
    print(f"task {p.task_id} (tenant {p.tenant_id}): {p.step.value} - {p.why}")
    print(
        f"workflow {p.workflow_version or '-'}, revision {p.state_revision}, "
        f"phase {p.task_phase or '-'}{', CANCELLED' if p.cancelled else ''}"
    )
    rows = [
        {
            "operation_id": o.operation_id,
            "provider": o.provider,
            "status": o.evidence.status,
            "reason": o.evidence.status_reason,
            "attempts": o.evidence.attempts,
            "approval": o.evidence.approval,
            "next_step": o.step.value,
            "why": o.why,
        }
        for o in p.operations
    ]
    if rows:
        print()
        print(
            _table(
                rows,
                (
                    "operation_id",
                    "provider",
                    "status",
                    "reason",
                    "attempts",
                    "approval",
                    "next_step",
                    "why",
                ),
            )
        )
    return EXIT_OK


# -- overrides -------------------------------------------------------------------------


def _done(result: overrides.OverrideResult, what: str) -> int:
    print(
        f"{what} {result.operation_id} (tenant {result.tenant_id}): "
        f"{result.from_status} -> {result.to_status} (event {result.event_id})"
    )
    return EXIT_OK


def _resolve(conn: Connection, args: argparse.Namespace) -> int:
    return _done(
        overrides.resolve(
            conn,
            tenant_id=args.tenant,
            operation_id=args.operation_id,
            outcome=args.outcome,
            actor=args.actor,
            reason=args.reason,
            evidence=args.evidence,
        ),
        "resolved",
    )


def _requeue(conn: Connection, args: argparse.Namespace) -> int:
    return _done(
        overrides.requeue(
            conn,
            tenant_id=args.tenant,
            operation_id=args.operation_id,
            actor=args.actor,
            reason=args.reason,
            evidence=args.evidence,
        ),
        "requeued",
    )


def _cancel(conn: Connection, args: argparse.Namespace) -> int:
    if (args.operation_id is None) == (args.task is None):
        raise UsageError("name one OPERATION_ID, or --task TASK_ID")
    if args.task is not None:
        r = api.cancel_task(
            conn, tenant_id=args.tenant, task_id=args.task, actor=args.actor, reason=args.reason
        )
        print(
            f"cancelled task {args.task} (tenant {args.tenant}): {len(r.cancelled)} "
            f"operation(s) cancelled"
        )
        for op_id in r.too_late:
            print(f"  {op_id}: may already have been dispatched; not recalled, reconciled")
        return EXIT_OK
    return _done(
        overrides.cancel(
            conn,
            tenant_id=args.tenant,
            operation_id=args.operation_id,
            actor=args.actor,
            reason=args.reason,
        ),
        "cancelled",
    )


# -- parser ------------------------------------------------------------------------------


def _verb(sub: Any, name: str, help_: str, action: Action, *, tenant: bool = True) -> Any:
    p = sub.add_parser(name, help=help_, description=help_)
    common_options(p)
    p.add_argument("--tenant", help="tenant (default: the only one; required with several)")
    p.set_defaults(fn=lambda args: _run(args, action, tenant=tenant))
    return p


def _who(p: argparse.ArgumentParser, *, evidence: str | None) -> None:
    p.add_argument("--actor", required=True, help="who decides (recorded in outbox_events)")
    p.add_argument("--reason", required=True, help="why (recorded)")
    if evidence is not None:
        p.add_argument(
            "--evidence",
            required=evidence == "required",
            metavar="REF",
            help="evidence reference: ticket, provider dashboard link, case id",
        )


def register(sub: argparse._SubParsersAction[Any]) -> None:
    ops = sub.add_parser(
        "ops",
        help="operator commands: list, show, plan, resolve, requeue, cancel",
        description="Inspect operations and make audited overrides. Exit codes: 0 ok, "
        "1 operational failure (not found, refused), 2 usage or configuration error.",
    )
    verbs = ops.add_subparsers(dest="ops_verb", required=True)

    p = _verb(verbs, "list", "list operations (newest first)", _list, tenant=False)
    p.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in OperationStatus],
        help="only this status (repeatable)",
    )
    p.add_argument("--task", help="only this task")
    p.add_argument("--provider", help="only this provider")
    p.add_argument("--reason", help="only this status_reason (e.g. needs_operator)")
    p.add_argument("--limit", type=int, default=50, help="at most N rows (default 50)")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = _verb(verbs, "show", "one operation: attempts, events, approvals", _show)
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--show-payload",
        action="store_true",
        help="also print the payload and receipt (an audited read: needs --actor)",
    )
    p.add_argument("--actor", help="who reads the payload (with --show-payload)")
    p.add_argument("--reason", help="why the payload is read (with --show-payload)")

    p = _verb(
        verbs,
        "plan",
        "the recovery plan of a task: the allowed next step of each operation, with its evidence",
        _plan,
    )
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("--json", action="store_true", help="print the JSON recovery records")

    p = _verb(
        verbs, "resolve", "establish the outcome of an unknown or blocked operation", _resolve
    )
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument(
        "--outcome",
        required=True,
        choices=overrides.OUTCOMES,
        help="applied: the effect exists; not_applied: it does not (requeued with "
        "the same key); rejected: refused for good",
    )
    _who(p, evidence="required")

    p = _verb(
        verbs,
        "requeue",
        "blocked (or unknown, with evidence it was not applied) -> pending, same idempotency key",
        _requeue,
    )
    p.add_argument("operation_id", metavar="OPERATION_ID")
    _who(p, evidence="optional")

    p = _verb(
        verbs,
        "cancel",
        "cancel a pending or blocked operation, or a whole task "
        "(what may already be dispatched is reconciled, not recalled)",
        _cancel,
    )
    p.add_argument("operation_id", metavar="OPERATION_ID", nargs="?")
    p.add_argument("--task", metavar="TASK_ID", help="cancel this whole task instead")
    _who(p, evidence=None)
