"""Adversarial payloads as a hypothesis property, inserted by plain SQL on both dialects
while a real ``outboxd run`` dispatches (see :mod:`tests.chaos.adversarial`): the daemon
keeps running and exits 0, each row is refused at INSERT, parked with its reason and never
sent, or applied once; undecodable rows are parked ``payload_undecodable``; good rows are
applied once. ``CHAOS_ADVERSARIAL_EXAMPLES`` sets the number of examples."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.adversarial import Run, property_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
EXAMPLES = int(os.environ.get("CHAOS_ADVERSARIAL_EXAMPLES", "40"))


def test_adversarial_payloads_never_halt_dispatch(db_url: str, tmp_path: Path) -> None:
    run = Run(db_url, tmp_path)
    try:
        property_run(run, EXAMPLES)
    finally:
        code = run.close()
    f = run.figures
    print(f"\n{f.summary(run.engine.dialect.name)}; daemon exit code {code}")
    assert code == 0
    assert not f.problems, f.problems
    assert f.refused > 0 and f.good_applied == f.examples  # the door held; good rows went
    assert f.parked.get("payload_undecodable", 0) > 0 or run.engine.dialect.name != "sqlite"
