"""Configuration: one TOML file plus ``OUTBOXD_<SECTION>_<KEY>`` variables, validated once.

:func:`load_config` returns a frozen :class:`Config`. Precedence: defaults < file < environment.
Every problem (unknown section or key, wrong type, out of range) is a
:class:`~outbox.errors.ConfigError` naming the key as ``section.key`` and its source (file path
or variable name). Values of credential-like keys are never echoed. See docs/configuration.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.errors import ConfigError

if TYPE_CHECKING:
    from outbox.protect import Protection

DEFAULT_FILE = "outboxd.toml"
ENV_PREFIX = "OUTBOXD_"
REDACTED = "<redacted>"
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_SECRETISH = re.compile(r"(?i)pass(word|wd)?|secret|token|credential|api_?key|auth|private")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PROTECT_KEY = "protect_payloads"
"""The per-provider switch ``[providers.NAME] protect_payloads``: read here, not by the
provider registry (it is the dispatcher's business, not the receiver's)."""


def _check_db_url(url: str) -> str:
    """Normalise postgres:// and postgresql:// to postgresql+psycopg://; never echo the URL."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        raise ValueError("must be a URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
    if scheme.lower() in ("postgres", "postgresql", "postgresql+psycopg"):
        return "postgresql+psycopg://" + rest
    if scheme.lower() in ("sqlite", "sqlite+pysqlite"):
        return url.strip()
    raise ValueError(f"has unsupported scheme {scheme!r} (use sqlite:/// or postgresql+psycopg://)")


