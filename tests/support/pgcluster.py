"""A throwaway PostgreSQL cluster for tests: ``initdb`` into a temporary directory and
``pg_ctl`` on a free 127.0.0.1 port, trust authentication, ``fsync`` off.

Used by ``tests/conftest.py`` when no PostgreSQL server is reachable, and by tests that
need to crash a server (``immediate_shutdown``) and restart it.

``initdb`` refuses to run as root. As root the cluster therefore lives in a fresh
world-traversable directory (``tempfile.mkdtemp(prefix="outboxd-pg-")``, mode 0755; pytest's
own temporary directories are 0700 and the ``postgres`` user cannot reach them) owned by
the ``postgres`` OS user, and ``initdb``/``pg_ctl`` run through ``runuser -u postgres --``
(or ``su postgres -c``). That directory is removed by :meth:`ThrowawayCluster.cleanup`, or
when the object is garbage-collected, or at interpreter exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import psycopg

OS_USER = "postgres"
DB_USER = "postgres"


def server_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None when there is none."""

    def ok(d: Path) -> bool:
        return (d / "initdb").is_file() and (d / "pg_ctl").is_file()

    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (subprocess.SubprocessError, OSError):
            out = ""
        if out and ok(Path(out)):
            return Path(out)
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parent.name.split(".")],
        reverse=True,
    )
    for candidate in candidates:
        if ok(Path(candidate)):
            return Path(candidate)
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found and ok(Path(found).parent):
            return Path(found).parent
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _parent_of(proc: Path) -> int | None:
    """The parent pid of ``/proc/PID`` (None if it is gone)."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _stop_and_remove(bindir: Path, data: Path, root: Path | None, prefix: list[str]) -> None:
    """Finaliser: stop a server that is still running, then remove our directory."""
    if (data / "postmaster.pid").exists():
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
            timeout=60,
        )
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


class ThrowawayCluster:
    """One PostgreSQL cluster in a temporary directory; ``start()`` runs ``initdb`` once."""

    def __init__(self, base_dir: Path) -> None:
        bindir = server_binaries()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) found")
        self.bindir = bindir
        self.port = free_port()
        self._owned_root: Path | None = None
        if _as_root():
            # pytest's tmp dirs are 0700 below /tmp/pytest-of-root: the postgres user
            # cannot traverse them. Use a fresh world-traversable directory instead.
            self._owned_root = Path(tempfile.mkdtemp(prefix="outboxd-pg-"))
            self._owned_root.chmod(0o755)
            root = self._owned_root
        else:
            root = Path(base_dir)
            root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "sock"
        self.logfile = root / "server.log"
        self._prefix = self._user_prefix()
        self._initialised = False
        self._finalizer = weakref.finalize(
            self, _stop_and_remove, self.bindir, self.data, self._owned_root, self._prefix
        )

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _user_prefix() -> list[str]:
        if not _as_root():
            return []
        try:
            pwd.getpwnam(OS_USER)
        except KeyError as exc:
            raise RuntimeError(
                f"running as root and there is no {OS_USER!r} OS user to run initdb as"
            ) from exc
        runuser = shutil.which("runuser")
        if runuser:
            return [runuser, "-u", OS_USER, "--"]
        return []  # fall back to su in _run

    def _run(self, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        if _as_root() and not self._prefix:
            cmd = ["su", OS_USER, "-s", "/bin/sh", "-c", shlex.join(args)]
        else:
            cmd = [*self._prefix, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
        if check and result.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(
                f"{shlex.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}\n{log[-4000:]}"
            )
        return result

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), *args], check=check)

    def _initdb(self) -> None:
        self.socket_dir.mkdir(exist_ok=True)
        if _as_root():
            pw = pwd.getpwnam(OS_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "--auth=trust",
                f"--username={DB_USER}",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        self._initialised = True

    def _basebackup(self, primary: ThrowawayCluster) -> None:
        """Fill the data directory from ``primary`` (``pg_basebackup -R``: a streaming
        standby of it, its ``primary_conninfo`` and ``standby.signal`` written)."""
        self.socket_dir.mkdir(exist_ok=True)
        if _as_root():
            pw = pwd.getpwnam(OS_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        self._run([str(self.bindir / "pg_basebackup"), "-D", str(self.data), "-R",
                   "-X", "stream", "-c", "fast", "--no-sync", "-h", "127.0.0.1",
                   "-p", str(primary.port), "-U", DB_USER])
        self._initialised = True

    def standby(self, base_dir: Path) -> ThrowawayCluster:
        """A streaming standby of this (running) cluster, started, on a port of its own."""
        replica = ThrowawayCluster(base_dir)
        replica._basebackup(self)
        replica.start()
        return replica

    @contextlib.contextmanager
    def wal_senders_held(self) -> Iterator[None]:
        """On a primary: its WAL senders stopped (SIGSTOP) for the block, so its standbys
        fall behind as a lagging asynchronous standby does (a synchronous one makes the
        primary's commits wait instead); continued on leaving the block, if still alive.
        Stopped on the primary's side, a sender sends nothing more: what a crash in the
        block loses is really lost (a standby's stopped receiver would read the bytes
        already in its socket later)."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            pids = [int(r[0]) for r in conn.execute("SELECT pid FROM pg_stat_replication")]
        if not pids:
            raise RuntimeError("no WAL sender: is a standby streaming from this server?")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def kill_all(self) -> None:
        """Power loss: SIGKILL the postmaster, then every process it started (a stopped
        WAL sender among them sends nothing more). Nothing restarts it."""
        pid_file = self.data / "postmaster.pid"
        postmaster = int(pid_file.read_text().split()[0])
        children = [int(p.name) for p in Path("/proc").iterdir()
                    if p.name.isdigit() and _parent_of(p) == postmaster]
        os.kill(postmaster, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        """End recovery on a standby (``pg_ctl promote``): a new timeline, read-write."""
        self._pg_ctl("-w", "-t", "60", "promote")

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._initialised and self._pg_ctl("status", check=False).returncode == 0

    def start(self) -> None:
        """``initdb`` (first time only) and start the server; returns once it accepts."""
        if not self._initialised:
            self._initdb()
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                f"-c unix_socket_directories={self.socket_dir}",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c max_connections=100",
            ]
        )
        self._pg_ctl("-l", str(self.logfile), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``) and wait for it."""
        if self._initialised:
            self._pg_ctl("-m", mode, "-w", "-t", "60", "stop", check=False)

    def immediate_shutdown(self) -> None:
        """Crash-stop: no checkpoint, the next start runs crash recovery."""
        self.stop("immediate")

    def restart(self) -> None:
        self.stop("fast")
        self.start()

    def cleanup(self) -> None:
        """Stop the server if it runs and remove the directory we created."""
        self._finalizer()

    # ------------------------------------------------------------------ addresses

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{dbname}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://{DB_USER}@127.0.0.1:{self.port}/{dbname}"

    def __enter__(self) -> ThrowawayCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
