"""The ``outboxd run`` process's garbage collector after start-up (``settle_heap``): what
start-up built is frozen out of later collections and the youngest generation is collected
less often. Run in a child interpreter: the test process's collector is left as it is."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json
from dispatcher.daemon import YOUNG_COLLECTION_THRESHOLD, settle_heap
before = gc.get_threshold()
settle_heap()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "young": YOUNG_COLLECTION_THRESHOLD}))
"""


def test_settle_heap_freezes_start_up_and_collects_the_young_less_often() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          check=True, timeout=60)
    got = json.loads(done.stdout)
    assert got["frozen"] > 10_000  # the modules and objects start-up made
    assert got["after"] == [got["young"], got["before"][1], got["before"][2]]
    assert got["young"] > got["before"][0]

