"""Two replicas on PostgreSQL draining 2,000 operations against a faulty receiver, one
of them SIGKILLed mid-run and replaced: everything settles, every effect exists exactly
once, and the records show no operation was ever driven under two live leases."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    assert_once_each,
    attempts_of,
    config,
    events_of,
    fencing_monotonic,
    operations,
    rows,
    stage,
)
from tests.support.daemon import DaemonProcess, status_counts, wait_until
from tests.support.sim import SimProcess

N = 2000
FAULTS = (
    "--seed", "2000",
    "--p-drop-after-apply", "0.1",
    "--p-5xx-before", "0.025",
    "--p-5xx-after", "0.025",
    "--p-429", "0.05",
    "--retry-after", "0.2",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.postgres
def test_two_replicas_with_a_kill_apply_everything_exactly_once(
    pg_url: str, tmp_path: Path
) -> None:
    from tests.dispatcher import engine_for

    engine: Engine = engine_for(pg_url)
    try:
        _run(engine, pg_url, tmp_path)
    finally:
        engine.dispose()


def _run(engine: Engine, pg_url: str, tmp_path: Path) -> None:
    ids = stage(engine, N, per_task=500)
    with SimProcess(tmp_path, *FAULTS) as sim:

        def cfg(worker: str) -> Path:
            return config(
                tmp_path,
                pg_url,
                sim,
                lease_seconds=2.0,
                worker_id=worker,
                name=f"{worker}.toml",
                dispatcher={"batch_size": 100, "concurrency": 32, "log_level": "WARNING"},
            )

        def leased_by_a() -> bool:
            found = rows(
                engine,
                "SELECT count(*) AS n FROM outbox_operations WHERE lease_owner = 'replica-a'"
                " AND status IN ('claimed', 'dispatching')",
            )
            return int(found[0]["n"]) > 0

        a = DaemonProcess(cfg("replica-a"))
        b = DaemonProcess(cfg("replica-b"))
        a2 = None
        try:
            # kill A while both are busy and A holds leases; a replacement starts later
            wait_until(
                lambda: status_counts(engine).get("applied", 0) >= N // 4 and leased_by_a(),
                timeout=60,
                interval=0.02,
                message="a quarter applied, A holding leases",
            )
            a.kill()
            a2 = DaemonProcess(cfg("replica-a2"))
            wait_until(
                lambda: status_counts(engine) == {"applied": N},
                timeout=120,
                interval=0.25,
                message=f"all {N} applied (now {status_counts(engine)})",
            )
            assert b.alive() and a2.alive()
        finally:
            for d in (a, b, a2):
                if d is not None:
                    d.__exit__(None, None, None)
        stats = sim.stats()
        assert_once_each(sim, ids)

    ops = operations(engine)
    attempts = attempts_of(engine)
    events = events_of(engine)
    # no two live leases: per operation, claim tokens strictly increase in event order
    # and the attempts' tokens never go down by attempt number
    assert fencing_monotonic(engine) == []
    # every attempt the row counted is in the records (recovery writes the lost ones)
    per_op = Counter(x["operation_id"] for x in attempts)
    assert all(per_op[o] == ops[o]["attempts"] for o in ids)
    # the receiver saw no more requests than the records account for
    assert stats["requests"] <= len(attempts)

    fenced = sum(1 for x in attempts if (x["evidence"] or {}).get("fenced"))
    reconciled = [e for e in events if e["kind"] == "reconciliation"]
    lost_leases = [e for e in events if e["reason"] == "lease_expired"]
    print(
        "\nreplicas:",
        {
            "operations": N,
            "kills": 1,
            "requests": stats["requests"],
            "faults": stats["faults"],
            "receiver_replays": stats["replays"],
            "duplicates": stats["duplicates"],
            "lost": N - sum(1 for o in ids if stats["effects_per_key"].get(f"t1:{o}")),
            "attempts": len(attempts),
            "lease_expirations": len(lost_leases),
            "unknown_resolved": Counter(e["to_status"] for e in reconciled),
            "fenced_outcomes": fenced,
        },
    )
