"""A sidecar may start before its PostgreSQL: ``outboxd run`` waits with back-off instead of
exiting, and stops cleanly on SIGTERM while waiting."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.support.daemon import DaemonProcess, wait_until, write_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_run_waits_for_an_unreachable_database(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_free_port()}/nowhere"
    cfg = write_config(tmp_path, url, {"sink": {"kind": "null"}},
                       dispatcher={"log_format": "json"})
    with DaemonProcess(cfg) as daemon:
        wait_until(lambda: "database unreachable at start-up" in daemon.log_text(), timeout=60)
        assert daemon.alive()
        assert daemon.stop() == 0
    lines = [json.loads(x) for x in daemon.log_text().splitlines() if x.startswith("{")]
    assert any(x.get("msg") == "database unreachable at start-up; waiting" for x in lines)
