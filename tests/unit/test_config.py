"""dispatcher.config: defaults, file, environment overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from dispatcher.config import (
    Config,
    DatabaseConfig,
    DispatcherConfig,
    MetricsConfig,
    RetentionConfig,
    config_to_dict,
    load_config,
)
from outbox.errors import ConfigError

PROVIDER = """
[providers.tickets]
kind = "http"
url = "http://127.0.0.1:8080/tickets"
max_attempts = 8
timeout_seconds = 10
payload_schemas = [1, 2]
headers = { Authorization = "Bearer sk-live-SECRETVALUE" }
"""


def write(tmp_path: Path, text: str, name: str = "outboxd.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_for(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    return info.value


# --- defaults -----------------------------------------------------------------------------


def test_defaults_with_no_file_and_no_env(tmp_path: Path) -> None:
    cfg = load_config(None, {}, search_default=False)
    assert cfg.database == DatabaseConfig()
    assert cfg.database.url == "sqlite:///outbox.db"
    assert cfg.dispatcher == DispatcherConfig()
    assert cfg.dispatcher.batch_size == 100 and cfg.dispatcher.concurrency == 32
    assert cfg.metrics == MetricsConfig()
    assert cfg.metrics.port == 9464 and cfg.metrics.host == "127.0.0.1"
    assert cfg.retention == RetentionConfig() and cfg.retention.enabled is False
    assert dict(cfg.providers) == {}
    assert cfg.source is None


def test_default_file_in_working_directory_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "[dispatcher]\nbatch_size = 7\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, {})
    assert cfg.dispatcher.batch_size == 7
    assert cfg.source is not None and Path(cfg.source) == tmp_path / "outboxd.toml"
    assert load_config(None, {}, search_default=False).dispatcher.batch_size == 100


def test_missing_default_file_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(None, {}).source is None


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, PROVIDER), {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dispatcher.batch_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.providers["tickets"]["kind"] = "x"  # type: ignore[index]


# --- file and environment -----------------------------------------------------------------


def test_file_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[database]
url = "sqlite:///data/x.db"
pool_size = 3
connect_timeout_seconds = 2      # an int for a float field is accepted
[dispatcher]
batch_size = 50
dedup_safety_margin = 0.25
log_level = "debug"
log_format = "json"
worker_id = "w1"
[metrics]
enabled = false
port = 0
[retention]
enabled = true
payload_days = 7.5
"""
        + PROVIDER,
    )
    cfg = load_config(path, {})
    assert isinstance(cfg, Config)
    assert cfg.source == str(path)
    assert cfg.database.url == "sqlite:///data/x.db" and cfg.database.pool_size == 3
    assert cfg.database.connect_timeout_seconds == 2.0
    assert isinstance(cfg.database.connect_timeout_seconds, float)
    assert cfg.dispatcher.batch_size == 50 and cfg.dispatcher.dedup_safety_margin == 0.25
    assert cfg.dispatcher.log_level == "DEBUG" and cfg.dispatcher.log_format == "json"
    assert cfg.dispatcher.worker_id == "w1"
    assert cfg.metrics.enabled is False and cfg.metrics.port == 0
    assert cfg.retention.enabled is True and cfg.retention.payload_days == 7.5
    tickets = cfg.providers["tickets"]
    assert tickets["kind"] == "http" and tickets["max_attempts"] == 8
    assert tickets["payload_schemas"] == [1, 2]


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[dispatcher]\nbatch_size = 50\n[metrics]\nport = 9000\n")
    env = {
        "OUTBOXD_DATABASE_URL": "postgresql+psycopg://u@db/outbox",
        "OUTBOXD_DATABASE_SCHEMA": "outbox",
        "OUTBOXD_DISPATCHER_BATCH_SIZE": "500",
        "OUTBOXD_DISPATCHER_LEASE_SECONDS": "12.5",
        "OUTBOXD_DISPATCHER_WORKER_ID": "",
        "OUTBOXD_METRICS_PORT": "0",
        "OUTBOXD_METRICS_ENABLED": "no",
        "OUTBOXD_RETENTION_ENABLED": "YES",
        "OUTBOXD_CONFIG": "ignored: not a configuration section",
        "PATH": "/usr/bin",
    }
    cfg = load_config(path, env)
    assert cfg.database.url == "postgresql+psycopg://u@db/outbox"
    assert cfg.database.schema == "outbox"
    assert cfg.dispatcher.batch_size == 500
    assert cfg.dispatcher.lease_seconds == 12.5
    assert cfg.dispatcher.worker_id is None
    assert cfg.metrics.port == 0 and cfg.metrics.enabled is False
    assert cfg.retention.enabled is True


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("1", True), ("yes", True), ("false", False), ("0", False), ("No", False)],
)
def test_env_booleans(text: str, expected: bool) -> None:
    cfg = load_config(None, {"OUTBOXD_METRICS_ENABLED": text}, search_default=False)
    assert cfg.metrics.enabled is expected


