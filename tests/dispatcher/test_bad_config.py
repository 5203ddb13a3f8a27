"""Bad configuration stops ``outboxd run`` before anything happens: exit code 2 and a
message naming the key. An unmigrated database is an operational failure with a clear
message."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import drop_pg_database, new_pg_database
from tests.support.daemon import REPO_ROOT

PROVIDER_OK = '[providers.sim]\nkind = "http"\nurl = "http://127.0.0.1:9/effects"\n'
CASES: dict[str, tuple[str, str]] = {
    # name: (config text after [database], the key the message must name)
    "unknown-key": ("[dispatcher]\nlease_secs = 3\n" + PROVIDER_OK, "dispatcher.lease_secs"),
    "bad-value": ("[dispatcher]\nlease_seconds = -1\n" + PROVIDER_OK, "dispatcher.lease_seconds"),
    "unknown-section": ("[dispatch]\nbatch_size = 5\n" + PROVIDER_OK, "dispatch"),
    "unknown-kind": ('[providers.sim]\nkind = "pigeon"\n', "providers.sim.kind"),
    "missing-url": ('[providers.sim]\nkind = "http"\n', "providers.sim.url"),
    "unknown-provider-key": (PROVIDER_OK + 'colour = "red"\n', "providers.sim.colour"),
    "missing-file": ("", "missing-file.toml"),
}


def outboxd(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_each_bad_configuration_exits_2_naming_the_key(tmp_path: Path, sqlite_url: str) -> None:
    running = {}
    for name, (text, _) in CASES.items():  # all at once: each is a cold interpreter start
        path = tmp_path / f"{name}.toml"
        if name != "missing-file":
            path.write_text(f'[database]\nurl = "{sqlite_url}"\n\n{text}')
        running[name] = outboxd("run", "--config", str(path))
    wrong = {}
    for name, process in running.items():
        _, err = process.communicate(timeout=60)
        key = CASES[name][1]
        if process.returncode != 2 or key not in err:
            wrong[name] = (process.returncode, err[-500:])
    assert wrong == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "dialect", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_run_against_an_unmigrated_database_fails_clearly(
    tmp_path: Path, request: pytest.FixtureRequest, dialect: str
) -> None:
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        admin = request.getfixturevalue("pg_admin_dsn")
        url = new_pg_database(admin, migrated=False)
        request.addfinalizer(lambda: drop_pg_database(admin, url))
    path = tmp_path / "outboxd.toml"
    path.write_text(f'[database]\nurl = "{url}"\n\n{PROVIDER_OK}[metrics]\nenabled = false\n')
    process = outboxd("run", "--config", str(path))
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "not migrated" in err and "outboxd migrate" in err
    assert "Traceback" not in err


def _startup_cases(tmp_path: Path, sqlite_url: str, pg: str | None) -> dict[str, tuple[str, str]]:
    """name -> (config text, the one line ``outboxd run`` must print, after ``outboxd: ``)."""
    ok = f'[database]\nurl = "{sqlite_url}"\n'
    cases = {
        "wrong-type": (ok + PROVIDER_OK + '[dispatcher]\nbatch_size = "ten"\n',
                       "configuration error: dispatcher.batch_size: must be an integer, "
                       "got 'ten'"),
        "missing-secret": (ok + PROVIDER_OK
                           + 'headers = { Authorization = "env:OUTBOXD_TEST_NO_SUCH" }\n',
                           "configuration error: providers.sim.headers.Authorization: "
                           "environment variable 'OUTBOXD_TEST_NO_SUCH' is not set"),
        "unusable-url": ('[database]\nurl = "mysql://u@h/db"\n' + PROVIDER_OK,
                         "configuration error: database.url: has unsupported scheme 'mysql'"),
        "unwritable-sqlite": (
            f'[database]\nurl = "sqlite:///{tmp_path / "no-such-dir" / "x.db"}"\n'
            + PROVIDER_OK,
            "configuration error: database.url: cannot open the SQLite database (does its "
            "directory exist, and is it writable?): unable to open database file"),
    }
    if pg is not None:
        base = pg.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
        cases["database-missing"] = (
            f'[database]\nurl = "{base}/outboxd_no_such_db"\n' + PROVIDER_OK,
            "configuration error: database.url: the database server refused the connection: "
            'connection to server at "127.0.0.1", port 5432 failed: FATAL:  database '
            '"outboxd_no_such_db" does not exist')
        role = base.replace("://postgres@", "://outboxd_no_such_role:s3cret@")
        cases["role-missing"] = (
            f'[database]\nurl = "{role}/postgres"\n' + PROVIDER_OK,
            "configuration error: database.url: the database server refused the connection: "
            'connection to server at "127.0.0.1", port 5432 failed: FATAL:  ')
    return cases


@pytest.mark.slow
@pytest.mark.postgres
def test_each_startup_error_is_one_line_with_exit_2(
    tmp_path: Path, sqlite_url: str, pg_admin_dsn: str
) -> None:
    cases = _startup_cases(tmp_path, sqlite_url, pg_admin_dsn)
    with socket.socket() as taken:  # the metrics port another replica already holds
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases["port-in-use"] = (
            f'[database]\nurl = "{sqlite_url}"\n{PROVIDER_OK}[metrics]\nport = {port}\n',
            f"configuration error: metrics.port: cannot listen on 127.0.0.1:{port}: Address "
            "already in use. Replicas on one host need distinct ports, or [metrics] port = 0")
        running = {}
        for name, (text, _) in cases.items():
            path = tmp_path / f"{name}.toml"
            path.write_text(text)
            running[name] = outboxd("run", "--config", str(path))
        wrong = {}
        for name, process in running.items():
            _, err = process.communicate(timeout=60)
            lines = [x for x in err.splitlines() if not x.startswith("{")]  # JSON logs
            want = "outboxd: " + cases[name][1]
            if process.returncode != 2 or len(lines) != 1 or not lines[0].startswith(want):
                wrong[name] = (process.returncode, err[-800:])
    assert wrong == {}
    _, err = outboxd("run", "--config", str(tmp_path / "role-missing.toml")).communicate(
        timeout=60)
    assert "s3cret" not in err


@pytest.mark.postgres
def test_other_verbs_say_the_database_error_in_one_line(
    tmp_path: Path, pg_admin_dsn: str
) -> None:
    base = pg_admin_dsn.rsplit("/", 1)[0]
    missing = tmp_path / "missing.toml"
    missing.write_text(f'[database]\nurl = "{base}/outboxd_no_such_db"\n{PROVIDER_OK}')
    down = tmp_path / "down.toml"
    down.write_text(f'[database]\nurl = "postgresql://postgres@127.0.0.1:1/x"\n{PROVIDER_OK}')
    for verb in (["migrate"], ["status"], ["ops", "list"]):
        for path, code, reason in ((missing, 2, 'database "outboxd_no_such_db" does not exist'),
                                   (down, 1, "Connection refused")):
            process = outboxd(*verb, "--config", str(path))
            _, err = process.communicate(timeout=60)
            assert process.returncode == code, (verb, path.name, err)
            assert err.count("\n") == 1 and err.startswith("outboxd: database error: "), err
            assert reason in err, err


@pytest.mark.slow
def test_an_unreachable_database_is_waited_for_and_the_wait_says_why(tmp_path: Path) -> None:
    path = tmp_path / "down.toml"
    path.write_text('[database]\nurl = "postgresql://postgres@127.0.0.1:1/x"\n'
                    f"{PROVIDER_OK}[metrics]\nenabled = false\n")
    process = outboxd("run", "--config", str(path))
    assert process.stderr is not None
    for line in process.stderr:  # the daemon logs its wait (a JSON line) and keeps waiting
        if '"database unreachable at start-up; waiting"' in line:
            break
    assert "Connection refused" in json.loads(line)["reason"]
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0 and "Traceback" not in err


def test_sim_on_a_port_in_use_is_one_line_with_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = outboxd("sim", "--port", str(port))
        _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.splitlines() == [
        f"outboxd sim: cannot listen on 127.0.0.1:{port}: Address already in use (choose "
        "another --port, or 0 for a free one)"]
