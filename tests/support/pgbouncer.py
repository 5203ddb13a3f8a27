"""A real PgBouncer (Debian's package) in front of the test PostgreSQL, for the pooler tests.

    with PgBouncer(tmp_path, upstream=pg_admin_dsn, mode="transaction") as bouncer:
        url = bouncer.url_for(pg_url)      # the same database, through the pooler

Each instance is its own process on a free 127.0.0.1 port with its own config, so tests on
several xdist workers never share one. PgBouncer refuses to run as root: as root it runs
through ``runuser -u postgres``, its files in a world-readable directory of its own (pytest's
temporary directories are 0700). It logs to stderr, which goes to ``pgbouncer.log`` here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import psycopg

from tests.support.pgcluster import free_port


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)


class PgBouncer:
    def __init__(self, log_dir: Path, *, upstream: str, mode: str,
                 pool_size: int = 10, reset_always: bool = False) -> None:
        """``reset_always``: ``DISCARD ALL`` after every transaction, even in transaction
        pooling, so session state is lost at once instead of whenever another client
        happens to get the server connection."""
        self.log_path = log_dir / f"pgbouncer-{mode}.log"
        self.upstream = urlsplit(upstream.replace("+psycopg", ""))
        self.mode = mode
        self.pool_size = pool_size
        self.reset_always = reset_always
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="outboxd-pgbouncer-"))
        self.dir.chmod(0o755)

    def _write(self) -> Path:
        user = self.upstream.username or "postgres"
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.upstream.hostname} port={self.upstream.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'userlist.txt'}\n"
            f"pool_mode = {self.mode}\ndefault_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\nserver_reset_query = DISCARD ALL\n"
            f"server_reset_query_always = {int(self.reset_always)}\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "log_connections = 0\nlog_disconnections = 0\n"
            f"admin_users = {user}\n"
        )
        for path in (ini, self.dir / "userlist.txt"):
            path.chmod(0o644)
        return ini

    def start(self) -> PgBouncer:
        exe = binary()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed (Debian package pgbouncer)")
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        for _ in range(5):  # a free port can be taken between the probe and the bind
            self.port = free_port()
            ini = self._write()
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen([*prefix, exe, str(ini)], stdout=log,
                                                stderr=subprocess.STDOUT)
            if self._ready():
                return self
        raise RuntimeError(f"pgbouncer did not start: {self.log_path.read_text()[-1500:]}")

    def _ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        self.stop()
        return False

    def dsn(self, database: str) -> str:
        user = self.upstream.username or "postgres"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def url_for(self, url: str) -> str:
        """``url`` (a database on the upstream server) through this pooler."""
        return "postgresql+psycopg://" + self.dsn(url.rsplit("/", 1)[1]).split("://", 1)[1]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
