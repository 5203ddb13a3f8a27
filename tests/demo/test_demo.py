"""``outboxd demo`` as a user runs it (a real process, not a TTY): it exits 0 within a
minute and its summary reports no duplicate, nothing lost, both crashes, the refused
secret (by path, not value), the approvals and the deadline block."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.support.sim import REPO_ROOT

pytestmark = pytest.mark.slow


def test_demo_runs_the_whole_promise_and_reports_zero_duplicates() -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "demo", "--seed", "7", "--operations", "150"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=110, check=False,
    )
    elapsed = time.monotonic() - t0
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert elapsed < 60, elapsed
    assert re.search(r"^  duplicates +0$", out, re.M), out
    assert "lost: 0" in out
    assert out.count("SIGKILL dispatcher pid") == 2
    assert "final stop: SIGTERM, exit 0" in out
    assert "path='$.gateway.api_key'" in out and "sk_live" not in out
    assert re.search(r"^  message:send:case-late +deadline_passed$", out, re.M)
    assert re.search(r"approvals: (\d+) operations needed one; approved by demo-operator: \1",
                     out)
    assert "unknown outcomes found:" in out and "resolved by reconciliation" in out
    assert re.search(r"^OK: duplicates 0, lost 0", out, re.M)
    assert "\r" not in out  # plain lines, no progress bar, when not on a terminal
