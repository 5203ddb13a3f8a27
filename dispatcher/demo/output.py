"""What the demo shows: :class:`Progress` while it runs (a bar on a terminal, plain lines
otherwise) and :func:`render`, the summary printed at the end."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, TextIO

from dispatcher.demo.report import SETTLED, DemoReport
from dispatcher.demo.scenario import ACTOR


class Progress:
    """A progress bar on a terminal (tqdm), plain lines otherwise."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self._bar: Any = None
        self._last_line = 0.0

    def say(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def start(self, total: int) -> None:
        if self.tty:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=total, desc="settled", unit="op", file=self.out, dynamic_ncols=True
            )

    def update(self, counts: Counter[str]) -> None:
        settled = sum(counts[s] for s in SETTLED)
        detail = ", ".join(f"{s} {counts[s]}" for s in sorted(counts) if counts[s])
        if self._bar is not None:
            self._bar.n = settled
            self._bar.set_postfix_str(detail, refresh=False)
            self._bar.refresh()
        elif time.monotonic() - self._last_line >= 2.0:
            self._last_line = time.monotonic()
            self.say(f"  progress: {settled} settled ({detail})")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def render(report: DemoReport, *, keep: bool) -> str:
    lines: list[str] = ["", "== outboxd demo: summary " + "=" * 54, ""]
    lines.append("operations by status")
    for status, n in sorted(report.by_status.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {status:<12} {n:>5}")
    sim = report.sim
    faults = ", ".join(f"{k} {v}" for k, v in sorted(sim.get("faults", {}).items()))
    lines += [
        "",
        "at the receiver (outboxd sim)",
        f"  effects applied            {sim.get('total_effects', 0):>5}"
        f"   (distinct idempotency keys: {len(sim.get('effects_per_key', {}))})",
        f"  duplicates                 {report.duplicates:>5}",
        f"  replays answered from key  {sim.get('replays', 0):>5}"
        "   (re-sends the receiver deduplicated)",
        f"  requests                   {sim.get('requests', 0):>5}"
        f"   (dispatch attempts recorded: {report.attempts})",
        f"  faults injected            {faults or 'none'}",
        "",
        "crashes",
    ]
    for pid, dispatching in report.kills:
        lines.append(f"  SIGKILL dispatcher pid {pid} with {dispatching} operations dispatching")
    lines.append(f"  final stop: SIGTERM, exit {report.final_exit_code}")
    lines += ["", f"unknown outcomes found: {len(report.unknown_found)}"]
    why = Counter(r for _, r in report.unknown_found)
    explain = {
        "lease_expired": "the dispatcher died while they were dispatching (lease expired)",
        "dedup_window_passed": "an ambiguous attempt outside the receiver's dedup window",
    }
    for reason, n in why.most_common():
        lines.append(f"  {n:>4} x {reason}: {explain.get(reason, 'see outbox_events')}")
    lines.append(f"resolved by reconciliation (outbox_events kind=reconciliation): "
                 f"{len(report.resolutions)}")
    for op_id, to, reason in report.resolutions:
        meaning = {
            "reconciled_found": "found at the receiver -> applied, not re-sent",
            "reconciled_not_applied": "not found after the in-flight window -> re-sent, same key",
        }.get(reason, reason)
        lines.append(f"  {op_id:<28} -> {to:<8} {meaning}")
    lines += ["", f"approvals: {len(report.needs_approval)} operations needed one; "
                  f"approved by {ACTOR}: {len(report.approved)}"]
    if report.sent_without_approval:
        lines.append(f"  SENT BEFORE APPROVAL: {', '.join(report.sent_without_approval)}")
    lines += ["", f"blocked: {len(report.blocked)}"]
    for op_id, reason in report.blocked:
        lines.append(f"  {op_id:<28} {reason}")
    lines += ["", f"refused at enqueue: {report.refused_message or 'nothing (unexpected)'}"]
    lines += ["", f"lost: {len(report.lost)}"]
    lines.extend(f"  {item}" for item in report.lost)
    lines += ["", "inspect"]
    cfg = str(report.config)
    if keep:
        lines += [
            f"  database   {report.database_url}",
            f"  config     {cfg}",
            f"  logs       {report.workdir}/dispatcher-*.log, {report.workdir}/sim.log",
            f"  outboxd status --config {cfg}",
            f"  outboxd ops list --status blocked --config {cfg}",
            f"  outboxd ops show {report.late} --config {cfg}",
            f"  outboxd ops plan case-late --config {cfg}",
            f"  sqlite3 {report.workdir / 'demo.db'} "
            "\"SELECT operation_id, from_status, to_status, reason FROM outbox_events"
            " WHERE kind = 'reconciliation'\"",
        ]
    else:
        lines += [
            "  the workspace was removed; run `outboxd demo --keep` to keep it, then:",
            "  outboxd status --config <workspace>/outboxd.toml",
            "  outboxd ops list --status blocked --config <workspace>/outboxd.toml",
        ]
    verdict = "OK" if report.ok else "FAILED"
    lines += [
        "",
        f"{verdict}: duplicates {report.duplicates}, lost {len(report.lost)}, "
        f"in {report.seconds:.1f} s",
    ]
    return "\n".join(lines)
