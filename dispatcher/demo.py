"""``outboxd demo``: the whole promise, end to end, on the embedded SQLite default.

What it does, with real processes throughout:

1. creates a temporary directory with a SQLite database and an ``outboxd.toml``;
2. starts ``outboxd sim`` (``python -m providers.sim``) on a free loopback port with faults:
   apply-then-drop-the-response, 500 before and after applying, 429 with ``Retry-After``,
   slow requests;
3. runs a small support-desk agent that stages a few hundred operations through
   :func:`outbox.advance` (a compare-and-set of each task's checkpoint plus its effects, in
   one transaction): some need approval, one is already past its deadline, and one carries
   a credential and is refused at enqueue (the refusal names the JSON path, not the value);
4. starts the dispatcher (``python -m dispatcher.cli run``), SIGKILLs it twice while
   operations are ``dispatching`` and restarts it each time;
5. approves the operations that wait for approval (:func:`outbox.approvals.approve`);
6. stops the dispatcher with SIGTERM and prints a summary: operations by status, effects
   at the receiver, duplicates, unknown outcomes and how each was resolved (from the
   ``reconciliation`` rows of ``outbox_events``), blocked operations with their reasons,
   and the commands to inspect them.

Exit code 0 when there is no duplicate and nothing is lost; 1 otherwise. ``--keep`` leaves
the directory (database, configuration, logs, the sim's ledger) for exploring.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, TextIO

import sqlalchemy as sa
from sqlalchemy.engine import Engine

TENANT = "acme"
PROVIDER = "tickets"
ACTOR = "demo-operator"
SETTLED = ("applied", "verified", "rejected", "blocked", "cancelled")
START_TIMEOUT_SECONDS = 20.0
PHASE_TIMEOUT_SECONDS = 40.0

#: The receiver's faults: each request draws them independently (seeded with ``--seed``).
SIM_FAULTS: dict[str, float] = {
    "--p-drop-after-apply": 0.04,
    "--p-5xx-before": 0.03,
    "--p-5xx-after": 0.02,
    "--p-429": 0.03,
    "--p-slow": 0.08,
}


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
    approval_enforced: bool = True
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


# -- output ----------------------------------------------------------------------------


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


# -- processes -------------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The caller's environment without ``OUTBOXD_*`` (they would override the demo's
    configuration file)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}


class SimReceiver:
    """``python -m providers.sim`` on a free loopback port, with faults."""

    def __init__(self, workdir: Path, seed: int | None) -> None:
        self.port_file = workdir / "sim.port"
        self.log_path = workdir / "sim.log"
        args = [
            sys.executable, "-m", "providers.sim", "--host", "127.0.0.1", "--port", "0",
            "--port-file", str(self.port_file), "--ledger", str(workdir / "sim-ledger.sqlite"),
            "--retry-after", "0.3", "--slow-seconds", "0.8",
        ]
        for flag, p in SIM_FAULTS.items():
            args += [flag, str(p)]
        if seed is not None:
            args += ["--seed", str(seed)]
        self._log: IO[bytes] = self.log_path.open("ab")
        self.process = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=_child_env()
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the sim did not start; see {self.log_path}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text().strip())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class DispatcherProcess:
    """``python -m dispatcher.cli run --config FILE`` as a real process."""

    def __init__(self, config: Path, workdir: Path, number: int) -> None:
        self.log_path = workdir / f"dispatcher-{number}.log"
        self._log: IO[bytes] = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(config)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=_child_env(),
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs; leases are left to expire."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code


# -- the agent -------------------------------------------------------------------------


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


# -- the run ---------------------------------------------------------------------------


def write_config(path: Path, db_url: str, sim_url: str) -> None:
    path.write_text(
        "\n".join(
            [
                "# written by `outboxd demo`",
                "[database]",
                f'url = "{db_url}"',
                "",
                "[dispatcher]",
                "batch_size = 50",
                "concurrency = 8",
                "lease_seconds = 2",
                "poll_interval_ms = 50",
                "shutdown_grace_seconds = 5",
                "reconcile_interval_seconds = 0.5",
                "recovery_interval_seconds = 0.5",
                "",
                "[metrics]",
                "enabled = false",
                "",
                f"[providers.{PROVIDER}]",
                'kind = "http"',
                f'url = "{sim_url}/tickets"',
                f'lookup_url = "{sim_url}/tickets/by-key/{{idempotency_key}}"',
                "dedup_retention_seconds = 86400",
                "in_flight_seconds = 1.5",
                "timeout_seconds = 1.5",
                "max_attempts = 12",
                "max_elapsed_seconds = 120",
                "",
            ]
        )
    )


def _counts(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT status, count(*) FROM outbox_operations GROUP BY status")
        ).all()
    return Counter({str(s): int(n) for s, n in rows})


def _wait(
    what: str, predicate: Callable[[Counter[str]], bool], engine: Engine, progress: Progress,
    daemon: DispatcherProcess, *, interval: float = 0.02,
) -> Counter[str]:
    deadline = time.monotonic() + PHASE_TIMEOUT_SECONDS
    while True:
        counts = _counts(engine)
        progress.update(counts)
        if predicate(counts):
            return counts
        if not daemon.alive():
            tail = daemon.log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"the dispatcher exited ({daemon.process.returncode}) while waiting for "
                f"{what}: " + " | ".join(tail)
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}: {dict(counts)}")
        time.sleep(interval)


def _approval_enforced() -> bool:
    """Does ``outboxd run`` check approvals? (the authority module is wired in)."""
    import importlib.util

    return importlib.util.find_spec("dispatcher.authority") is not None


def _approve_waiting(engine: Engine, report: DemoReport) -> None:
    from outbox import approvals
    from outbox.errors import ApprovalError

    for op_id in report.needs_approval:
        with engine.begin() as conn:
            try:
                approvals.approve(
                    conn, tenant_id=TENANT, operation_id=op_id, actor=ACTOR,
                    expires_in=timedelta(minutes=10), reason="refund checked by a person",
                    requeue=True,
                )
            except ApprovalError:
                continue  # already finished: it was sent before approval (see the summary)
        report.approved.append(op_id)


def run(
    *, operations: int = 300, seed: int | None = None, keep: bool = False,
    out: TextIO | None = None, tty: bool | None = None,
) -> DemoReport:
    from outbox import db, migrate

    out = out or sys.stdout
    tty = out.isatty() if tty is None else tty
    progress = Progress(out, tty)
    rng = random.Random(seed)
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="outboxd-demo-"))
    config = workdir / "outboxd.toml"
    db_url = f"sqlite:///{workdir / 'demo.db'}"
    report = DemoReport(workdir=workdir, config=config, database_url=db_url)
    sim: SimReceiver | None = None
    daemon: DispatcherProcess | None = None
    engine: Engine | None = None
    try:
        progress.say(f"workspace   {workdir}")
        sim = SimReceiver(workdir, seed)
        faults = ", ".join(f"{k.removeprefix('--p-')} {v:.0%}" for k, v in SIM_FAULTS.items())
        progress.say(f"receiver    outboxd sim on {sim.url} (pid {sim.process.pid}; {faults})")
        write_config(config, db_url, sim.url)
        engine = db.create_engine(db_url)
        migrate.upgrade(engine)
        progress.say(f"database    {db_url} (migrated)")

        stage_operations(engine, operations, rng, report)
        progress.say(
            f"agent       staged {report.staged} operations through outbox.advance "
            f"({len(report.needs_approval)} need approval, 1 is past its deadline)"
        )
        progress.say(f"agent       refused at enqueue -> {report.refused_message}")
        report.approval_enforced = _approval_enforced()
        if not report.approval_enforced:
            progress.say("WARNING     this build's dispatcher does not enforce approvals yet")

        progress.start(report.staged)
        total = report.staged
        done_share = (0.2, 0.55)
        for number, share in enumerate(done_share, start=1):
            daemon = DispatcherProcess(config, workdir, number)
            progress.say(f"dispatcher  started (pid {daemon.pid})")

            def running_mid(c: Counter[str], share: float = share) -> bool:
                settled = sum(c[s] for s in SETTLED)
                if settled == total:  # a machine fast enough to finish first: kill anyway
                    return True
                return settled >= share * total and c["dispatching"] > 0

            counts = _wait("a moment to crash the dispatcher", running_mid, engine, progress,
                           daemon, interval=0.005)
            daemon.kill()
            report.kills.append((daemon.pid, counts["dispatching"]))
            progress.say(
                f"dispatcher  SIGKILL pid {daemon.pid} with {counts['dispatching']} operations"
                " dispatching (\"dispatch may have occurred\" was committed for them)"
            )
            daemon = None
        daemon = DispatcherProcess(config, workdir, len(done_share) + 1)
        progress.say(f"dispatcher  restarted (pid {daemon.pid})")
        _wait("every operation to settle",
              lambda c: sum(c[s] for s in SETTLED) == total, engine, progress, daemon)
        _approve_waiting(engine, report)
        progress.say(
            f"operator    approved {len(report.approved)} operations waiting for approval"
        )
        _wait("the approved operations", lambda c: _approvals_done(engine, report) and
              sum(c[s] for s in SETTLED) == total, engine, progress, daemon)
        report.final_exit_code = daemon.stop()
        daemon = None
        progress.close()
        progress.say(f"dispatcher  SIGTERM -> exit {report.final_exit_code}")
        collect(engine, sim, report)
    finally:
        progress.close()
        if daemon is not None:
            daemon.kill()
        if sim is not None:
            sim.stop()
        if engine is not None:
            engine.dispose()
        report.seconds = time.monotonic() - t0
        if not keep and report.ok:
            shutil.rmtree(workdir, ignore_errors=True)
    return report


def _approvals_done(engine: Engine, report: DemoReport) -> bool:
    if not report.approved:
        return True
    with engine.connect() as conn:
        waiting = conn.execute(
            sa.text(
                "SELECT count(*) FROM outbox_operations WHERE status = 'blocked'"
                " AND status_reason LIKE 'approval_%'"
            )
        ).scalar_one()
    return int(waiting) == 0


# -- the summary -----------------------------------------------------------------------


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
    if not report.approval_enforced:
        lines.append("  WARNING: this build's dispatcher does not enforce approvals")
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


def main(
    *, operations: int = 300, seed: int | None = None, keep: bool = False,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    try:
        report = run(operations=operations, seed=seed, keep=keep, out=out)
    except (TimeoutError, RuntimeError) as exc:
        print(f"outboxd demo: {exc} (workspace kept for inspection)", file=sys.stderr)
        return 1
    print(render(report, keep=keep or not report.ok), file=out, flush=True)
    return 0 if report.ok else 1
