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

The steps live in their own modules: the agent and the operator in
:mod:`dispatcher.demo.scenario`, the processes in :mod:`dispatcher.demo.processes`, the findings
in :mod:`dispatcher.demo.report` and what is printed in :mod:`dispatcher.demo.output`; this
module runs them in order and re-exports their public names.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.demo.output import Progress, render
from dispatcher.demo.processes import (
    SIM_FAULTS,
    START_TIMEOUT_SECONDS,
    DispatcherProcess,
    SimReceiver,
)
from dispatcher.demo.report import SETTLED, DemoReport, collect
from dispatcher.demo.scenario import ACTOR, PROVIDER, TENANT, approve_waiting, stage_operations

__all__ = [
    "ACTOR",
    "PHASE_TIMEOUT_SECONDS",
    "PROVIDER",
    "SETTLED",
    "SIM_FAULTS",
    "START_TIMEOUT_SECONDS",
    "TENANT",
    "DemoReport",
    "DispatcherProcess",
    "Progress",
    "SimReceiver",
    "collect",
    "main",
    "render",
    "run",
    "stage_operations",
    "write_config",
]

PHASE_TIMEOUT_SECONDS = 40.0


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
        approve_waiting(engine, report)
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