def test_env_without_file(tmp_path: Path) -> None:
    cfg = load_config(None, {"OUTBOXD_DISPATCHER_CONCURRENCY": "4"}, search_default=False)
    assert cfg.dispatcher.concurrency == 4 and cfg.source is None


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u:pw@db:5432/outbox",
        "postgresql://u:pw@db:5432/outbox",
        "postgresql+psycopg://u:pw@db:5432/outbox",
    ],
)
def test_postgres_url_normalised(url: str) -> None:
    cfg = load_config(None, {"OUTBOXD_DATABASE_URL": url}, search_default=False)
    assert cfg.database.url == "postgresql+psycopg://u:pw@db:5432/outbox"


def test_provider_env_override(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        PROVIDER
        + """
[providers.tickets_eu]
kind = "http"
url = "http://eu.example/tickets"
max_attempts = 3
""",
    )
    env = {
        "OUTBOXD_PROVIDERS_TICKETS_URL": "http://override/tickets",
        "OUTBOXD_PROVIDERS_TICKETS_MAX_ATTEMPTS": "5",
        "OUTBOXD_PROVIDERS_TICKETS_EU_MAX_ATTEMPTS": "9",  # longest provider name wins
        "OUTBOXD_PROVIDERS_TICKETS_EU_TIMEOUT_SECONDS": "2.5",
        "OUTBOXD_PROVIDERS_TICKETS_FENCING": "true",
        "OUTBOXD_PROVIDERS_TICKETS_LOOKUP_CONSISTENCY": "strong",
    }
    cfg = load_config(path, env)
    tickets, eu = cfg.providers["tickets"], cfg.providers["tickets_eu"]
    assert tickets["url"] == "http://override/tickets"
    assert tickets["max_attempts"] == 5
    assert tickets["fencing"] is True
    assert tickets["lookup_consistency"] == "strong"
    assert eu["max_attempts"] == 9 and eu["timeout_seconds"] == 2.5
    assert "eu_max_attempts" not in tickets


def test_provider_env_keeps_strings_where_file_has_strings(tmp_path: Path) -> None:
    path = write(tmp_path, '[providers.q]\nkind = "nats"\nsubject = "a"\n')
    cfg = load_config(path, {"OUTBOXD_PROVIDERS_Q_SUBJECT": "123"})
    assert cfg.providers["q"]["subject"] == "123"


def test_config_to_dict_redacts_credentials(tmp_path: Path) -> None:
    path = write(tmp_path, PROVIDER)
    env = {"OUTBOXD_DATABASE_URL": "postgres://app:hunter2@db/outbox"}
    out = config_to_dict(load_config(path, env))
    text = json.dumps(out)  # serialisable
    assert "hunter2" not in text and "SECRETVALUE" not in text
    assert out["providers"]["tickets"]["headers"] == {"Authorization": "<redacted>"}
    assert out["providers"]["tickets"]["payload_schemas"] == [1, 2]
    assert out["database"]["url"] == "postgresql+psycopg://app:<redacted>@db/outbox"
    assert out["dispatcher"]["batch_size"] == 100
    assert out["source"] == str(path)


# --- errors name the key and the source -------------------------------------------------


