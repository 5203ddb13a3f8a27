"""Bad input at volume (CI size): a few thousand rows written by plain SQL, malformed ones
mixed with good ones, dispatched by real ``outboxd run`` replicas on a real database.

Asserted: no replica crashes; every malformed row the database accepted is parked with
its reason and never reaches the receiver; every good row is applied exactly once. The
soak size is ``python -m tests.chaos.badinput --rows 100000 --compare`` (see
docs/reliability.md). ``CHAOS_BAD_INPUT_ROWS`` and ``CHAOS_BAD_INPUT_SEED`` override the
size and the seed (not ``OUTBOXD_*`` names: the conftest clears those); a failure prints
the seed and the command that replays it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.badinput import KINDS, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROWS = int(os.environ.get("CHAOS_BAD_INPUT_ROWS", "5000"))
SEED = int(os.environ.get("CHAOS_BAD_INPUT_SEED", "20240604"))


def test_bad_input_at_volume(db_url: str, tmp_path: Path) -> None:
    result = run(db_url, rows=ROWS, seed=SEED, workdir=tmp_path)
    print(result.summary())
    assert not result.problems, "\n" + result.summary()
    dialect = result.dialect
    refused = sum(1 for k in KINDS if k.expected(dialect) == "refused")
    assert refused and result.refused >= refused, result.summary()  # the door held
    assert result.bad_parked > 0 and result.good > 0, result.summary()
    assert result.inserted == result.good + result.bad_parked, result.summary()
