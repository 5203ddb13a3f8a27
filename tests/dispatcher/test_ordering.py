"""Operations sharing an ``ordering_key`` are dispatched one at a time, in insertion
order, even when some of them need retries; different keys proceed independently."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from outbox.api import StagedOperation, advance
from tests.dispatcher import (
    all_status,
    assert_once_each,
    config,
    events_of,
    key_of,
    sim_order,
)
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.sim import SimProcess

KEYS = 3
PER_KEY = 8
SIM = ("--seed", "11", "--p-503", "0.2", "--p-drop-after-apply", "0.1", "--retry-after", "0")


@pytest.mark.slow
def test_same_ordering_key_is_applied_one_at_a_time_in_insertion_order(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    groups: dict[str, list[str]] = {f"k{g}": [] for g in range(KEYS)}
    with engine.begin() as conn:  # interleaved across keys, one transition
        staged = []
        for i in range(KEYS * PER_KEY):
            group = f"k{i % KEYS}"
            op_id = f"{group}-{i:03d}"
            groups[group].append(op_id)
            staged.append(
                StagedOperation(
                    operation_id=op_id, provider="sim", payload={"i": i}, ordering_key=group
                )
            )
        advance(conn, "ordered", tenant_id="t1", expected_revision=0, operations=staged)
    total = KEYS * PER_KEY
    with SimProcess(tmp_path, *SIM) as sim:
        cfg = config(tmp_path, db_url, sim, lease_seconds=5)
        with DaemonProcess(cfg):
            wait_until(all_status(engine, "applied", total), timeout=40, message="applied")
        all_ids = [o for ids in groups.values() for o in ids]
        assert_once_each(sim, all_ids)
        order = sim_order(sim)
        assert sim.stats()["faults"].get("503", 0) > 0  # retries happened

    events = events_of(engine)
    for group, ids in groups.items():
        keys = [key_of(o) for o in ids]
        # the receiver applied them in insertion order
        assert [k for k in order if k in set(keys)] == keys, group
        # one at a time: each is first claimed only after the previous one was applied
        for earlier, later in itertools.pairwise(ids):
            applied = max(
                e["id"] for e in events
                if e["operation_id"] == earlier and e["to_status"] == "applied"
            )  # fmt: skip
            claimed = min(
                e["id"] for e in events
                if e["operation_id"] == later and e["to_status"] == "claimed"
            )  # fmt: skip
            assert applied < claimed, (earlier, later)