def test_unknown_section(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[databse]\nurl = 'sqlite:///x.db'\n")
    assert "databse" in str(err) and str(tmp_path) in str(err)


def test_unknown_key_in_file(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[dispatcher]\nbatchsize = 10\n")
    assert err.fields["key"] == "dispatcher.batchsize"
    assert "dispatcher.batchsize" in str(err) and "outboxd.toml" in str(err)


def test_section_must_be_a_table(tmp_path: Path) -> None:
    err = error_for(tmp_path, "metrics = 1\n")
    assert "metrics" in str(err)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[dispatcher]\nbatch_size = '100'\n", "dispatcher.batch_size"),
        ("[dispatcher]\nbatch_size = 1.5\n", "dispatcher.batch_size"),
        ("[metrics]\nenabled = 'yes'\n", "metrics.enabled"),
        ("[metrics]\nport = true\n", "metrics.port"),
        ("[metrics]\nhost = 1\n", "metrics.host"),
        ("[dispatcher]\nlease_seconds = 'soon'\n", "dispatcher.lease_seconds"),
        ("[dispatcher]\nlease_seconds = nan\n", "dispatcher.lease_seconds"),
    ],
)
def test_wrong_type_names_key(tmp_path: Path, text: str, key: str) -> None:
    err = error_for(tmp_path, text)
    assert key in str(err) and err.fields["key"] == key
    assert err.fields["source"] == str(tmp_path / "outboxd.toml")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[dispatcher]\nbatch_size = 0\n", "dispatcher.batch_size"),
        ("[dispatcher]\nbatch_size = 10001\n", "dispatcher.batch_size"),
        ("[dispatcher]\nconcurrency = 2000\n", "dispatcher.concurrency"),
        ("[dispatcher]\nlease_seconds = 0\n", "dispatcher.lease_seconds"),
        ("[dispatcher]\ndedup_safety_margin = 1.0\n", "dispatcher.dedup_safety_margin"),
        ("[dispatcher]\nshutdown_grace_seconds = -1\n", "dispatcher.shutdown_grace_seconds"),
        ("[dispatcher]\nlog_level = 'LOUD'\n", "dispatcher.log_level"),
        ("[dispatcher]\nlog_format = 'xml'\n", "dispatcher.log_format"),
        ("[metrics]\nport = 70000\n", "metrics.port"),
        ("[database]\npool_size = 0\n", "database.pool_size"),
        ("[database]\nmax_payload_bytes = 0\n", "database.max_payload_bytes"),
        ("[database]\nschema = 'bad-name'\nurl = 'postgres://h/d'\n", "database.schema"),
        ("[database]\nschema = 'outbox'\n", "database.schema"),  # not with SQLite
        ("[database]\nurl = 'mysql://h/d'\n", "database.url"),
        ("[retention]\npayload_days = 0\n", "retention.payload_days"),
    ],
)
def test_out_of_range_names_key(tmp_path: Path, text: str, key: str) -> None:
    err = error_for(tmp_path, text)
    assert err.fields["key"] == key and key in str(err)


def test_out_of_range_message_states_range(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[dispatcher]\nbatch_size = 0\n")
    assert ">= 1" in str(err) and "<= 10000" in str(err) and "got 0" in str(err)


def test_bad_database_url_is_not_echoed(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[database]\nurl = 'mysql://root:hunter2@h/d'\n")
    assert "hunter2" not in str(err) and "mysql" in str(err)


def test_bad_env_value_names_key_and_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"OUTBOXD_METRICS_PORT": "ninety"}, search_default=False)
    assert info.value.fields["key"] == "metrics.port"
    assert "metrics.port" in str(info.value) and "OUTBOXD_METRICS_PORT" in str(info.value)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("OUTBOXD_METRICS_ENABLED", "maybe"),
        ("OUTBOXD_DISPATCHER_LEASE_SECONDS", "inf"),
        ("OUTBOXD_DISPATCHER_BATCH_SIZE", ""),
        ("OUTBOXD_DISPATCHER_BATCH_SIZE", "0"),
    ],
)
def test_bad_env_values(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {var: value}, search_default=False)
    assert info.value.fields["source"] == var


def test_unknown_env_var_for_known_section() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"OUTBOXD_DISPATCHER_BATCHSIZE": "10"}, search_default=False)
    assert info.value.fields["key"] == "dispatcher.batchsize"
    assert "OUTBOXD_DISPATCHER_BATCHSIZE" in str(info.value)


def test_env_for_undefined_provider(tmp_path: Path) -> None:
    err = error_for(tmp_path, PROVIDER, {"OUTBOXD_PROVIDERS_BILLING_URL": "http://x"})
    assert "OUTBOXD_PROVIDERS_BILLING_URL" in str(err)


def test_env_cannot_replace_headers(tmp_path: Path) -> None:
    err = error_for(tmp_path, PROVIDER, {"OUTBOXD_PROVIDERS_TICKETS_HEADERS": "tok-SECRET"})
    assert err.fields["key"] == "providers.tickets.headers" and "tok-SECRET" not in str(err)


