"""A throwaway ``redis-server`` for one test: its own free port and directory, an
append-only file synced on every write (``appendfsync always``: an acknowledged append
survives SIGKILL), killed and restarted on the same port and data. Without the binary the
test skips loudly, and fails under ``CI=true``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pytest
import redis

from tests.support.pgcluster import free_port


class RedisServer:
    def __init__(self, directory: Path, *settings: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            message = "redis-server is not installed (apt-get install redis-server)"
            if os.environ.get("CI") == "true":
                pytest.fail(message + " (CI=true: a skipped Redis test is a failure)")
            pytest.skip(message)
        self.binary = binary
        self.directory = directory
        self.settings = settings
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.directory), "--appendonly", "yes",
                 "--appendfsync", "always", "--save", "", "--protected-mode", "no",
                 *self.settings],
                stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30) -> None:
        client = self.client()
        deadline = time.monotonic() + timeout
        try:
            while True:
                assert self.process is not None and self.process.poll() is None, (
                    "redis-server exited: " + self.log_tail())
                try:
                    if client.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError("redis-server did not answer: " + self.log_tail())
                time.sleep(0.05)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the server takes connections' bytes into its socket buffers and answers
        nothing (a frozen server, until it is killed or continued)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def unread_bytes(self) -> int:
        """Bytes clients have sent that the server has not read (its connections' receive
        queues, from /proc/net/tcp): > 0 while paused means a request is in flight."""
        total = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                local, queues = fields[1], fields[4]
                if int(local.rsplit(":", 1)[1], 16) == self.port:
                    total += int(queues.split(":")[1], 16)
        return total

    def restart(self) -> None:
        """SIGKILL, then start again on the same port with the same data."""
        self.kill()
        self.restarts += 1
        self.start()

    def log_tail(self) -> str:
        path = self.directory / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()
