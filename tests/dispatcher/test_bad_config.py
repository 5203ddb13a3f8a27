"""Bad configuration stops ``outboxd run`` before anything happens: exit code 2 and a
message naming the key. An unmigrated database is an operational failure with a clear
message."""

from __future__ import annotations

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
