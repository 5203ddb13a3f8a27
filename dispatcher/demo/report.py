"""The demo's findings: :class:`DemoReport` and :func:`collect`, which fills it from the
database and the receiver's counters once the run is over (what settled how, duplicates, lost
or wrongly blocked operations, unknown outcomes and their resolutions, approvals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.demo.processes import SimReceiver

SETTLED = ("applied", "verified", "rejected", "blocked", "cancelled")


@dataclass
class DemoReport:
    """Everything the summary says, for the summary and for tests."""

    workdir: Path
    config: Path
    database_url: str
    staged: int = 0
    needs_approval: list[str] = field(default_factory=list)
    late: str = ""
    refused_message: str = ""
    kills: list[tuple[int, int]] = field(default_factory=list)  # (pid, rows dispatching)
    approved: list[str] = field(default_factory=list)
    sent_without_approval: list[str] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)
    sim: dict[str, Any] = field(default_factory=dict)
    unknown_found: list[tuple[str, str]] = field(default_factory=list)  # (op, why unknown)
    resolutions: list[tuple[str, str, str]] = field(default_factory=list)  # (op, to, reason)
    blocked: list[tuple[str, str]] = field(default_factory=list)
    unexpected_blocked: list[tuple[str, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    attempts: int = 0
    final_exit_code: int | None = None
    seconds: float = 0.0

    @property
    def duplicates(self) -> int:
        return int(self.sim.get("duplicates", 0))

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0
            and not self.lost
            and not self.unexpected_blocked
            and not self.sent_without_approval
            and self.final_exit_code == 0
        )


def collect(engine: Engine, sim: SimReceiver, report: DemoReport) -> None:
    report.sim = sim.stats()
    per_key: dict[str, int] = report.sim.get("effects_per_key", {})
    with engine.connect() as conn:
        report.by_status = {
            str(s): int(n)
            for s, n in conn.execute(
                sa.text("SELECT status, count(*) FROM outbox_operations GROUP BY status"
                        " ORDER BY status")
            ).all()
        }
        rows = conn.execute(
            sa.text(
                "SELECT operation_id, status, status_reason, idempotency_key, requires_approval"
                " FROM outbox_operations ORDER BY id"
            )
        ).all()
        for op_id, status, reason, key, _needs in rows:
            if status == "blocked":
                report.blocked.append((str(op_id), str(reason)))
                if op_id != report.late or reason != "deadline_passed":
                    report.unexpected_blocked.append((str(op_id), str(reason)))
            elif status in ("applied", "verified"):
                if per_key.get(str(key), 0) == 0:
                    report.lost.append(f"{op_id} (applied here, no effect at the receiver)")
            elif op_id != report.late:
                report.lost.append(f"{op_id} ({status})")
        if report.late and not any(op == report.late for op, _ in report.blocked):
            report.lost.append(f"{report.late} (should have been blocked: deadline passed)")
        report.unknown_found = [
            (str(o), str(r or "unspecified"))
            for o, r in conn.execute(
                sa.text(
                    "SELECT operation_id, reason FROM outbox_events WHERE to_status = 'unknown'"
                    " AND from_status <> 'unknown' ORDER BY id"
                )
            ).all()
        ]
        report.resolutions = [
            (str(o), str(t), str(r))
            for o, t, r in conn.execute(
                sa.text(
                    "SELECT operation_id, to_status, reason FROM outbox_events"
                    " WHERE kind = 'reconciliation' ORDER BY id"
                )
            ).all()
        ]
        report.attempts = int(
            conn.execute(sa.text("SELECT count(*) FROM outbox_attempts")).scalar_one()
        )
        if report.needs_approval:
            first_send: dict[str, int] = dict(
                conn.execute(
                    sa.text(
                        "SELECT operation_id, min(id) FROM outbox_events"
                        " WHERE to_status = 'dispatching' GROUP BY operation_id"
                    )
                ).all()
            )
            approved_at: dict[str, int] = dict(
                conn.execute(
                    sa.text(
                        "SELECT operation_id, min(id) FROM outbox_events"
                        " WHERE kind = 'approval' GROUP BY operation_id"
                    )
                ).all()
            )
            for op_id in report.needs_approval:
                sent, approved = first_send.get(op_id), approved_at.get(op_id)
                if sent is not None and (approved is None or approved > sent):
                    report.sent_without_approval.append(op_id)