def _check_identifier(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError("must be an SQL identifier (letter or _, then letters, digits, _; <= 63)")
    return name


def _check_nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


@dataclass(frozen=True)
class DatabaseConfig:
    url: str = field(default="sqlite:///outbox.db", metadata={"check": _check_db_url})
    """sqlite:///PATH (one host, tests, demos) or postgresql+psycopg://... (several replicas);
    postgres:// and postgresql:// are normalised. Put the password in the environment
    (OUTBOXD_DATABASE_URL) rather than in the file; it is redacted from status output."""
    schema: str | None = field(default=None, metadata={"check": _check_identifier})
    """PostgreSQL schema holding the outbox_ tables (None: public). Separating it eases grants
    and lets several deployments share a database; not supported with SQLite."""
    pool_size: int = field(default=5, metadata={"ge": 1})
    """Connections per replica. More helps concurrent writes; each costs a server backend."""
    max_payload_bytes: int = field(default=262144, metadata={"gt": 0})
    """Largest canonical JSON payload accepted. Large payloads bloat the table and every send."""
    connect_timeout_seconds: float = field(default=5.0, metadata={"gt": 0})
    """Fail fast on an unreachable database; too low gives spurious failures over slow links."""
    agent_role: str = field(default="outbox_agent", metadata={"check": _check_identifier})
    """PostgreSQL NOLOGIN role migration 0002 creates for agents (own tenant only). Grant it
    to login users; see docs/security-model.md. Ignored on SQLite (single-tenant)."""
    dispatcher_role: str = field(
        default="outbox_dispatcher", metadata={"check": _check_identifier}
    )
    """PostgreSQL role for the dispatcher: reads every tenant, writes only its own columns."""
    operator_role: str = field(default="outbox_operator", metadata={"check": _check_identifier})
    """PostgreSQL role for operators: own tenant, metadata without bodies, audited overrides."""
    retention_role: str = field(
        default="outbox_retention", metadata={"check": _check_identifier}
    )
    """PostgreSQL role for the purge path (`outboxd purge`, the retention job)."""


@dataclass(frozen=True)
class DispatcherConfig:
    batch_size: int = field(default=100, metadata={"ge": 1, "le": 10000})
    """Tasks claimed per poll. Larger: fewer round trips; smaller: fairer between replicas and
    less work to re-lease if a replica dies."""
    concurrency: int = field(default=32, metadata={"ge": 1, "le": 1024})
    """Sends in flight per replica (threads). Higher throughput against slow receivers, more
    load on them and more outcomes that may turn ambiguous on a crash."""
    lease_seconds: float = field(default=30.0, metadata={"gt": 0})
    """How long a claim is held. Short: a dead replica's work resumes sooner; too short (below
    a send's timeout) and a live send loses its lease, which fencing then has to absorb."""
    poll_interval_ms: int = field(default=200, metadata={"ge": 1})
    """Idle wait between claims. Lower latency costs more queries on an idle database."""
    listen: bool = True
    """PostgreSQL: also wake on the NOTIFY a new row sends (ms latency when idle); off, the
    replica only polls. Ignored on SQLite, which always polls."""
    shutdown_grace_seconds: float = field(default=10.0, metadata={"ge": 0})
    """On SIGTERM, how long to let in-flight sends finish before leaving them to recovery."""
    dedup_safety_margin: float = field(default=0.1, metadata={"ge": 0, "lt": 1})
    """Fraction of a receiver's dedup window held back: a retry is only sent while the key is
    surely remembered. Larger is safer against clock skew, sends ambiguous work to people sooner."""
    worker_id: str | None = field(default=None, metadata={"check": _check_nonempty})
    """Identity written on claims and attempts (None: hostname:pid, filled by the daemon)."""
    reconcile_interval_seconds: float = field(default=2.0, metadata={"gt": 0})
    """How often ambiguous/accepted outcomes are looked up. Lower resolves sooner, polls more."""
    recovery_interval_seconds: float = field(default=2.0, metadata={"gt": 0})
    """How often expired leases are recovered. Lower recovers sooner, queries more."""
    log_level: str = field(
        default="INFO", metadata={"choices": ("DEBUG", "INFO", "WARNING", "ERROR")}
    )
    """DEBUG/INFO/WARNING/ERROR (case-insensitive). DEBUG is verbose but never logs payloads."""
    log_format: str = field(default="auto", metadata={"choices": ("auto", "json", "text")})
    """auto: json when stderr is not a TTY, text otherwise; or force json / text."""


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = True
    """Serve Prometheus metrics over HTTP. Off: no port is opened, nothing is observable."""
    host: str = field(default="127.0.0.1", metadata={"check": _check_nonempty})
    """Bind address. 127.0.0.1 is private to the host; 0.0.0.0 exposes it to the network."""
    port: int = field(default=9464, metadata={"ge": 0, "le": 65535})
    """0 picks a free port (logged), so several replicas can run side by side on one host."""
    gauge_refresh_seconds: float = field(default=5.0, metadata={"gt": 0})
    """How often backlog gauges are recomputed (a query each time); lower is fresher, costlier."""


@dataclass(frozen=True)
class RetentionConfig:
    enabled: bool = False
    """Purge old data on a schedule. Off by default: deleting evidence is an explicit choice."""
    payload_days: float = field(default=30.0, metadata={"gt": 0})
    """Payloads of finished tasks are cleared after this (the digest stays for audits)."""
    receipt_days: float = field(default=90.0, metadata={"gt": 0})
    """Receivers' receipts (evidence of effects) kept this long."""
    attempts_days: float = field(default=365.0, metadata={"gt": 0})
    """Attempt history kept this long; shorter saves space, loses forensic detail."""
    events_days: float = field(default=730.0, metadata={"gt": 0})
    """State-change events kept this long (the audit trail)."""
    approvals_days: float = field(default=730.0, metadata={"gt": 0})
    """Human approvals kept this long (who allowed what)."""
    interval_seconds: float = field(default=3600.0, metadata={"gt": 0})
    """How often the purge runs; each run deletes in bounded batches."""


@dataclass(frozen=True)
class ArtifactsConfig:
    root: str | None = field(default=None, metadata={"check": _check_nonempty})
    """Directory of the built-in local artifact store: an operation's ``payload_ref`` is a
    relative path below it. Relative to the configuration file's directory (or the working
    directory without one). None: rows with ``payload_ref`` are blocked ``artifact_missing``."""


def _check_key_refs(keys: Mapping[str, str]) -> Mapping[str, str]:
    for kid, ref in keys.items():
        if not _KEY_ID.fullmatch(kid):
            raise ValueError(
                f"key id {kid!r} must be 1-64 letters, digits, '.', '_' or '-' "
                "(starting with a letter or digit)"
            )
        scheme, sep, target = ref.partition(":")
        if not sep or scheme not in ("env", "file") or not target:
            raise ValueError(
                f"key {kid!r}: a literal key is not allowed in configuration; "
                "write 'env:NAME' or 'file:PATH'"
            )
    return keys


def _check_key_id(kid: str) -> str:
    if not _KEY_ID.fullmatch(kid):
        raise ValueError("must be a key id of [protection] keys")
    return kid


@dataclass(frozen=True)
class ProtectionConfig:
    keys: Mapping[str, str] = field(default_factory=dict, metadata={"check": _check_key_refs})
    """Master keys by key id, each an ``env:NAME`` or ``file:PATH`` reference to 32 random
    bytes in base64. Keep a retired key here for as long as a row sealed under it may still
    have to be read; see docs/security.md."""
    active_key: str | None = field(default=None, metadata={"check": _check_key_id})
    """The key id new envelopes (payloads at enqueue, receipts at record time) use."""


@dataclass(frozen=True)
class Config:
    database: DatabaseConfig
    dispatcher: DispatcherConfig
    metrics: MetricsConfig
    retention: RetentionConfig
    providers: Mapping[str, Mapping[str, Any]]
    """Raw [providers.NAME] tables as read-only mappings (arrays stay lists); each has a
    string ``kind``. Everything else is validated by the provider registry."""
    source: str | None
    """Path of the file read, or None."""
    artifacts: ArtifactsConfig = field(default_factory=ArtifactsConfig)
    protection: ProtectionConfig = field(default_factory=ProtectionConfig)

    def protected_providers(self) -> frozenset[str]:
        """Providers with ``protect_payloads = true``."""
        return frozenset(n for n, t in self.providers.items() if t.get(PROTECT_KEY) is True)


_SECTIONS: dict[str, type[Any]] = {
    "database": DatabaseConfig,
    "dispatcher": DispatcherConfig,
    "metrics": MetricsConfig,
    "retention": RetentionConfig,
    "artifacts": ArtifactsConfig,
    "protection": ProtectionConfig,
}
_Value = tuple[Any, str | None, bool]  # (raw value, source, came from the environment)


def _error(key: str, problem: str, source: str | None) -> ConfigError:
    return ConfigError(f"{key}: {problem}", key=key, source=source)


def _echo(key: str, value: Any) -> str:
    if key == "database.url" or key.startswith("protection.") or _SECRETISH.search(key):
        return ""
    return f", got {value!r}"


def _convert(value: Any, typ: Any, from_env: bool) -> Any:
    """``value`` as ``typ``; ValueError describing the expected type otherwise."""
    if typing.get_origin(typ) is Mapping:  # a table of strings (a JSON object from env)
        if from_env:
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of strings") from None
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError("must be a table of strings")
        return dict(value)
    if typing.get_origin(typ) in (types.UnionType, typing.Union):
        if value is None or value == "":
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_env and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ValueError(
            "must be a boolean (true/false/1/0/yes/no)"
            if from_env
            else "must be a boolean (true or false)"
        )
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_env and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
        raise ValueError("must be an integer")
    if typ is float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif from_env:
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None or not math.isfinite(number):
            raise ValueError("must be a finite number")
        return number
    if typ is str:
        if isinstance(value, str):
            return value
        raise ValueError("must be a string")
    raise TypeError(f"unsupported configuration field type {typ!r}")  # a bug, not user input


def _check(value: Any, meta: Mapping[str, Any]) -> Any:
    if "choices" in meta:
        for choice in meta["choices"]:
            if value.lower() == choice.lower():
                return choice
        raise ValueError(f"must be one of {', '.join(meta['choices'])}")
    ops: dict[str, Callable[[Any, Any], bool]] = {
        ">=": lambda v, b: v >= b,
        ">": lambda v, b: v > b,
        "<=": lambda v, b: v <= b,
        "<": lambda v, b: v < b,
    }
    bounds = [
        (op, meta[name])
        for name, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if name in meta
    ]
    if not all(ops[op](value, bound) for op, bound in bounds):
        raise ValueError("must be " + " and ".join(f"{op} {bound}" for op, bound in bounds))
    check: Callable[[Any], Any] | None = meta.get("check")
    return check(value) if check else value


def _build(section: str, values: Mapping[str, _Value]) -> Any:
    """Build the section's dataclass from ``values`` using its fields and type hints."""
    cls = _SECTIONS[section]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        raw, source, from_env = values[f.name]
        key = f"{section}.{f.name}"
        try:
            value = _convert(raw, hints[f.name], from_env)
            kwargs[f.name] = None if value is None else _check(value, f.metadata)
        except ValueError as exc:
            raise _error(key, f"{exc}{_echo(key, raw)}", source) from None
    return cls(**kwargs)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):  # lists stay lists: the provider registry expects them
        return [_freeze(v) for v in value]
    return value


