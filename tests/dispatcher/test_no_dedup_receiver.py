"""A receiver that does not deduplicate at all (``dedup_retention_seconds = 0``, the sim
with ``--ignore-keys``): every same-key re-send would be a second effect. Responses are
dropped after applying and some requests outlive the client timeout; every ambiguous
attempt goes through look-up, none is re-sent, and there are no duplicates."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    all_status,
    assert_once_each,
    attempts_of,
    both,
    config,
    engine_at,
    events_of,
    stage,
    url_for,
)
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.sim import SimProcess

N = 30
SIM = (
    "--ignore-keys", "--seed", "6",
    "--p-drop-after-apply", "0.3",
    "--p-slow", "0.3", "--slow-seconds", "1.6",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dialect", both())
def test_every_ambiguous_attempt_is_reconciled_never_resent(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _every_ambiguous_attempt_is_reconciled_never_resent(engine, db_url, tmp_path)


def _every_ambiguous_attempt_is_reconciled_never_resent(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    ids = stage(engine, N)
    with SimProcess(tmp_path, *SIM) as sim:
        cfg = config(
            tmp_path, db_url, sim, lease_seconds=5,
            dedup_retention_seconds=0, timeout_seconds=1, in_flight_seconds=2.5,
        )  # fmt: skip
        with DaemonProcess(cfg):
            wait_until(all_status(engine, "applied", N), timeout=40, message="all applied")
        stats = sim.stats()
        assert_once_each(sim, ids)
        assert stats["faults"].get("drop_after_apply", 0) > 0
        assert stats["faults"].get("slow", 0) > 0

    attempts = attempts_of(engine)
    ambiguous = [a for a in attempts if a["result_class"] == "ambiguous"]
    assert ambiguous, "the faults produced no ambiguous outcome"
    # a request is only ever sent again after a look-up said "not applied"
    events = events_of(engine)
    requeued = Counter(
        e["operation_id"] for e in events if e["kind"] == "reconciliation"
        and e["to_status"] == "pending"
    )  # fmt: skip
    sent = Counter(a["operation_id"] for a in attempts)
    assert all(sent[o] == 1 + requeued[o] for o in ids), (sent, requeued)
    assert stats["requests"] == len(attempts)
    for a in ambiguous:
        after = [
            (e["from_status"], e["to_status"], e["reason"])
            for e in events
            if e["operation_id"] == a["operation_id"] and e["from_status"] == "dispatching"
        ]
        assert ("dispatching", "unknown", "ambiguous_receiver_does_not_deduplicate") in after
    print(
        "\nno-dedup:",
        {
            "ambiguous": len(ambiguous),
            "requeued": sum(requeued.values()),
            "faults": stats["faults"],
        },
    )
