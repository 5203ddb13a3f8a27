"""Real ``outboxd`` processes for tests: a config file writer and a process handle.

    cfg = write_config(tmp_path, db_url, {"tickets": http_provider(sim)})
    with DaemonProcess(cfg) as d:      # `outboxd run --config cfg`
        wait_until(lambda: count_status(engine, "applied") == 100)
    d.kill()                           # SIGKILL; d.stop() is SIGTERM and returns the code
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

REPO_ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count(1)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def write_config(
    directory: Path,
    db_url: str,
    providers: Mapping[str, Mapping[str, Any]],
    *,
    dispatcher: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    name: str | None = None,
    database: Mapping[str, Any] | None = None,
) -> Path:
    """Write an ``outboxd.toml`` and return its path. Metrics are off unless given."""
    sections: dict[str, Mapping[str, Any]] = {
        "database": {"url": db_url, **(database or {})},
        "dispatcher": {"poll_interval_ms": 50, "reconcile_interval_seconds": 0.3,
                       "recovery_interval_seconds": 0.3, **(dispatcher or {})},
        "metrics": metrics or {"enabled": False},
    }
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        lines.append("")
    for pname, values in providers.items():
        lines.append(f"[providers.{pname}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        lines.append("")
    path = directory / (name or f"outboxd-{next(_ids)}.toml")
    path.write_text("\n".join(lines))
    return path


def http_provider(sim: Any, **overrides: Any) -> dict[str, Any]:
    """An ``http`` provider section pointing at a :class:`tests.support.sim.SimProcess`."""
    return {"kind": "http", "url": sim.effects_url, "lookup_url": sim.lookup_url,
            "dedup_retention_seconds": 86400, "timeout_seconds": 2, "in_flight_seconds": 3,
            **overrides}


class DaemonProcess:
    """``outboxd run --config FILE`` as a real subprocess."""

    def __init__(self, config: Path, *, env: Mapping[str, str] | None = None,
                 args: tuple[str, ...] = (), start: bool = True) -> None:
        self.config = config
        self.env = {**os.environ, **(env or {})}
        self.args = args
        self.log_path = config.with_suffix(f".{next(_ids)}.log")
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        if start:
            self.start()

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(self.config),
             *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=self.env)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (SIGCONT first, in case it is stopped) and wait; returns the exit code."""
        if self.process is None:
            return 0
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def wait(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.alive():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.stop()
        if self._log is not None:
            self._log.close()


def run_once(config: Path, *, env: Mapping[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``outboxd run --once``: drain what is due, then exit."""
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "run", "--once", "--config", str(config)],
        cwd=REPO_ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout, check=False)


def wait_until(predicate: Callable[[], bool], *, timeout: float = 60, interval: float = 0.05,
               message: str = "condition") -> None:
    """Poll ``predicate`` (a behaviour, not a timing assertion) until true or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}")


def status_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT status, count(*) FROM outbox_operations GROUP BY status")).all()
    return {str(s): int(n) for s, n in rows}


def settled(engine: Engine, total: int) -> bool:
    """Every operation is in a state no dispatcher will move it out of by itself."""
    c = status_counts(engine)
    return sum(c.get(s, 0) for s in ("applied", "verified", "rejected", "blocked",
                                     "cancelled")) == total
