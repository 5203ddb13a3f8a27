"""The demo's real processes: the fault-injecting receiver (``python -m providers.sim``) and
the dispatcher (``python -m dispatcher.cli run``), started, killed and stopped by signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

START_TIMEOUT_SECONDS = 20.0

#: The receiver's faults: each request draws them independently (seeded with ``--seed``).
SIM_FAULTS: dict[str, float] = {
    "--p-drop-after-apply": 0.04,
    "--p-5xx-before": 0.03,
    "--p-5xx-after": 0.02,
    "--p-429": 0.03,
    "--p-slow": 0.08,
}


def _child_env() -> dict[str, str]:
    """The caller's environment without ``OUTBOXD_*`` (they would override the demo's
    configuration file)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}


class SimReceiver:
    """``python -m providers.sim`` on a free loopback port, with faults."""

    def __init__(self, workdir: Path, seed: int | None) -> None:
        self.port_file = workdir / "sim.port"
        self.log_path = workdir / "sim.log"
        args = [
            sys.executable, "-m", "providers.sim", "--host", "127.0.0.1", "--port", "0",
            "--port-file", str(self.port_file), "--ledger", str(workdir / "sim-ledger.sqlite"),
            "--retry-after", "0.3", "--slow-seconds", "0.8",
        ]
        for flag, p in SIM_FAULTS.items():
            args += [flag, str(p)]
        if seed is not None:
            args += ["--seed", str(seed)]
        self._log: IO[bytes] = self.log_path.open("ab")
        self.process = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=_child_env()
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the sim did not start; see {self.log_path}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text().strip())
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class DispatcherProcess:
    """``python -m dispatcher.cli run --config FILE`` as a real process."""

    def __init__(self, config: Path, workdir: Path, number: int) -> None:
        self.log_path = workdir / f"dispatcher-{number}.log"
        self._log: IO[bytes] = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(config)],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir, env=_child_env(),
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs; leases are left to expire."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path; returns the exit code."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code
