"""The nemesis runner: real processes, a seeded schedule of faults, a drain, a check.

One run (:func:`run`) starts

* a database: a throwaway PostgreSQL cluster of its own (``initdb``/``pg_ctl``, never the
  machine's shared server) behind :class:`tests.chaos.proxy.FaultProxy`, or a SQLite file;
* ``outboxd sim`` with seeded faults, key retention equal to what the provider declares,
  and fencing enforced;
* 2-3 ``outboxd run`` replicas (on PostgreSQL one of them under ``faketime +10m`` when
  libfaketime is installed), with probabilistic failpoint kills at every protocol step;
* an agent loop (a thread of the runner) that commits tasks with their operations through
  ``outbox.api.advance`` and logs each commit as ok / fail / info, Jepsen style; every
  ``approval_every``-th task's operations require approval, which the agent gives in the
  same transaction;

then applies the seeded schedule — SIGKILL and restart of a replica, SIGSTOP/SIGCONT past
the lease (kills and pauses at an even cadence, rotating over the replicas), PostgreSQL
immediate shutdown and restart, ``pg_terminate_backend`` of the dispatchers' connections,
proxy delay / blackhole / reset / COMMIT-reply drop, sim fault bursts (apply-then-drop, 5xx
before and after, 429, slow), receiver key pruning (keys past the declared retention), task
cancellations, approval revocations (some re-approved later) — stops the faults, drains,
and hands everything to :func:`tests.chaos.checker.check`.

Failpoints: each (re)start of a replica arms the point killed least so far with
``kill%P``. A share of the scheduled pauses is delivered *at* a failpoint: the runner
writes ``name=stop@1`` to the replica's ``OUTBOXD_FAILPOINT_CONTROL`` file (the point hit
least so far), the replica SIGSTOPs itself on its next pass there, the runner sees the
firing in the failpoint log and sends SIGCONT once the lease has passed, so the replica
resumes at that exact step behind a stale token. Kills and stops both count as hits of
their point.

The *schedule* and the receiver's fault dice are functions of the seed; the interleaving
of real processes is not. A failing run prints its seed and the command that replays the
same schedule (``python -m tests.chaos.soak --seed ...``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import approvals, db, errors, migrate
from outbox.api import StagedOperation, advance, cancel_task
from tests.chaos.checker import Report, check, failpoint_hits, failpoint_log, rto_figures
from tests.chaos.proxy import FaultProxy
from tests.support.daemon import REPO_ROOT, DaemonProcess, http_provider, write_config
from tests.support.moves_seen import forbidden_moves
from tests.support.sim import SimProcess

TENANT = "chaos"
PROVIDER = "sim"
# back-off between attempts tops out here, not at the default minute: the sim recovers at
# once, and a drain that waits a minute for the last retry proves nothing more
RETRY_MAX_DELAY_SECONDS = 2
FAILPOINTS = ("after_claim_commit", "after_dispatching_commit", "after_send",
              "before_receipt_commit", "in_reconcile")
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
NON_FINAL = ("pending", "claimed", "dispatching", "unknown")


DRAIN_CAP = 4
"""The drain's whole wait, in ``drain_timeout``s (the CI tier's test allows 900 s in all)."""

@dataclass
class ChaosConfig:
    seed: int = 1
    dialect: str = "postgres"  # or "sqlite"
    operations: int = 5000
    replicas: int = 3
    fault_seconds: float = 60.0
    ops_per_commit: int = 10
    lease_seconds: float = 1.0
    kills: int = 40
    pauses: int = 70
    pause_extra: tuple[float, float] = (0.1, 0.3)  # a pause lasts lease + U(extra)
    db_restarts: int = 2
    pg_terminates: int = 6
    proxy_faults: int = 12
    sim_bursts: int = 8
    prunes: int = 10
    cancels: int = 10
    revocations: int = 10
    approval_every: int = 4  # every n-th task's operations require approval (0: none)
    failpoint_p: dict[str, float] = field(default_factory=lambda: {
        "after_claim_commit": 0.3, "after_dispatching_commit": 0.3, "after_send": 0.3,
        "before_receipt_commit": 0.3, "in_reconcile": 0.3})
    # per point: armed with kill%P at (re)starts until it killed so often (None: no limit)
    failpoint_kill_target: int | None = 3
    failpoint_pause_share: float = 0.6  # of the pauses, delivered at a failpoint
    retention_seconds: float = 20.0  # sim key retention == the provider's declared window
    # the dispatcher's dedup_safety_margin: it must exceed the longest pause between the
    # window check (at the dispatching commit) and the request's arrival (SIGSTOPs here
    # last up to 2.6 s, plus scheduling on a loaded host); see docs/reliability.md
    dedup_safety_margin: float = 0.5
    min_failpoint_hits: int = 0  # per point, checked before the work directory may go
    control: bool = False  # the sim ignores keys while the provider claims a window
    faketime: bool = True
    drain_timeout: float = 120.0  # seconds without an operation settled: see Runner._drain
    workdir: str | None = None
    keep: bool = False
    verbose: bool = False

    def command(self) -> str:
        flags = (f"--seed {self.seed} --dialect {self.dialect} --operations {self.operations}"
                 f" --fault-seconds {self.fault_seconds:g} --kills {self.kills}"
                 f" --pauses {self.pauses} --db-restarts {self.db_restarts}"
                 f" --lease-seconds {self.lease_seconds:g} --revocations {self.revocations}")
        return f"python -m tests.chaos.soak {flags}" + (" --control" if self.control else "")


# -- the schedule ----------------------------------------------------------------------------

@dataclass(order=True)
class Event:
    at: float
    kind: str
    arg: Any = None


def schedule(cfg: ChaosConfig) -> list[Event]:
    """The seeded fault schedule: a pure function of the configuration."""
    rng = random.Random(f"schedule:{cfg.seed}")
    d = cfg.fault_seconds
    events: list[Event] = []

    def spread(n: int, kind: str, make: Callable[[], Any], lo: float = 0.03) -> None:
        for _ in range(n):
            events.append(Event(rng.uniform(lo * d, 0.97 * d), kind, make()))

    # kills and pauses at an even cadence (jittered), rotating over the replica slots:
    # random offsets would bunch them, leaving every replica down at once for a while
    hits = ["kill"] * cfg.kills + ["pause"] * cfg.pauses
    rng.shuffle(hits)
    lo, hi = 0.03 * d, 0.97 * d
    step = (hi - lo) / max(1, len(hits))
    for i, kind in enumerate(hits):
        at = lo + step * (i + rng.uniform(0.1, 0.9))
        slot = i % cfg.replicas
        if kind == "kill":
            events.append(Event(at, "kill", (slot, rng.uniform(0.1, 0.3))))
        elif rng.random() < cfg.failpoint_pause_share:
            events.append(Event(at, "fp_pause", (slot, None)))
        else:
            events.append(Event(at, "pause", (slot, cfg.lease_seconds
                                               + rng.uniform(*cfg.pause_extra))))
    spread(cfg.prunes, "prune", lambda: None)
    spread(cfg.cancels, "cancel", rng.random)
    if cfg.approval_every:
        # revoke the approvals of one approval-requiring task; re-approve half of them later
        spread(cfg.revocations, "revoke", lambda: (rng.random(), rng.random() < 0.5))
    spread(cfg.sim_bursts, "sim", lambda: (
        rng.choice(["p_drop_after_apply", "p_5xx_before", "p_5xx_after", "p_429", "p_503",
                    "p_slow"]), rng.uniform(0.1, 0.3), rng.uniform(1.0, 3.0)))
    if cfg.dialect == "postgres":
        for i in range(cfg.db_restarts):  # evenly spread, jittered
            slot = d / (cfg.db_restarts + 1)
            events.append(Event(slot * (i + 1) + rng.uniform(-0.2, 0.2) * slot, "db_restart"))
        spread(cfg.pg_terminates, "pg_terminate", lambda: None)
        spread(cfg.proxy_faults, "proxy", lambda: (
            rng.choice(["delay", "blackhole", "reset", "drop_commit_reply"]),
            rng.uniform(0.5, 2.0)))
    return sorted(events)


# -- processes ---------------------------------------------------------------------------------

class Replica:
    """One ``outboxd run`` slot: restarted with a new generation (worker id) after a kill."""

    def __init__(self, index: int, config: Path, env: dict[str, str], workdir: Path) -> None:
        self.index = index
        self.config = config
        self.base_env = env
        self.workdir = workdir
        self.generation = 0
        self.proc: DaemonProcess | None = None
        self.paused_until: float | None = None
        self.dead_since: float | None = None
        self.restart_at: float | None = None
        self._ready = False
        self.armed: dict[str, str] = {}  # failpoint -> "kill" / "stop" for this generation
        self.fp_stopped = False  # stopped by a ``stop`` failpoint (until paused_until)
        self.control = workdir / f"failpoint-control-{index}"
        self.fp_pending: tuple[str, float] | None = None  # armed stop@1: point, deadline

    @property
    def worker_id(self) -> str:
        return f"r{self.index}g{self.generation}"

    def start(self, *, failpoints: str | None, seed: int, keep_stop: bool = False) -> None:
        """Start the next generation. ``keep_stop``: a failpoint stop armed in the old
        generation and not fired (it was killed first) is armed again in the new one."""
        self.armed = {}
        for part in filter(None, (failpoints or "").split(",")):
            name, _, action = part.partition("=")
            self.armed[name] = "stop" if action.startswith("stop") else "kill"
        self.fp_stopped = False
        pending = self.fp_pending if keep_stop else None
        if pending:
            self.arm_stop(pending[0], deadline=time.monotonic() + 6.0)
        else:
            self.arm_stop(None)
        self._close_log()
        self.generation += 1
        env = {**self.base_env, "OUTBOXD_DISPATCHER_WORKER_ID": self.worker_id,
               "OUTBOXD_FAILPOINT_SEED": f"{seed}:{self.index}:{self.generation}",
               "OUTBOXD_FAILPOINT_CONTROL": str(self.control)}
        if failpoints:
            env["OUTBOXD_FAILPOINTS"] = failpoints
        self.proc = DaemonProcess(self.config, env=env)
        self._ready = False
        self.paused_until = self.dead_since = self.restart_at = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def ready(self) -> bool:
        """Started up (its log says so) and still running: worth a fault."""
        if not self.alive():
            return False
        if not self._ready:
            assert self.proc is not None
            self._ready = "dispatcher started" in self.proc.log_text()
        return self._ready

    def kill(self) -> None:
        if self.proc is not None and self.proc.alive():
            self.proc.signal(signal.SIGKILL)
            self.proc.process.wait(timeout=10)  # type: ignore[union-attr]
        self.paused_until = None
        self.fp_stopped = False

    def pause(self) -> None:
        if self.alive():
            self.proc.signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.alive():
            self.proc.signal(signal.SIGCONT)  # type: ignore[union-attr]
        self.paused_until = None
        self.fp_stopped = False

    def arm_stop(self, name: str | None, *, deadline: float = 0.0) -> None:
        """Arm ``name=stop@1`` in the running process (``None``: disarm), atomically."""
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(f"{name}=stop@1\n" if name else "")
        tmp.replace(self.control)
        self.fp_pending = (name, deadline) if name else None

    def stopped(self) -> bool:
        """The process is in the stopped state (Linux ``/proc``; elsewhere: assume so)."""
        if not self.alive():
            return False
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()  # type: ignore[union-attr]
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def _close_log(self) -> None:
        if self.proc is not None and self.proc._log is not None:
            if self.proc.alive():
                return  # still writing (the caller kills it first)
            self.proc._log.close()
            self.proc._log = None

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                if self.proc.alive():
                    self.proc.signal(signal.SIGCONT)
                self.kill()
            self._close_log()


@dataclass
class AgentLog:
    ok: list[str] = field(default_factory=list)  # operation ids acknowledged committed
    failed: list[str] = field(default_factory=list)  # definitely not committed, gave up
    info: list[str] = field(default_factory=list)  # commit outcome unknown, gave up
    recovered_commits: int = 0  # an info commit later shown committed (revision conflict)
    fail_attempts: int = 0
    info_attempts: int = 0
    tasks: list[str] = field(default_factory=list)  # acknowledged task ids
    cancels: list[tuple[str, float]] = field(default_factory=list)  # task, ack wall time
    approval_tasks: list[str] = field(default_factory=list)  # acknowledged, approval needed
    revoked: list[tuple[str, int]] = field(default_factory=list)  # task, approvals revoked
    reapproved: list[tuple[str, int]] = field(default_factory=list)  # task, ops re-approved


class Agent(threading.Thread):
    """Commits tasks with their operations, paced to spread ``operations`` over ``seconds``;
    each commit is logged ok / fail / info and a failed or uncertain one is retried with
    the same ids (the outbox API is idempotent on them)."""

    def __init__(self, engine: Engine, cfg: ChaosConfig, seconds: float,
                 direct: Engine | None = None) -> None:
        super().__init__(name="chaos-agent", daemon=True)
        self.engine = engine
        # cancellations are issued from the nemesis thread, which must never block on a
        # blackholed proxy connection (only that thread ends the blackhole): direct path
        self.direct = direct or engine
        self.cfg = cfg
        self.seconds = seconds
        self.log = AgentLog()
        self.to_reapprove: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the runner
            self.error = exc

    def _run(self) -> None:
        per = self.cfg.ops_per_commit
        tasks = (self.cfg.operations + per - 1) // per
        t0 = time.monotonic()
        for t in range(tasks):
            if self.stop.is_set():
                return
            due = t0 + self.seconds * t / tasks
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            task_id = f"task-{t:06d}"
            n = min(per, self.cfg.operations - t * per)
            ops = [f"op-{t:06d}-{j:03d}" for j in range(n)]
            every = self.cfg.approval_every
            self._commit(task_id, ops, approval=bool(every) and t % every == every - 1)

    def _commit(self, task_id: str, ops: list[str], *, approval: bool = False) -> None:
        uncertain = False
        for attempt in range(40):
            if self.stop.is_set():
                break
            outcome = self._try(task_id, ops, retrying=attempt > 0, approval=approval)
            if outcome == "ok":
                self.log.ok.extend(ops)
                self.log.tasks.append(task_id)
                if approval:
                    self.log.approval_tasks.append(task_id)
                if uncertain:
                    self.log.recovered_commits += 1
                return
            if outcome == "info":
                uncertain = True
                self.log.info_attempts += 1
            else:
                self.log.fail_attempts += 1
            time.sleep(min(2.0, 0.05 * 2 ** min(attempt, 5)))
        (self.log.info if uncertain else self.log.failed).extend(ops)

    def _try(self, task_id: str, ops: list[str], *, retrying: bool, approval: bool) -> str:
        try:
            conn = self.engine.connect()
        except Exception:
            return "fail"
        try:
            try:
                trans = conn.begin()
                advance(
                    conn, task_id, tenant_id=TENANT, expected_revision=0, phase="staged",
                    operations=[StagedOperation(operation_id=o, provider=PROVIDER,
                                                payload={"op": o, "amount": i + 1},
                                                requires_approval=approval)
                                for i, o in enumerate(ops)],
                )
                for o in ops if approval else ():  # the agent approves in the same commit
                    approvals.approve(conn, tenant_id=TENANT, operation_id=o,
                                      actor="chaos-agent", reason="agent approval")
            except errors.RevisionConflict:
                # the task exists: an earlier "uncertain" commit did commit. The outbox
                # API is idempotent on operation ids, so the operations are there too.
                return "ok" if retrying else "fail"
            except Exception:
                return "fail"
            try:
                trans.commit()
            except Exception:
                return "info"
            return "ok"
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def cancel(self, fraction: float) -> None:
        """Cancel one acknowledged task (picked by ``fraction``) and log the ack time."""
        if not self.log.tasks:
            return
        task_id = self.log.tasks[int(fraction * len(self.log.tasks)) % len(self.log.tasks)]
        try:
            with self.direct.begin() as conn:
                cancel_task(conn, tenant_id=TENANT, task_id=task_id, actor="chaos-agent",
                            reason="nemesis")
        except Exception:
            return  # not acknowledged (maybe committed): no ack time, nothing to check
        # logged after the commit returned: the cancel was committed by then
        self.log.cancels.append((task_id, time.time()))

    def _task_ops(self, conn: Any, task_id: str) -> list[str]:
        return list(conn.execute(sa.text(
            "SELECT operation_id FROM outbox_operations WHERE tenant_id = :t AND task_id = :k"
            " ORDER BY operation_id"), {"t": TENANT, "k": task_id}).scalars())

    def revoke(self, fraction: float, *, again: bool = False) -> str | None:
        """Revoke the approvals of one acknowledged approval-requiring task (mid-flight:
        some of its operations are pending, some in flight, some applied). Returns the
        task when the revocation was acknowledged."""
        tasks = self.log.approval_tasks
        if not tasks:
            return None
        task_id = tasks[int(fraction * len(tasks)) % len(tasks)]
        n = 0
        try:
            with self.direct.begin() as conn:
                for op_id in self._task_ops(conn, task_id):
                    with contextlib.suppress(errors.ApprovalError):  # none left unrevoked
                        n += approvals.revoke(conn, tenant_id=TENANT, operation_id=op_id,
                                              actor="chaos-nemesis", reason="revoked mid-flight")
        except Exception:
            return None
        self.log.revoked.append((task_id, n))
        if again:
            self.to_reapprove.append(task_id)
        return task_id

    def reapprove(self) -> None:
        """Approve the oldest revoked-to-be-re-approved task's unfinished operations again
        (the blocked ones requeued)."""
        if not self.to_reapprove:
            return
        task_id = self.to_reapprove.pop(0)
        n = 0
        try:
            with self.direct.begin() as conn:
                for op_id in self._task_ops(conn, task_id):
                    with contextlib.suppress(errors.ApprovalError):  # finished meanwhile
                        approvals.approve(conn, tenant_id=TENANT, operation_id=op_id,
                                          actor="chaos-nemesis", reason="re-approved")
                        n += 1
        except Exception:
            return
        self.log.reapproved.append((task_id, n))


# -- the run -----------------------------------------------------------------------------------

class Admin(threading.Thread):
    """Runs the agent's and operator's own writes the nemesis issues (cancel, revoke,
    re-approve) one after another, off the nemesis thread: such a write may wait on a row
    lock held by a replica the nemesis has SIGSTOPped, and only the nemesis thread ends
    that pause."""

    def __init__(self) -> None:
        super().__init__(name="chaos-admin", daemon=True)
        self.jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue()

    def submit(self, job: Callable[[], Any]) -> None:
        self.jobs.put(job)

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            with contextlib.suppress(Exception):  # each job logs only what was acknowledged
                job()

    def finish(self, timeout: float) -> None:
        self.jobs.put(None)
        self.join(timeout=timeout)


@dataclass
class Kill:
    at: float
    worker: str
    leased: list[str]
    by: str  # "nemesis" or the failpoint name


class Runner:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"runner:{cfg.seed}")
        base = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="outboxd-chaos-"))
        base.mkdir(parents=True, exist_ok=True)
        self.dir = base
        self.fp_log = base / "failpoints.log"
        self.cluster: Any = None
        self.proxy: FaultProxy | None = None
        self.sim: SimProcess | None = None
        self.replicas: list[Replica] = []
        self.kills: list[Kill] = []
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self.admin_dsn = ""
        self._sim_restore: list[tuple[float, str]] = []
        self._proxy_restore_at: float | None = None
        self._deferred: list[Event] = []
        self._t0 = 0.0  # monotonic start of the fault phase
        self._admin = Admin()
        self._fp_offset = 0  # bytes of the failpoint log already read
        self._db_thread: threading.Thread | None = None
        self.db_downtime: list[float] = []

    def say(self, text: str) -> None:
        if self.cfg.verbose:
            print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def bump(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    # -- set-up ------------------------------------------------------------------------------
    def _database(self) -> tuple[str, str]:
        """(URL for the dispatchers and the agent, URL for the checker)."""
        if self.cfg.dialect == "sqlite":
            url = f"sqlite:///{self.dir / 'outbox.db'}"
            engine = db.create_engine(url)
            migrate.upgrade(engine)
            engine.dispose()
            return url, url
        from tests.support.pgcluster import ThrowawayCluster

        self.cluster = ThrowawayCluster(self.dir / "pg")
        self.cluster.start()
        self.admin_dsn = self.cluster.dsn("postgres")
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE outbox")
        direct = self.cluster.url("outbox")
        engine = db.create_engine(direct)
        migrate.upgrade(engine)
        engine.dispose()
        self.proxy = FaultProxy("127.0.0.1", self.cluster.port)
        proxied = f"postgresql+psycopg://postgres@127.0.0.1:{self.proxy.port}/outbox"
        return proxied, direct

    _sim_baseline: dict[str, float] = {
        "p_drop_after_apply": 0.01, "p_5xx_before": 0.005, "p_5xx_after": 0.005,
        "p_429": 0.005, "p_503": 0.0, "p_slow": 0.003}

    def _sim_args(self) -> list[str]:
        args = ["--seed", str(self.cfg.seed), "--retention-seconds",
                f"{self.cfg.retention_seconds:g}", "--enforce-fencing",
                "--slow-seconds", "1.5", "--retry-after", "0.3"]
        for name, p in self._sim_baseline.items():
            args += ["--" + name.replace("_", "-"), f"{p:g}"]
        if self.cfg.control:  # many lost responses: re-sends a keyless receiver duplicates
            args += ["--ignore-keys", "--p-drop-after-apply", "0.1"]
        return args

    def _start(self, r: Replica, *, armed: bool = True) -> None:
        r.armed = {}  # the old generation's arming ends with it
        r.start(failpoints=self._failpoint_spec() if armed else None, seed=self.cfg.seed,
                keep_stop=armed)

    def _armed_count(self, name: str, action: str) -> int:
        return sum(1 for r in self.replicas if r.alive() and r.armed.get(name) == action)

    def _failpoint_spec(self) -> str:
        """What one (re)start arms: ``kill%P`` on the point killed least so far (points
        rotate, so a crash at every step of the protocol happens), until each point
        killed ``failpoint_kill_target`` times (bounded restart cost)."""
        kill_target = self.cfg.failpoint_kill_target
        fired = failpoint_log(self.fp_log)
        kills = {n: fired.get((n, "kill"), 0) + self._armed_count(n, "kill")
                 for n, p in self.cfg.failpoint_p.items() if p}
        candidates = [n for n, k in kills.items() if kill_target is None or k < kill_target]
        if not candidates:
            return ""
        name = min(candidates, key=lambda n: (kills[n], self.rng.random()))
        return f"{name}=kill%{self.cfg.failpoint_p[name]:g}"

    def _stop_point(self) -> str:
        """The point a failpoint pause goes to: the one hit least so far (counting the
        stops armed and not yet fired)."""
        hits = failpoint_hits(self.fp_log)
        pending = [r.fp_pending[0] for r in self.replicas if r.fp_pending]
        return min(FAILPOINTS, key=lambda n: (hits.get(n, 0) + pending.count(n),
                                              self.rng.random()))

    def _failpoint_stops(self, now: float) -> None:
        """New ``stop`` firings in the failpoint log: the replica SIGSTOPped itself at
        that point; resume it once its lease has passed (as for a nemesis pause)."""
        try:
            with self.fp_log.open("rb") as fh:
                fh.seek(self._fp_offset)
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._fp_offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) != 3 or parts[1] != "stop":
                continue
            name, pid = parts[0], int(parts[2])
            for r in self.replicas:
                if r.proc is not None and r.proc.process is not None and r.proc.pid == pid:
                    r.armed.pop(name, None)
                    if r.fp_pending and r.fp_pending[0] == name:
                        r.fp_pending = None
                    r.fp_stopped = True
                    r.paused_until = now + self.cfg.lease_seconds + self.rng.uniform(
                        *self.cfg.pause_extra)
                    self.bump("failpoint_stop")

    # -- main ----------------------------------------------------------------------------------
    def run(self) -> Report:
        cfg = self.cfg
        started = time.monotonic()
        try:
            url, check_url = self._database()
            self.sim = SimProcess(self.dir, *self._sim_args())
            retention = 86_400 if cfg.control else cfg.retention_seconds
            provider = http_provider(self.sim, dedup_retention_seconds=retention,
                                     timeout_seconds=1, in_flight_seconds=2.5, max_attempts=10,
                                     retry_max_delay_seconds=RETRY_MAX_DELAY_SECONDS)
            env = {"OUTBOXD_FAILPOINT_LOG": str(self.fp_log), "OUTBOXD_LOG_LEVEL": "WARNING"}
            for i in range(cfg.replicas):
                rurl = url if cfg.dialect == "sqlite" else f"{url}?application_name=outboxd-r{i}"
                conf = write_config(
                    self.dir, rurl, {PROVIDER: provider},
                    dispatcher={"lease_seconds": cfg.lease_seconds, "batch_size": 50,
                                "dedup_safety_margin": cfg.dedup_safety_margin,
                                "concurrency": 16, "shutdown_grace_seconds": 1,
                                "poll_interval_ms": 50},
                    name=f"replica-{i}.toml")
                renv = dict(env)
                if (i == cfg.replicas - 1 and cfg.faketime and cfg.dialect == "postgres"
                        and Path(FAKETIME_LIB).exists()):
                    # a skewed clock: only the database clock may decide leases
                    renv.update({"LD_PRELOAD": FAKETIME_LIB, "FAKETIME": "+10m",
                                 "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
                    self.bump("faketime_replicas")
                self.replicas.append(Replica(i, conf, renv, self.dir))
            for r in self.replicas:
                self._start(r)
            deadline = time.monotonic() + 120
            while not all(r.ready() for r in self.replicas):
                if time.monotonic() > deadline:
                    raise RuntimeError("replicas did not start: " + " | ".join(
                        (r.proc.log_text()[-500:] if r.proc else "") for r in self.replicas))
                for r in self.replicas:  # a failpoint may fire during start-up recovery
                    if not r.alive():
                        self._start(r)
                time.sleep(0.1)
            agent_engine = db.create_engine(url, pool_size=2)
            check_engine = db.create_engine(check_url)
            # the nemesis thread's own reads (leases of a killed replica, progress, the
            # drain): on SQLite never ``BEGIN IMMEDIATE``, which would wait on the write
            # lock of a replica this very thread has SIGSTOPped
            read_engine = (sa.create_engine(check_url) if cfg.dialect == "sqlite"
                           else check_engine)
            agent = Agent(agent_engine, cfg, seconds=cfg.fault_seconds * 0.85,
                          direct=check_engine)
            agent.start()
            self._admin.start()
            self._faults(schedule(cfg), agent, read_engine)
            agent.join(timeout=cfg.fault_seconds + 120)
            agent.stop.set()
            if agent.error is not None:
                self.errors.append("agent crashed: " + "".join(
                    traceback.format_exception(agent.error))[-2000:])
            fault_end = time.monotonic()
            drained = self._drain(read_engine)
            drain_seconds = time.monotonic() - fault_end
            time.sleep(0.5)
            stats = self.sim.stats()
            report = check(check_engine, stats, agent.log, self.fp_log,
                           budget=10, control=cfg.control, effect_log=self.sim.effects())
            report.figures.update(rto_figures(check_engine, self.kills))
            forbidden = forbidden_moves(check_url)
            report.figures["forbidden_moves"] = len(forbidden)
            report.require(not forbidden, f"moves the transition table forbids: {forbidden}")
            report.figures["drained"] = drained
            report.figures["setup_seconds"] = round(self._t0 - started, 1)
            report.figures["fault_phase_seconds"] = round(fault_end - self._t0, 1)
            report.figures["drain_seconds"] = round(drain_seconds, 1)
            report.figures["run_seconds"] = round(time.monotonic() - started, 1)
            report.figures["nemesis"] = dict(sorted(self.counts.items()))
            report.figures["db_restart_seconds"] = self.db_downtime
            report.figures["kills_and_pauses"] = (self.counts.get("kill", 0)
                                                  + self.counts.get("pause", 0)
                                                  + report.failpoint_kills())
            if self.proxy is not None:
                report.figures["proxy"] = self.proxy.stats()
            report.errors.extend(self.errors)
            for name in FAILPOINTS if cfg.min_failpoint_hits else ():
                hits = report.failpoint_hits.get(name, 0)
                report.require(hits >= cfg.min_failpoint_hits,
                               f"failpoint {name} fired {hits} < {cfg.min_failpoint_hits} times")
            report.seed = cfg.seed
            report.command = cfg.command()
            report.workdir = str(self.dir)
            agent_engine.dispose()
            check_engine.dispose()
            read_engine.dispose()
            return report
        finally:
            self._teardown()

    def _faults(self, events: list[Event], agent: Agent, engine: Engine) -> None:
        t0 = self._t0 = time.monotonic()
        pending = list(events)
        end = t0 + self.cfg.fault_seconds
        next_progress = t0
        while True:
            now = time.monotonic()
            self._supervise(now, engine)
            if self.cfg.verbose and now >= next_progress:
                next_progress = now + 5.0
                self._progress(engine)
            if not pending and now >= end:
                break
            while pending and pending[0].at <= now - t0:
                ev = pending.pop(0)
                try:
                    self._apply(ev, agent, engine)
                except Exception as exc:
                    self.errors.append(f"nemesis {ev.kind} failed: {type(exc).__name__}: {exc}")
            if self._deferred:
                pending = sorted(pending + self._deferred)
                self._deferred = []
            time.sleep(0.02)
        if self._db_thread is not None:
            self._db_thread.join(timeout=120)
        # faults stop: restore everything
        self._restore_all(now=float("inf"))
        self._admin.finish(timeout=120)

    def _supervise(self, now: float, engine: Engine) -> None:
        self._failpoint_stops(now)
        for r in self.replicas:
            if r.fp_pending and now >= r.fp_pending[1] and r.alive():
                r.arm_stop(None)  # never passed there in time (idle, or busy elsewhere)
                self.bump("failpoint_pause_missed")
            if r.paused_until is not None and now >= r.paused_until:
                if r.fp_stopped and r.alive() and not r.stopped():
                    continue  # logged, not yet stopped: a SIGCONT now would be lost
                r.resume()
            if not r.alive():
                if r.dead_since is None:
                    # died on its own: a failpoint kill (or a crash: see its log)
                    r.dead_since = now
                    r.paused_until = None
                    r.fp_stopped = False
                    r.restart_at = now + self.rng.uniform(0.1, 0.4)
                    code = r.proc.process.poll() if r.proc and r.proc.process else None
                    text = r.proc.log_text()[-3000:] if r.proc else ""
                    if code == 1 and "OperationalError" in text:
                        # start-up with the database down: `outboxd run` exits 1 (its
                        # supervisor restarts it); counted, not a failure of the run
                        self.bump("startup_exit_db_unavailable")
                        r.restart_at = now + 0.5
                        continue
                    if code != -signal.SIGKILL:
                        self.errors.append(f"replica {r.worker_id} exited {code}:"
                                           f" {r.proc.log_text()[-1500:] if r.proc else ''}")
                    self._record_kill(r, engine, by="failpoint")
                if r.restart_at is not None and now >= r.restart_at:
                    self._start(r)
                    self.bump("restart")
        self._restore_all(now)

    def _restore_all(self, now: float) -> None:
        if self._proxy_restore_at is not None and now >= self._proxy_restore_at:
            assert self.proxy is not None
            self.proxy.set_mode("forward")
            self._proxy_restore_at = None
        keep = []
        for at, name in self._sim_restore:
            if now >= at and self.sim is not None:
                with contextlib.suppress(Exception):
                    self.sim.control(**{name: self._sim_baseline.get(name, 0.0)})
            else:
                keep.append((at, name))
        self._sim_restore = keep
        if now == float("inf"):
            for r in self.replicas:
                r.resume()

    def _db_restart(self, down: float) -> None:
        """Immediate shutdown (crash recovery on the next start), then start again; in a
        thread so pauses still end on time meanwhile."""
        assert self.cluster is not None
        t = time.monotonic()
        try:
            self.cluster.immediate_shutdown()
            time.sleep(down)
            self.cluster.start()
        except Exception as exc:
            self.errors.append(f"database restart failed: {exc}")
        self.db_downtime.append(round(time.monotonic() - t, 2))

    def _progress(self, engine: Engine) -> None:
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text(
                    "SELECT status, count(*) FROM outbox_operations GROUP BY status")).all()
            self.say("statuses " + " ".join(f"{s}={n}" for s, n in sorted(rows)))
        except Exception as exc:
            self.say(f"statuses unavailable: {type(exc).__name__}")

    def _target(self, index: int, *, kind: str = "") -> Replica | None:
        """The scheduled replica if it is running, else the next one that is."""
        n = len(self.replicas)
        # first pass: spare a replica with a failpoint stop armed and not yet fired (a
        # kill or pause now would waste it); second pass: any (never two stops at once)
        for spare in (True, False):
            for k in range(n):
                r = self.replicas[(index + k) % n]
                if r.fp_pending and (spare or kind == "fp_pause"):
                    continue
                if r.ready() and r.paused_until is None and r.dead_since is None:
                    return r
        return None

    def _record_kill(self, r: Replica, engine: Engine, *, by: str) -> None:
        at = time.time()
        leased: list[str] = []
        try:
            with engine.connect() as conn:
                leased = list(conn.execute(sa.text(
                    "SELECT operation_id FROM outbox_operations WHERE lease_owner = :w"
                    " AND status IN ('claimed', 'dispatching')"), {"w": r.worker_id}).scalars())
        except Exception:
            self.bump("kill_lease_query_failed")
        self.kills.append(Kill(at, r.worker_id, leased, by))

    def _apply(self, ev: Event, agent: Agent, engine: Engine) -> None:
        self.say(f"{ev.kind} {ev.arg}")
        now = time.monotonic()
        if ev.kind in ("kill", "pause", "fp_pause"):
            r = self._target(ev.arg[0], kind=ev.kind)
            if r is None:  # every replica is down or paused: try again shortly
                ev.at = now - self._t0 + 0.3
                self._deferred.append(ev)
                return
        if ev.kind == "kill":
            restart_after = ev.arg[1]
            r.kill()
            self.bump("kill")
            r.dead_since = now
            r.restart_at = now + restart_after
            self._record_kill(r, engine, by="nemesis")
        elif ev.kind == "fp_pause":
            # resumed by _failpoint_stops once it fired; disarmed if it does not in 6 s
            r.arm_stop(self._stop_point(), deadline=now + 6.0)
            self.bump("failpoint_pause_armed")
        elif ev.kind == "pause":
            seconds = ev.arg[1]
            r.pause()
            r.paused_until = now + seconds
            self.bump("pause")
        elif ev.kind == "db_restart":
            if self._db_thread is not None and self._db_thread.is_alive():
                ev.at = now - self._t0 + 1.0
                self._deferred.append(ev)
                return
            down = self.rng.uniform(0.3, 1.0)
            self._db_thread = threading.Thread(target=self._db_restart, args=(down,),
                                               name="chaos-db-restart", daemon=True)
            self._db_thread.start()
            self.bump("db_restart")
        elif ev.kind == "pg_terminate":
            if self._db_thread is not None and self._db_thread.is_alive():
                self.bump("pg_terminate_skipped_db_restarting")
                return
            with psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=5) as conn:
                n = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = 'outbox' AND application_name LIKE 'outboxd-r%'"
                ).fetchone()
            self.bump("pg_terminate")
            self.bump("pg_terminated_backends", int(n[0]) if n else 0)
        elif ev.kind == "proxy":
            assert self.proxy is not None
            mode, seconds = ev.arg
            if mode == "reset":
                self.proxy.reset_all()
            else:
                self.proxy.set_mode(mode, seconds=0.05 if mode == "delay" else 0.0)
                self._proxy_restore_at = now + seconds
            self.bump(f"proxy_{mode}")
        elif ev.kind == "sim":
            assert self.sim is not None
            name, p, seconds = ev.arg
            self.sim.control(**{name: p})
            self._sim_restore.append((now + seconds, name))
            self.bump(f"sim_{name}")
        elif ev.kind == "prune":
            assert self.sim is not None
            # forget keys past the declared retention only: the receiver honours its window
            self.bump("pruned_keys", self.sim.prune(all_keys=False))
            self.bump("prune")
        elif ev.kind == "cancel":
            fraction = ev.arg
            self._admin.submit(lambda: agent.cancel(fraction))
            self.bump("cancel")
        elif ev.kind == "revoke":
            fraction, again = ev.arg
            self._admin.submit(lambda: agent.revoke(fraction, again=again))
            self.bump("revoke")
            if again:
                self._deferred.append(Event(now - self._t0 + self.rng.uniform(1.0, 3.0),
                                            "reapprove"))
        elif ev.kind == "reapprove":
            self._admin.submit(agent.reapprove)
            self.bump("reapprove")

    def _drain(self, engine: Engine) -> bool:
        """Faults off; every replica restarted without failpoints; wait until no operation
        is pending, leased or unknown — on that state, not on the clock: the drain fails
        when no operation has settled for ``drain_timeout`` seconds (a stuck drain), or
        after :data:`DRAIN_CAP` times that in all. A slow host settles the same operations
        later (lease expiries under load leave more of them ``unknown`` for reconciliation
        to look up), and the run must not fail for that alone."""
        assert self.sim is not None
        self.sim.control(p_drop_after_apply=0.0, p_5xx_before=0.0, p_5xx_after=0.0,
                         p_429=0.0, p_503=0.0, p_slow=0.0)
        if self.proxy is not None:
            self.proxy.set_mode("forward")
        for r in self.replicas:
            r.kill()
            self._start(r, armed=False)
        started = time.monotonic()
        cap = started + DRAIN_CAP * self.cfg.drain_timeout
        deadline = started + self.cfg.drain_timeout
        fewest: int | None = None
        while time.monotonic() < min(deadline, cap):
            try:
                with engine.connect() as conn:
                    left = conn.execute(sa.text(
                        "SELECT count(*) FROM outbox_operations WHERE status IN"
                        " ('pending', 'claimed', 'dispatching', 'unknown')")).scalar_one()
                if left == 0:
                    return True
                if fewest is None or left < fewest:  # settling: wait on
                    fewest = left
                    deadline = time.monotonic() + self.cfg.drain_timeout
            except Exception:
                pass
            if self.cfg.verbose and time.monotonic() % 5 < 0.25:
                self._progress(engine)
            for r in self.replicas:
                if not r.alive():
                    self.errors.append(f"replica {r.worker_id} died during the drain:"
                                       f" {r.proc.log_text()[-1500:] if r.proc else ''}")
                    self._start(r, armed=False)
            time.sleep(0.25)
        return False

    def _teardown(self) -> None:
        for r in self.replicas:
            r.close()
        if self.sim is not None:
            with contextlib.suppress(Exception):
                self.sim.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                shutil.copy(self.cluster.logfile, self.dir / "postgresql.log")
            with contextlib.suppress(Exception):
                self.cluster.cleanup()


def run(cfg: ChaosConfig) -> Report:
    """One seeded nemesis run; the returned report says whether the invariants held."""
    report = Runner(cfg).run()
    report.config = asdict(cfg)
    if report.ok and not cfg.keep and report.workdir and not cfg.workdir:
        shutil.rmtree(report.workdir, ignore_errors=True)
    return report


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10, check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
                               check=False)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def dump(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str)


__all__ = ["ChaosConfig", "Event", "Runner", "dump", "git_commit", "run", "schedule"]
