"""Configuration sections: one frozen dataclass per TOML table, with each key's default,
bounds and checks in its field metadata, and :class:`Config`, the validated whole."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PROTECT_KEY = "protect_payloads"
"""The per-provider switch ``[providers.NAME] protect_payloads``: read by this configuration,
not by the provider registry (it is the dispatcher's business, not the receiver's)."""


def _check_db_url(url: str) -> str:
    """Normalise postgres:// and postgresql:// to postgresql+psycopg://; never echo the URL."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        raise ValueError("must be a URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB")
    if scheme.lower() in ("postgres", "postgresql", "postgresql+psycopg"):
        from sqlalchemy.engine import make_url

        from outbox.db import normalise_url

        url = normalise_url("postgresql+psycopg://" + rest)
        try:
            make_url(url)
        except ValueError:  # the reason would quote the URL: say what to write instead
            raise ValueError(
                "cannot be read (a port that is not a number?); several hosts are written "
                "postgresql://USER@HOST1:PORT1,HOST2:PORT2/DB?target_session_attrs=read-write"
            ) from None
        return url
    if scheme.lower() in ("sqlite", "sqlite+pysqlite"):
        return url.strip()
    raise ValueError(f"has unsupported scheme {scheme!r} (use sqlite:/// or postgresql+psycopg://)")


def _check_identifier(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError("must be an SQL identifier (letter or _, then letters, digits, _; <= 63)")
    return name


def _check_options(options: Mapping[str, str]) -> Mapping[str, str]:
    """Each key a libpq connection option (or psycopg's prepare_threshold)."""
    import psycopg.conninfo

    for key, value in options.items():
        if key == "prepare_threshold":
            if value.strip().lower() != "none" and not value.strip().isdigit():
                raise ValueError('prepare_threshold must be an integer >= 0 or "none"')
            continue
        try:
            psycopg.conninfo.make_conninfo("", **{key: value})
        except psycopg.ProgrammingError:
            raise ValueError(f"{key!r} is not a libpq connection option") from None
    return options


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
    pooler: str = field(
        default="none", metadata={"choices": ("none", "session", "transaction")}
    )
    """What sits between the replicas and PostgreSQL. transaction (PgBouncer's
    pool_mode = transaction): nothing is prepared server-side (a statement name would
    resolve to another client's statement), the schema is set per transaction, and LISTEN
    goes over listen_url or is off (polling, with a warning). session: as none."""
    listen_url: str | None = field(default=None, metadata={"check": _check_db_url})
    """PostgreSQL URL for the LISTEN connection only (direct, or through a session pooler),
    when url goes through a transaction pooler; None: the same server as url."""
    options: Mapping[str, str] = field(default_factory=dict, metadata={"check": _check_options})
    """libpq connection options passed to the driver as they are (application_name,
    sslmode, sslrootcert, target_session_attrs, ...), plus psycopg's prepare_threshold
    (an integer, or "none" for never)."""
    standbys: str = field(
        default="require-synchronous",
        metadata={"choices": ("require-synchronous", "accept-asynchronous")},
    )
    """PostgreSQL with standbys attached: require-synchronous refuses to start unless commits
    wait for a standby (synchronous_standby_names), since a failover to an asynchronous one
    loses the marks that prevent a second send; accept-asynchronous runs anyway and says so
    (start-up log, /readyz, outbox_replication_asynchronous)."""
    synchronous_commit: str = field(
        default="server",
        metadata={"choices": ("server", "on", "remote_write", "remote_apply")},
    )
    """PostgreSQL: how far each of outboxd's commits (claims, dispatching marks, receipts)
    waits for the synchronous standbys before it returns. server: the server's setting.
    remote_write: a standby has the commit in memory (survives the primary's crash);
    on: flushed to its disk (survives both crashing); remote_apply: also visible there.
    Set per transaction under pooler = transaction, per connection otherwise."""
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

    def engine_args(self) -> dict[str, Any]:
        """What :func:`outbox.db.create_engine` takes from this section besides the URL."""
        return {"schema": self.schema, "pool_size": self.pool_size,
                "connect_timeout": self.connect_timeout_seconds, "pooler": self.pooler,
                "options": self.options,
                "synchronous_commit": (None if self.synchronous_commit == "server"
                                       else self.synchronous_commit)}


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
class TracingConfig:
    enabled: bool = False
    """Each dispatch attempt is an OpenTelemetry span under the agent's trace (the tracing
    extra). Off: nothing of OpenTelemetry is imported; the row's traceparent still travels."""
    exporter: str = field(default="otlp", metadata={"choices": ("otlp", "console")})
    """otlp: OTLP over HTTP, configured by the standard OTEL_EXPORTER_OTLP_* variables;
    console: spans printed to stdout (trying it out)."""
    service_name: str = field(default="outboxd", metadata={"check": _check_nonempty})
    """The spans' service.name resource attribute."""


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
    tracing: TracingConfig = field(default_factory=TracingConfig)

    def protected_providers(self) -> frozenset[str]:
        """Providers with ``protect_payloads = true``."""
        return frozenset(n for n, t in self.providers.items() if t.get(PROTECT_KEY) is True)


SECTIONS: dict[str, type[Any]] = {
    "database": DatabaseConfig,
    "dispatcher": DispatcherConfig,
    "metrics": MetricsConfig,
    "retention": RetentionConfig,
    "artifacts": ArtifactsConfig,
    "protection": ProtectionConfig,
    "tracing": TracingConfig,
}
