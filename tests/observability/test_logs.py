"""Logs: text on a TTY, JSON lines otherwise, the level from configuration, and only
whitelisted identifier fields (never a payload or header value)."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.observability.logs import JsonFormatter, TextFormatter
from tests.observability import json_lines
from tests.support.daemon import REPO_ROOT, run_once, write_config

NULL_PROVIDER = {"sink": {"kind": "null"}}


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("outboxd.dispatch", logging.WARNING, __file__, 1,
                               "dispatch outcome", None, None)
    record.__dict__.update(extra)
    return record


def test_formatters_copy_only_whitelisted_identifiers() -> None:
    record = _record(operation_id="op-1", tenant="t1", fencing_token=7, attempt=2,
                     outcome="ambiguous", payload={"card": "4111-canary"},
                     headers={"Authorization": "Bearer canary"})
    line = JsonFormatter().format(record)
    data = json.loads(line)
    assert {k: data[k] for k in ("operation_id", "tenant", "fencing_token", "attempt",
                                 "outcome")} == {"operation_id": "op-1", "tenant": "t1",
                                                 "fencing_token": 7, "attempt": 2,
                                                 "outcome": "ambiguous"}
    assert data["level"] == "warning" and data["msg"] == "dispatch outcome"
    assert "canary" not in line
    text = TextFormatter().format(record)
    assert "operation_id=op-1" in text and "canary" not in text


@pytest.mark.slow
def test_text_on_a_tty(sqlite_url: str, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, sqlite_url, NULL_PROVIDER)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--once", "--config", str(cfg)],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(leader)
    lines = [ln for ln in b"".join(chunks).decode().splitlines() if ln.strip()]
    started = [ln for ln in lines if "dispatcher started" in ln]
    assert started, lines
    assert not started[0].lstrip().startswith("{")
    assert "INFO" in started[0] and "worker=" in started[0]


@pytest.mark.slow
def test_json_lines_at_the_configured_level(sqlite_url: str, tmp_path: Path) -> None:
    """(JSON lines at DEBUG with canaries: test_metrics_run.py; the default INFO level:
    test_text_on_a_tty above.)"""
    cfg = write_config(tmp_path, sqlite_url, NULL_PROVIDER)
    quiet = run_once(cfg, env={"OUTBOXD_DISPATCHER_LOG_LEVEL": "WARNING"})
    assert quiet.returncode == 0, quiet.stderr
    assert all(r["level"] in ("warning", "error") for r in json_lines(quiet.stderr))
    assert "dispatcher started" not in quiet.stderr
