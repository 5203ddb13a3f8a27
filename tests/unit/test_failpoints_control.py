"""``OUTBOXD_FAILPOINT_CONTROL``: a harness re-arms a running process through a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import REPO_ROOT

SCRIPT = """
import os, sys
from dispatcher.engine import failpoints
control = sys.argv[1]
failpoints.hit("after_send")             # nothing armed yet
failpoints.hit("after_claim_commit")     # armed from the environment on its 2nd hit only
with open(control + ".tmp", "w") as fh:
    fh.write("after_send=exit@1")
os.replace(control + ".tmp", control)
print("armed", flush=True)
failpoints.hit("after_claim_commit")     # the environment's point is still armed: fires
print("not reached", flush=True)
"""


def test_control_file_arms_on_top_of_the_environment(tmp_path: Path) -> None:
    control, log = tmp_path / "control", tmp_path / "fp.log"
    env = {**os.environ, "OUTBOXD_FAILPOINT_CONTROL": str(control),
           "OUTBOXD_FAILPOINT_LOG": str(log), "OUTBOXD_FAILPOINTS": "after_claim_commit=exit@2"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(control)], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 3, out.stderr
    assert out.stdout.split() == ["armed"]
    assert log.read_text().split()[:2] == ["after_claim_commit", "exit"]


def test_control_file_change_fires_on_the_next_pass(tmp_path: Path) -> None:
    control, log = tmp_path / "control", tmp_path / "fp.log"
    script = SCRIPT.replace('failpoints.hit("after_claim_commit")     # the environment',
                            'failpoints.hit("after_send")     # the environment')
    env = {**os.environ, "OUTBOXD_FAILPOINT_CONTROL": str(control),
           "OUTBOXD_FAILPOINT_LOG": str(log)}
    env.pop("OUTBOXD_FAILPOINTS", None)
    out = subprocess.run([sys.executable, "-c", script, str(control)], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 3, out.stderr  # after_send had 1 hit before: the count restarted
    assert log.read_text().split()[:2] == ["after_send", "exit"]