def _env_provider_value(text: str, current: Any) -> Any:
    """Strings stay strings where the file has a string; otherwise JSON numbers, booleans
    and arrays are parsed, anything else is kept as the string."""
    if isinstance(current, str):
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if isinstance(parsed, float) and not math.isfinite(parsed):
        return text
    if isinstance(parsed, bool | int | float | list):
        return parsed
    return text


def _read_file(path: Path, explicit: bool) -> dict[str, Any] | None:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"configuration file not found: {path}", source=str(path)) from None
        return None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}", source=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}", source=str(path)) from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    search_default: bool = True,
) -> Config:
    """Read ``path`` (or ./outboxd.toml when present and ``search_default``) and ``env``
    (default os.environ); validate everything; raise ConfigError naming the first bad key."""
    env = os.environ if env is None else env
    file_path = Path(path) if path is not None else Path(DEFAULT_FILE).absolute()
    data = None
    if path is not None or search_default:
        data = _read_file(file_path, explicit=path is not None)
    source = str(file_path) if data is not None else None
    data = data or {}

    values: dict[str, dict[str, _Value]] = {name: {} for name in _SECTIONS}
    for section, table in data.items():
        if section not in _SECTIONS and section != "providers":
            raise _error(section, f"unknown section [{section}]", source)
        if not isinstance(table, dict):
            raise _error(section, f"[{section}] must be a table", source)
        if section == "providers":
            continue
        names = {f.name for f in dataclasses.fields(_SECTIONS[section])}
        for key, value in table.items():
            if key not in names:
                raise _error(f"{section}.{key}", "unknown key", source)
            values[section][key] = (value, source, False)

    providers: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str | None] = {}
    for name, table in data.get("providers", {}).items():
        if not isinstance(table, dict):
            raise _error(f"providers.{name}", "must be a table [providers.NAME]", source)
        providers[name] = dict(table)
        origin.update({(name, key): source for key in table})
    env_names = {n: re.sub(r"[^A-Z0-9]", "_", n.upper()) for n in providers}

    for var in sorted(env):
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        section, _, rest = upper[len(ENV_PREFIX) :].partition("_")
        section = section.lower()
        if section in _SECTIONS:
            key = rest.lower()
            if key not in {f.name for f in dataclasses.fields(_SECTIONS[section])}:
                raise _error(f"{section}.{key}", "unknown key", var)
            values[section][key] = (env[var], var, True)
        elif section == "providers":
            matches = sorted(
                (n for n, e in env_names.items() if rest.startswith(e + "_")),
                key=lambda n: -len(env_names[n]),
            )
            if not matches or len(rest) <= len(env_names[matches[0]]) + 1:
                raise _error(
                    f"providers.{rest.lower()}",
                    f"environment variable {var} names no provider defined in the "
                    "configuration file",
                    var,
                )
            if sum(env_names[n] == env_names[matches[0]] for n in matches) > 1:
                raise _error(f"providers.{matches[0]}", f"{var} matches several providers", var)
            name, key = matches[0], rest[len(env_names[matches[0]]) + 1 :].lower()
            current = providers[name].get(key)
            if key == "headers" or isinstance(current, dict):
                raise _error(
                    f"providers.{name}.{key}",
                    "is a table and cannot be set from the environment",
                    var,
                )
            providers[name][key] = _env_provider_value(env[var], current)
            origin[(name, key)] = var

    for name, table in providers.items():
        kind = table.get("kind")
        if not isinstance(kind, str) or not kind.strip():
            raise _error(
                f"providers.{name}.kind",
                "is required and must be a non-empty string",
                origin.get((name, "kind"), source),
            )
        protected = table.get(PROTECT_KEY, False)
        if not isinstance(protected, bool):
            raise _error(
                f"providers.{name}.{PROTECT_KEY}",
                "must be a boolean (true or false)",
                origin.get((name, PROTECT_KEY), source),
            )
        headers = table.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise _error(
                f"providers.{name}.headers",
                "invalid value (a table of strings is required)",
                source,
            )

    sections = {name: _build(name, values[name]) for name in _SECTIONS}
    if sections["database"].schema is not None and sections["database"].url.startswith("sqlite"):
        raise _error(
            "database.schema", "is only supported with PostgreSQL", values["database"]["schema"][1]
        )
    _check_protection(sections["protection"], providers, values["protection"], origin, source)
    return Config(**sections, providers=_freeze(providers), source=source)


