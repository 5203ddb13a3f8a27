"""The checker: counts, from the receiver's ledger and the records only, what a run did.

Jepsen's total-queue checker, adapted to an outbox. After the final drain:

* **lost** — operations the agent saw committed (``ok``) that were neither applied at the
  receiver nor escalated. Escalated means ``blocked``, ``cancelled``, ``rejected``, or
  ``unknown`` *with* evidence (an attempt row or an event moving it to ``unknown``). Also
  lost: an acknowledged operation whose row is missing, and a row the records call
  ``applied``/``verified`` with no effect at the receiver.
* **duplicated** — Σ max(0, effects - 1) over idempotency keys (``/_stats``).
* **unexpected** — effects under a key that no operation owns.
* **recovered** — operations whose commit the agent could not confirm (``info``) that
  exist and were applied anyway.
* **unknown resolved by lookup** — operations that were ever ``unknown`` and have an
  ``outbox_events`` row of kind ``reconciliation``; **unresolved with / without evidence**
  — operations still ``unknown`` after the drain.
* **stale-token sends** — an attempt the receiver answered 2xx whose fencing token is
  lower than the token of an attempt of the same operation that started before it; plus
  the receiver's own count of requests it refused for a stale token (``fenced``), which
  is the "sometimes" proof that stale workers did try.
* **attempts over budget** — ``attempts`` above the operation's budget.
* **sends after cancellation** — attempts that started (database clock) after the agent
  had its cancellation's commit acknowledged.
* **sends without a valid approval** — for an operation that requires approval, every
  effect at the receiver carries the fencing token of the dispatch that made it; the
  ``dispatching`` event of that token must come after an ``approval`` event of the
  operation with no ``revocation`` event in between. Events are ordered by id: on
  PostgreSQL the dispatch locks the approval rows (``FOR UPDATE``) before it writes its
  event and a revocation writes its event after its ``UPDATE`` got those locks, so id
  order is the order in which the two took effect; SQLite has one writer at a time. An
  effect with no ``dispatching`` event for its token counts too.
* **failpoint hits** — from ``OUTBOXD_FAILPOINT_LOG``, per point and action (``kill`` or
  ``stop``): a fault that never fired proves nothing.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

ESCALATED = ("blocked", "cancelled", "rejected")
APPLIED = ("applied", "verified")
CANCEL_MARGIN_SECONDS = 0.5  # statement start vs. the agent's ack: same host clock


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failpoint_hits: dict[str, int] = field(default_factory=dict)
    failpoint_actions: dict[str, dict[str, int]] = field(default_factory=dict)
    seed: int = 0
    command: str = ""
    workdir: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.errors

    def failpoint_kills(self) -> int:
        return sum(self.failpoint_hits.values())

    def require(self, condition: bool, text: str) -> None:
        if not condition:
            self.violations.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "command": self.command, "workdir": self.workdir,
                "ok": self.ok, "violations": self.violations, "errors": self.errors,
                "failpoint_hits": self.failpoint_hits,
                "failpoint_actions": self.failpoint_actions, "figures": self.figures}

    def summary(self) -> str:
        head = "PASS" if self.ok else "FAIL"
        lines = [f"{head} seed={self.seed}  reproduce: {self.command}",
                 f"workdir: {self.workdir}"]
        f = self.figures
        keys = ("acknowledged", "lost", "duplicates", "unexpected", "recovered",
                "ever_unknown", "unknown_resolved_by_lookup", "unknown_resolved_pct",
                "unresolved_with_evidence", "unresolved_without_evidence",
                "stale_token_sends", "fencing_rejections_at_receiver", "attempts_over_budget",
                "sends_after_cancel", "cancelled_with_effect", "approval_required",
                "revocations", "blocked_after_revocation", "sends_without_valid_approval",
                "kills_and_pauses",
                "rto_p50_seconds", "rto_p99_seconds", "max_lost_work", "setup_seconds",
                "fault_phase_seconds", "drain_seconds", "run_seconds")
        lines.append("  ".join(f"{k}={f.get(k)}" for k in keys if k in f))
        lines.append(f"failpoints fired: {self.failpoint_hits}  by action:"
                     f" {self.failpoint_actions}")
        lines.append(f"nemesis: {f.get('nemesis')}")
        lines.append(f"receiver faults: {f.get('receiver_faults')}  proxy: {f.get('proxy')}")
        lines.append(f"final statuses: {f.get('statuses')}  blocked: {f.get('blocked_reasons')}")
        lines.extend(f"VIOLATION: {v}" for v in self.violations)
        lines.extend(f"ERROR: {e}" for e in self.errors)
        return "\n".join(lines)


def _ts(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.fromisoformat(value).timestamp()
    return float(value)


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def failpoint_log(path: Path) -> dict[tuple[str, str], int]:
    """Firings per (point, action) in an ``OUTBOXD_FAILPOINT_LOG`` file."""
    hits: Counter[tuple[str, str]] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                hits[(parts[0], parts[1])] += 1
    return dict(hits)


def failpoint_hits(path: Path) -> dict[str, int]:
    """Firings per point, whatever the action."""
    hits: Counter[str] = Counter()
    for (name, _), n in failpoint_log(path).items():
        hits[name] += n
    return dict(hits)


def _unauthorised_sends(conn: Any, ops: list[Any], effects: list[dict[str, Any]]) -> list[str]:
    """Effects of approval-requiring operations whose dispatch had no valid approval."""
    needs = {r.idempotency_key: r.operation_id for r in ops if r.requires_approval}
    if not needs:
        return []
    rows = conn.execute(sa.text(
        "SELECT e.id, e.operation_id, e.kind, e.to_status, e.fencing_token"
        " FROM outbox_events e JOIN outbox_operations o ON o.tenant_id = e.tenant_id"
        " AND o.operation_id = e.operation_id WHERE o.requires_approval"
        " AND (e.kind IN ('approval', 'revocation')"
        " OR (e.kind = 'transition' AND e.to_status = 'dispatching')) ORDER BY e.id")).all()
    grants: dict[str, list[tuple[int, bool]]] = defaultdict(list)  # op -> (id, in force)
    dispatched: dict[tuple[str, int], int] = {}  # (op, token) -> event id
    for ev_id, op_id, kind, _to, token in rows:
        if kind in ("approval", "revocation"):
            grants[op_id].append((ev_id, kind == "approval"))
        elif token is not None:
            dispatched.setdefault((op_id, int(token)), ev_id)
    bad: list[str] = []
    for e in effects:
        op_id = needs.get(e["key"])
        if op_id is None:
            continue
        token = e.get("fencing_token")
        ev_id = dispatched.get((op_id, int(token))) if token is not None else None
        if ev_id is None:
            bad.append(f"{op_id}: effect under token {token} with no dispatching event")
            continue
        before = [granted for gid, granted in grants.get(op_id, []) if gid < ev_id]
        if not before or not before[-1]:
            bad.append(f"{op_id}: token {token} dispatched with no approval in force"
                       f" ({'revoked' if before else 'never approved'})")
    return bad


def check(engine: Engine, stats: dict[str, Any], agent: Any, fp_log: Path, *,
          budget: int, control: bool = False,
          effect_log: list[dict[str, Any]] | None = None) -> Report:
    """Count what the run did. ``effect_log``: the receiver's effects in order with their
    fencing tokens (``GET /_effects``), for the approval check."""
    report = Report()
    with engine.connect() as conn:
        ops = conn.execute(sa.text(
            "SELECT operation_id, task_id, idempotency_key, status, status_reason, attempts,"
            " max_attempts, requires_approval FROM outbox_operations")).all()
        attempts = conn.execute(sa.text(
            "SELECT operation_id, fencing_token, started_at, status_code, result_class,"
            " evidence FROM outbox_attempts ORDER BY id")).all()
        to_unknown = set(conn.execute(sa.text(
            "SELECT DISTINCT operation_id FROM outbox_events WHERE to_status = 'unknown'"
        )).scalars())
        reconciled = set(conn.execute(sa.text(
            "SELECT DISTINCT operation_id FROM outbox_events WHERE kind = 'reconciliation'"
        )).scalars())
        task_cancel = dict(conn.execute(sa.text(
            "SELECT task_id, cancelled_at FROM outbox_tasks WHERE cancelled_at IS NOT NULL"
        )).all())
        unauthorised = _unauthorised_sends(conn, list(ops), effect_log or [])
    effects: dict[str, int] = {str(k): int(v) for k, v in stats["effects_per_key"].items()}
    by_op = {r.operation_id: r for r in ops}
    keys = {r.idempotency_key: r.operation_id for r in ops}
    attempts_of: dict[str, list[Any]] = defaultdict(list)
    for a in attempts:
        attempts_of[a.operation_id].append(a)
    statuses = Counter(r.status for r in ops)
    blocked = Counter(r.status_reason for r in ops if r.status == "blocked")

    lost: list[str] = []
    applied_without_effect: list[str] = []
    for op_id in agent.ok:
        row = by_op.get(op_id)
        if row is None:
            lost.append(f"{op_id}: acknowledged but no row")
            continue
        n = effects.get(row.idempotency_key, 0)
        if n > 0 or row.status in ESCALATED:
            continue
        if row.status in APPLIED:
            applied_without_effect.append(op_id)
            lost.append(f"{op_id}: {row.status} but no effect at the receiver")
        elif row.status == "unknown":
            if not (attempts_of.get(op_id) or op_id in to_unknown):
                lost.append(f"{op_id}: unknown without evidence")
        else:
            lost.append(f"{op_id}: {row.status} after the drain, never applied")

    unexpected = {k: n for k, n in effects.items() if k not in keys}
    duplicates = {k: n for k, n in effects.items() if n > 1}
    dup_count = sum(n - 1 for n in effects.values())
    info = set(agent.info)
    recovered = [o for o in info if o in by_op and effects.get(by_op[o].idempotency_key, 0)]

    ever_unknown = to_unknown | {r.operation_id for r in ops if r.status == "unknown"}
    resolved_by_lookup = ever_unknown & reconciled
    still_unknown = [r.operation_id for r in ops if r.status == "unknown"]
    with_evidence = [o for o in still_unknown if attempts_of.get(o) or o in to_unknown]
    without_evidence = [o for o in still_unknown if o not in set(with_evidence)]

    stale: list[str] = []
    fenced_attempt_rows = 0
    for op_id, rows in attempts_of.items():
        seen: list[tuple[float, int]] = []
        for a in sorted(rows, key=lambda a: (_ts(a.started_at) if a.started_at else 0.0)):
            ev = _json(a.evidence) or {}
            if isinstance(ev, dict) and ev.get("fenced"):
                fenced_attempt_rows += 1
            token = int(a.fencing_token or 0)
            if (a.result_class == "applied" and a.status_code and 200 <= a.status_code < 300
                    and not (isinstance(ev, dict) and ev.get("replayed"))
                    and any(t > token for _, t in seen)):
                stale.append(f"{op_id}: token {token} applied after a higher token started")
            if a.started_at:
                seen.append((_ts(a.started_at), token))

    over_budget = [r.operation_id for r in ops if r.attempts > (r.max_attempts or budget)]

    acked_cancel: dict[str, float] = {}
    for task_id, at in getattr(agent, "cancels", []):
        acked_cancel.setdefault(task_id, at)
    after_cancel = []
    for r in ops:
        ack = acked_cancel.get(r.task_id)
        if ack is None:
            continue
        for a in attempts_of.get(r.operation_id, []):
            if a.started_at and _ts(a.started_at) > ack + CANCEL_MARGIN_SECONDS:
                after_cancel.append(f"{r.operation_id}: attempt started after the cancel")
    cancelled_with_effect = [r.operation_id for r in ops
                             if r.status == "cancelled" and effects.get(r.idempotency_key, 0)]

    report.failpoint_hits = failpoint_hits(fp_log)
    for (name, action), n in sorted(failpoint_log(fp_log).items()):
        report.failpoint_actions.setdefault(name, {})[action] = n
    needing = [r for r in ops if r.requires_approval]
    f = report.figures
    f.update({
        "operations": len(ops),
        "acknowledged": len(agent.ok),
        "agent_failed": len(agent.failed),
        "agent_info": len(agent.info),
        "agent_commit_retries": agent.fail_attempts + agent.info_attempts,
        "agent_uncertain_commits_recovered": agent.recovered_commits,
        "lost": len(lost),
        "applied_without_effect": len(applied_without_effect),
        "duplicates": dup_count,
        "duplicated_keys": len(duplicates),
        "unexpected": sum(unexpected.values()),
        "recovered": len(recovered),
        "ever_unknown": len(ever_unknown),
        "unknown_resolved_by_lookup": len(resolved_by_lookup),
        "unknown_resolved_pct": round(100.0 * len(resolved_by_lookup) / len(ever_unknown), 2)
        if ever_unknown else None,
        "unresolved_with_evidence": len(with_evidence),
        "unresolved_without_evidence": len(without_evidence),
        "stale_token_sends": len(stale),
        "fencing_rejections_at_receiver": int(stats.get("fenced", 0)),
        "fenced_outcomes_in_records": fenced_attempt_rows,
        "attempts_over_budget": len(over_budget),
        "sends_after_cancel": len(after_cancel),
        "tasks_cancelled": len(task_cancel),
        "cancelled_with_effect": len(cancelled_with_effect),
        "approval_required": len(needing),
        "approval_required_applied": sum(1 for r in needing if r.status in APPLIED),
        "revocations": sum(1 for _, n in getattr(agent, "revoked", []) if n),
        "reapprovals": len(getattr(agent, "reapproved", [])),
        "blocked_after_revocation": sum(1 for r in needing if r.status == "blocked"
                                        and r.status_reason == "approval_revoked"),
        "sends_without_valid_approval": len(unauthorised) if effect_log is not None else None,
        "receiver_requests": stats.get("requests"),
        "receiver_replays": stats.get("replays"),
        "receiver_in_flight_conflicts": stats.get("in_flight_conflicts"),
        "receiver_faults": stats.get("faults"),
        "statuses": dict(statuses),
        "blocked_reasons": dict(blocked),
        "examples": {"lost": lost[:5], "duplicates": list(duplicates.items())[:5],
                     "unexpected": list(unexpected.items())[:5], "stale": stale[:5],
                     "without_evidence": without_evidence[:5], "over_budget": over_budget[:5],
                     "after_cancel": after_cancel[:5],
                     "cancelled_with_effect": cancelled_with_effect[:5],
                     "unauthorised": unauthorised[:5]},
    })
    report.require(len(lost) == 0, f"lost={len(lost)} e.g. {lost[:3]}")
    report.require(not unexpected, f"unexpected effects: {list(unexpected.items())[:3]}")
    report.require(not without_evidence,
                   f"unknown without evidence: {without_evidence[:3]}")
    report.require(not stale, f"stale-token sends: {stale[:3]}")
    report.require(not over_budget, f"attempts over budget: {over_budget[:3]}")
    report.require(not after_cancel, f"sends after cancellation: {after_cancel[:3]}")
    report.require(not unauthorised, f"sends without a valid approval: {unauthorised[:3]}")
    if control:
        # the control run: the receiver ignores keys, so duplicates must be *seen*
        report.require(dup_count > 0, "control run: the checker saw no duplicates")
    else:
        report.require(dup_count == 0,
                       f"duplicates={dup_count} e.g. {list(duplicates.items())[:3]}")
    return report


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    if len(values) == 1:
        return round(values[0], 3)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return round(cuts[min(98, max(0, int(q) - 1))], 3)


def rto_figures(engine: Engine, kills: list[Any]) -> dict[str, Any]:
    """RTO per kill: from the kill until another replica's next successful dispatch of the
    killed replica's leased work (first ``applied`` event of one of those operations by
    another actor), and until *all* of that work was settled; and the largest amount of
    leased work a kill left to redo or reconcile."""
    first: list[float] = []
    settled: list[float] = []
    with engine.connect() as conn:
        for k in kills:
            if not k.leased:
                continue
            rows = conn.execute(
                sa.text("SELECT operation_id, created_at, actor FROM outbox_events WHERE"
                        " to_status IN ('applied', 'verified', 'blocked', 'cancelled',"
                        " 'rejected') AND operation_id IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True)),
                {"ids": k.leased}).all()
            done: dict[str, float] = {}
            for op_id, created, actor in rows:
                t = _ts(created)
                if actor != k.worker and t >= k.at - 0.05:
                    done[op_id] = min(done.get(op_id, t), t)
            if done:
                first.append(max(0.0, min(done.values()) - k.at))
            if len(done) == len(set(k.leased)):
                settled.append(max(0.0, max(done.values()) - k.at))
    return {
        "kills_with_leased_work": sum(1 for k in kills if k.leased),
        "rto_p50_seconds": _percentile(first, 50),
        "rto_p99_seconds": _percentile(first, 99),
        "rto_all_work_p50_seconds": _percentile(settled, 50),
        "rto_all_work_p99_seconds": _percentile(settled, 99),
        "max_lost_work": max((len(k.leased) for k in kills), default=0),
    }
