"""Who may use the console: users with password hashes, sessions and CSRF tokens.

Users come from a TOML file (``--users FILE`` or the variable ``OUTBOXD_CONSOLE_USERS``)::

    [users.alice]
    password_hash = "scrypt$16384$8$1$<salt>$<hash>"    # `outboxd console --hash-password`

    [users.bob]
    password_hash_env = "CONSOLE_BOB_HASH"   # or password_hash_file = "/run/secrets/bob"
    tenants = ["t1"]                         # optional: only these tenants (default: all)

Only hashes are stored (stdlib ``hashlib.scrypt``); a "token" login is a user whose secret
is a long random string. Sessions live in the console's memory (a restart logs everyone
out); each has its own CSRF token, compared in constant time on every POST.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.errors import ConfigError

USERS_ENV = "OUTBOXD_CONSOLE_USERS"
SCHEME = "scrypt"
N, R, P = 2**14, 8, 1
MAX_FAILURES = 10
"""Failed logins per user within LOCKOUT_SECONDS before that user is refused for a while."""
LOCKOUT_SECONDS = 300.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, n: int = N, r: int = R, p: int = P) -> str:
    """``scrypt$N$r$p$salt$hash`` (base64url): what goes into the users file."""
    if not password:
        raise ValueError("empty password")
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"{SCHEME}${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = encoded.split("$")
        if scheme != SCHEME:
            return False
        expected = _unb64(digest)
        got = hashlib.scrypt(
            password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p),
            dklen=len(expected), maxmem=256 * 1024 * 1024,
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected)


_DUMMY = hash_password("not a password")  # unknown users cost the same time as known ones


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = field(repr=False)
    tenants: frozenset[str] | None = None
    """None: every tenant; else only these (another tenant's pages are 404)."""

    def sees(self, tenant_id: str) -> bool:
        return self.tenants is None or tenant_id in self.tenants


def _secret(name: str, table: Mapping[str, Any], base: Path) -> str:
    given = [k for k in ("password_hash", "password_hash_env", "password_hash_file") if k in table]
    if len(given) != 1:
        raise ConfigError(
            f"users.{name}: give exactly one of password_hash, password_hash_env, "
            "password_hash_file", key=f"users.{name}")
    key = given[0]
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"users.{name}.{key}: must be a non-empty string")
    if key == "password_hash_env":
        if not os.environ.get(value):
            raise ConfigError(f"users.{name}.password_hash_env: variable {value} is not set")
        value = os.environ[value]
    elif key == "password_hash_file":
        path = Path(value) if Path(value).is_absolute() else base / value
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"users.{name}.password_hash_file: cannot read ({exc.strerror})"
            ) from None
    if not value.startswith(SCHEME + "$") or value.count("$") != 5:
        raise ConfigError(f"users.{name}: the hash is not an {SCHEME}$N$r$p$salt$hash value "
                          "(make one with `outboxd console --hash-password`)")
    return value.strip()


def load_users(path: str | os.PathLike[str]) -> dict[str, User]:
    """Read and validate the users file; a :class:`ConfigError` names the bad entry."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the users file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None
    unknown = set(data) - {"users"}
    if unknown:
        raise ConfigError(f"{file}: unknown section [{sorted(unknown)[0]}]")
    users: dict[str, User] = {}
    for name, table in dict(data.get("users", {})).items():
        if not isinstance(table, dict):
            raise ConfigError(f"users.{name}: must be a table")
        extra = set(table) - {"password_hash", "password_hash_env", "password_hash_file",
                              "tenants"}
        if extra:
            raise ConfigError(f"users.{name}.{sorted(extra)[0]}: unknown key")
        tenants = table.get("tenants")
        if tenants is not None and (
            not isinstance(tenants, list) or not tenants
            or not all(isinstance(t, str) and t for t in tenants)
        ):
            raise ConfigError(f"users.{name}.tenants: must be a non-empty list of tenant ids")
        users[name] = User(name, _secret(name, table, file.parent),
                           None if tenants is None else frozenset(tenants))
    if not users:
        raise ConfigError(f"{file}: no [users.NAME] defined: nobody could log in")
    return users


@dataclass
class Session:
    user: User
    csrf: str
    created: float
    seen: float
    flash: list[tuple[str, str]] = field(default_factory=list)


class Sessions:
    """Sessions in memory, by the SHA-256 of their cookie value; idle and absolute expiry."""

    def __init__(self, users: Mapping[str, User], *, idle_seconds: float = 3600.0,
                 max_seconds: float = 12 * 3600.0) -> None:
        self.users = dict(users)
        self.idle, self.max = idle_seconds, max_seconds
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}
        self._failures: dict[str, list[float]] = {}

    @staticmethod
    def _key(cookie: str) -> str:
        return hashlib.sha256(cookie.encode()).hexdigest()

    def login(self, name: str, password: str) -> str | None:
        """A new session's cookie value, or None (unknown user, bad password, locked)."""
        now = time.monotonic()
        user = self.users.get(name)
        with self._lock:
            recent = [t for t in self._failures.get(name, []) if now - t < LOCKOUT_SECONDS]
            self._failures[name] = recent
            locked = len(recent) >= MAX_FAILURES
        ok = verify_password(password, user.password_hash if user else _DUMMY)
        if user is None or not ok or locked:
            with self._lock:
                self._failures.setdefault(name, []).append(now)
            return None
        cookie = secrets.token_urlsafe(32)
        with self._lock:
            self._failures.pop(name, None)
            self._by_id[self._key(cookie)] = Session(user, secrets.token_urlsafe(32), now, now)
        return cookie

    def get(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        now = time.monotonic()
        with self._lock:
            key = self._key(cookie)
            s = self._by_id.get(key)
            if s is None:
                return None
            if now - s.seen > self.idle or now - s.created > self.max:
                del self._by_id[key]
                return None
            s.seen = now
            return s

    def logout(self, cookie: str | None) -> None:
        if cookie:
            with self._lock:
                self._by_id.pop(self._key(cookie), None)


def csrf_ok(session: Session, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(session.csrf.encode(), str(given).encode())
