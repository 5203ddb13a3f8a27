"""The console's authentication pieces without a server: password hashes, the users file
(hashes from the file, a variable or a file of their own; tenant scopes), the lock-out
after repeated failures, and ``outboxd console`` refusing to run without users."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.console.auth import (
    MAX_FAILURES,
    Sessions,
    csrf_ok,
    hash_password,
    load_users,
    verify_password,
)
from outbox.errors import ConfigError
from tests.support.daemon import REPO_ROOT

FAST = {"n": 2**10}  # the real cost (2**14) is what the users file gets; tests go faster


def test_hashes_verify_only_their_password_and_are_salted() -> None:
    encoded = hash_password("s3cret", **FAST)
    assert encoded.startswith("scrypt$1024$8$1$")
    assert verify_password("s3cret", encoded)
    assert not verify_password("s3cret ", encoded)
    assert not verify_password("s3cret", "pbkdf2$1$2$3$4$5")
    assert not verify_password("s3cret", "garbage")
    assert hash_password("s3cret", **FAST) != encoded


def test_users_file_reads_hashes_from_the_file_a_variable_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BOB_HASH", hash_password("b", **FAST))
    (tmp_path / "carol.hash").write_text(hash_password("c", **FAST) + "\n")
    users = tmp_path / "users.toml"
    users.write_text(
        f'[users.alice]\npassword_hash = "{hash_password("a", **FAST)}"\n'
        '[users.bob]\npassword_hash_env = "BOB_HASH"\ntenants = ["t2"]\n'
        '[users.carol]\npassword_hash_file = "carol.hash"\n')
    loaded = load_users(users)
    assert sorted(loaded) == ["alice", "bob", "carol"]
    assert loaded["alice"].tenants is None and loaded["bob"].tenants == frozenset({"t2"})
    assert loaded["bob"].sees("t2") and not loaded["bob"].sees("t1")
    assert verify_password("c", loaded["carol"].password_hash)
    assert loaded["alice"].password_hash not in repr(loaded["alice"])


@pytest.mark.parametrize(("text", "problem"), [
    ("", "no [users.NAME]"),
    ('[users.a]\npassword = "plain"\n', "users.a.password: unknown key"),
    ('[users.a]\npassword_hash = "plain"\n', "not an scrypt"),
    ('[users.a]\npassword_hash_env = "NOT_SET_ANYWHERE"\n', "is not set"),
    ('[users.a]\npassword_hash = "scrypt$1$2$3$4$5"\ntenants = []\n', "users.a.tenants"),
    ("[admins]\n", "unknown section"),
])
def test_a_bad_users_file_is_refused_naming_the_entry(
    tmp_path: Path, text: str, problem: str
) -> None:
    users = tmp_path / "users.toml"
    users.write_text(text)
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("$", r"\$")):
        load_users(users)


def test_sessions_lock_a_user_out_after_repeated_failures(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(f'[users.alice]\npassword_hash = "{hash_password("right", **FAST)}"\n')
    sessions = Sessions(load_users(users))
    cookie = sessions.login("alice", "right")
    assert cookie is not None
    session = sessions.get(cookie)
    assert session is not None and session.user.name == "alice"
    assert csrf_ok(session, session.csrf) and not csrf_ok(session, None)
    assert not csrf_ok(session, session.csrf[:-1])
    for _ in range(MAX_FAILURES):
        assert sessions.login("alice", "wrong") is None
    assert sessions.login("alice", "right") is None  # locked for a while
    sessions.logout(cookie)
    assert sessions.get(cookie) is None


def test_the_console_does_not_start_without_users(tmp_path: Path) -> None:
    cfg = tmp_path / "outboxd.toml"
    cfg.write_text(f'[database]\nurl = "sqlite:///{tmp_path / "o.db"}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "console", "--config", str(cfg), "--port", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "--users" in done.stderr


def test_hash_password_prints_a_usable_hash() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "console", "--hash-password"],
        cwd=REPO_ROOT, input="hunter2\n", capture_output=True, text=True, timeout=60,
        check=True)
    assert verify_password("hunter2", done.stdout.strip())