def _check_protection(
    prot: ProtectionConfig,
    providers: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, _Value],
    origin: Mapping[tuple[str, str], str | None],
    source: str | None,
) -> None:
    def where(key: str) -> str | None:
        return values[key][1] if key in values else source

    if prot.keys and prot.active_key is None:
        raise _error("protection.active_key", "is required when keys are given", where("keys"))
    if prot.active_key is not None and prot.active_key not in prot.keys:
        raise _error(
            "protection.active_key", "names no key of protection.keys", where("active_key")
        )
    for name, table in providers.items():
        if table.get(PROTECT_KEY) is True and not prot.keys:
            raise _error(
                f"providers.{name}.{PROTECT_KEY}",
                "needs [protection] keys and active_key",
                origin.get((name, PROTECT_KEY), source),
            )


def protection_of(cfg: Config, environ: Mapping[str, str] | None = None) -> Protection | None:
    """The key ring and protected providers of ``cfg``, with the keys resolved (a missing
    variable or file, or a malformed key, is a ConfigError naming the key id and the
    reference, never the value); None when ``[protection]`` has no keys."""
    if not cfg.protection.keys or cfg.protection.active_key is None:
        return None
    from outbox.protect import Protection

    return Protection.from_references(
        cfg.protection.keys, cfg.protection.active_key, cfg.protected_providers(), environ
    )


def redact_url(url: str) -> str:
    """Hide a password in a URL's user part or query string."""
    url = re.sub(r"(://[^/@:]*:)[^/@]*@", rf"\1{REDACTED}@", url)
    return re.sub(r"(?i)((?:password|passwd|token|secret|api_?key)=)[^&]*", rf"\1{REDACTED}", url)


def _plain(key: str, value: Any) -> Any:
    if isinstance(value, Mapping):
        if key == "headers":
            return dict.fromkeys(value, REDACTED)
        return {k: _plain(k, v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(key, v) for v in value]
    if _SECRETISH.search(key):
        return REDACTED
    return redact_url(value) if isinstance(value, str) and "://" in value else value


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """A JSON-serialisable view for ``outboxd status`` and debugging, credentials redacted."""
    out: dict[str, Any] = {name: dataclasses.asdict(getattr(cfg, name)) for name in _SECTIONS}
    out["database"]["url"] = redact_url(cfg.database.url)
    out["providers"] = {name: _plain(name, table) for name, table in cfg.providers.items()}
    out["source"] = cfg.source
    return out
