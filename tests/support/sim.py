"""``SimProcess``: the simulated receiver as a real subprocess, for tests.

    with SimProcess(tmp_path, "--profile", "stripe") as sim:
        provider = build_providers({"t": {"kind": "http", "url": sim.effects_url, ...}})
        ...
        assert sim.stats()["duplicates"] == 0

It runs ``sys.executable -m providers.sim`` on a free port with a ledger file of its own
under ``tmp_path``; :meth:`restart` keeps the port and the ledger.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 15.0
_instances = itertools.count(1)


class SimProcess:
    def __init__(self, tmp_path: Path, *extra_args: str) -> None:
        self.directory = tmp_path / f"sim-{os.getpid()}-{next(_instances)}"
        self.directory.mkdir(parents=True)
        self.ledger_path = self.directory / "ledger.sqlite"
        self.port_file = self.directory / "port"
        self.log_path = self.directory / "sim.log"
        self.extra_args = tuple(extra_args)
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.start()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("the sim is already running")
        self.port_file.unlink(missing_ok=True)
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "providers.sim", "--host", "127.0.0.1",
             "--port", str(self.port), "--port-file", str(self.port_file),
             "--ledger", str(self.ledger_path), *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.port_file.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                code = self._process.poll()
                self._reap()
                raise RuntimeError(f"the sim did not start (exit {code}):\n{self.log_text()}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text().strip())

    def stop(self) -> int:
        """SIGTERM, wait, and return the exit code (0 on a clean stop)."""
        if self._process is None:
            return 0
        self._process.send_signal(signal.SIGTERM)
        try:
            code = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._reap()
        return code

    def restart(self) -> None:
        self.stop()
        self.start()

    def _reap(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def effects_url(self) -> str:
        return f"{self.url}/effects"

    @property
    def lookup_url(self) -> str:
        return f"{self.url}/effects/by-key/{{idempotency_key}}"

    # -- control -----------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/_stats")
        return result

    def effects(self) -> list[dict[str, Any]]:
        """Every applied effect in order: ``key``, ``fencing_token``, ``applied_at``."""
        result: list[dict[str, Any]] = self._call("GET", "/_effects")["effects"]
        return result

    def control(self, **settings: Any) -> dict[str, Any]:
        """Change fault settings at run time (names as the flags: ``p_drop_after_apply``)."""
        result: dict[str, Any] = self._call("POST", "/_control", settings)
        return result

    def prune(self, *, all_keys: bool = True) -> int:
        """Forget idempotency keys: all completed ones, or those past retention."""
        result: dict[str, Any] = self._call("POST", "/_prune", {"all": all_keys})
        return int(result["pruned"])