def test_missing_provider_kind(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[providers.tickets]\nurl = 'http://x'\n")
    assert err.fields["key"] == "providers.tickets.kind" and "providers.tickets.kind" in str(err)


def test_non_string_provider_kind(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[providers.tickets]\nkind = 3\n")
    assert err.fields["key"] == "providers.tickets.kind"


def test_bad_header_value_is_not_echoed(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[providers.t]\nkind = 'http'\nheaders = 'Bearer sk-SECRET'\n")
    assert err.fields["key"] == "providers.t.headers"
    assert "invalid value" in str(err) and "sk-SECRET" not in str(err)


def test_explicit_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, {})
    assert str(missing) in str(info.value)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[dispatcher\nbatch_size = \n", name="broken.toml")
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert str(path) in str(info.value) and "TOML" in str(info.value)


def test_directory_as_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, {})
    assert str(tmp_path) in str(info.value)


def test_env_none_reads_os_environ() -> None:
    # No monkeypatching: whatever the process has, OUTBOXD_* aside, must load.
    if any(k.upper().startswith("OUTBOXD_") for k in os.environ):
        pytest.skip("the test process has OUTBOXD_* variables set")
    assert load_config(None, None, search_default=False).database.url == "sqlite:///outbox.db"


# --- poolers and driver options ---------------------------------------------------------------


def test_database_options_reach_the_engine_as_driver_arguments(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from outbox import db

    path = write(tmp_path, '[database]\nurl = "postgresql://u@h/d?prepare_threshold=0"\n'
                 'pooler = "session"\n'
                 'options = { application_name = "outboxd-a", sslmode = "prefer" }\n')
    d = load_config(path, {}).database
    assert d.pooler == "session" and d.options["application_name"] == "outboxd-a"
    # the URL's prepare_threshold (not a libpq option) becomes psycopg's integer
    url, args = db.driver_options(sa.engine.make_url(db.normalise_url(d.url)), d.options,
                                  d.pooler)
    assert args == {"application_name": "outboxd-a", "sslmode": "prefer",
                    "prepare_threshold": 0}
    assert "prepare_threshold" not in url.query
    # nothing said: never prepare, with a pooler or without
    for pooler in ("transaction", "session", "none"):
        _, args = db.driver_options(sa.engine.make_url("postgresql+psycopg://u@h/d"), {},
                                    pooler)
        assert args == {"prepare_threshold": None}


@pytest.mark.parametrize(("text", "says"), [
    ('url = "postgresql://u@h/d"\noptions = { sslmod = "require" }',
     "'sslmod' is not a libpq connection option"),
    ('options = { prepare_threshold = "soon" }', "prepare_threshold must be an integer"),
    ("options = { connect_timeout = 10 }", "must be a table of strings"),
    ('pooler = "statement"', "must be one of none, session, transaction"),
    ('pooler = "session"', "database.pooler: is only supported with PostgreSQL"),
    ('synchronous_commit = "remote_apply"',
     "database.synchronous_commit: is only supported with PostgreSQL"),
    ('url = "postgresql://u@h/d"\nsynchronous_commit = "off"',
     "must be one of server, on, remote_write, remote_apply"),
    ('url = "postgresql://u@h/d"\npooler = "transaction"\n'
     'options = { prepare_threshold = "5" }',
     'prepare_threshold cannot be used with pooler = "transaction"'),
    ('url = "postgresql://u@h/d?prepare_threshold=5"\npooler = "transaction"',
     'prepare_threshold cannot be used with pooler = "transaction"'),
])
def test_bad_database_options_name_what_to_fix(tmp_path: Path, text: str, says: str) -> None:
    err = error_for(tmp_path, f"[database]\n{text}\n")
    assert says in str(err) and err.fields["key"].startswith("database.")


def test_listen_url_and_option_credentials_are_redacted(tmp_path: Path) -> None:
    path = write(tmp_path, PROVIDER + '[database]\nurl = "postgresql://a:pw1@h/d"\n'
                 'listen_url = "postgresql://a:pw2@h2/d"\n'
                 'options = { sslpassword = "pw3", application_name = "x" }\n')
    text = json.dumps(config_to_dict(load_config(path, {})))
    assert "pw1" not in text and "pw2" not in text and "pw3" not in text
    assert '"application_name": "x"' in text
