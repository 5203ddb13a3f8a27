"""Configuration: one TOML file plus ``OUTBOXD_<SECTION>_<KEY>`` variables, validated once.

:func:`load_config` returns a frozen :class:`Config`. Precedence: defaults < file < environment.
Every problem (unknown section or key, wrong type, out of range) is a
:class:`~outbox.errors.ConfigError` naming the key as ``section.key`` and its source (file path
or variable name). Values of credential-like keys are never echoed. See docs/configuration.md.

This module reads and validates; the sections are in :mod:`dispatcher.config.sections`, value
conversion in :mod:`dispatcher.config.values`, redaction in :mod:`dispatcher.config.redaction`.
Import from here: every public name of those modules is re-exported.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from dispatcher.config.redaction import REDACTED, config_error, config_to_dict, redact_url
from dispatcher.config.sections import (
    PROTECT_KEY,
    SECTIONS,
    ArtifactsConfig,
    Config,
    DatabaseConfig,
    DispatcherConfig,
    MetricsConfig,
    ProtectionConfig,
    RetentionConfig,
    TracingConfig,
)
from dispatcher.config.values import RawValue, build_section, env_provider_value, freeze
from outbox import db
from outbox.errors import ConfigError

if TYPE_CHECKING:
    from outbox.protection.envelopes import Protection

__all__ = [
    "DEFAULT_FILE",
    "ENV_PREFIX",
    "PROTECT_KEY",
    "REDACTED",
    "ArtifactsConfig",
    "Config",
    "DatabaseConfig",
    "DispatcherConfig",
    "MetricsConfig",
    "ProtectionConfig",
    "RetentionConfig",
    "TracingConfig",
    "config_to_dict",
    "load_config",
    "protection_of",
    "redact_url",
]

DEFAULT_FILE = "outboxd.toml"
ENV_PREFIX = "OUTBOXD_"


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

    values: dict[str, dict[str, RawValue]] = {name: {} for name in SECTIONS}
    for section, table in data.items():
        if section not in SECTIONS and section != "providers":
            raise config_error(section, f"unknown section [{section}]", source)
        if not isinstance(table, dict):
            raise config_error(section, f"[{section}] must be a table", source)
        if section == "providers":
            continue
        names = {f.name for f in dataclasses.fields(SECTIONS[section])}
        for key, value in table.items():
            if key not in names:
                raise config_error(f"{section}.{key}", "unknown key", source)
            values[section][key] = (value, source, False)

    providers: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str | None] = {}
    for name, table in data.get("providers", {}).items():
        if not isinstance(table, dict):
            raise config_error(f"providers.{name}", "must be a table [providers.NAME]", source)
        providers[name] = dict(table)
        origin.update({(name, key): source for key in table})
    env_names = {n: re.sub(r"[^A-Z0-9]", "_", n.upper()) for n in providers}

    for var in sorted(env):
        upper = var.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        section, _, rest = upper[len(ENV_PREFIX) :].partition("_")
        section = section.lower()
        if section in SECTIONS:
            key = rest.lower()
            if key not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
                raise config_error(f"{section}.{key}", "unknown key", var)
            values[section][key] = (env[var], var, True)
        elif section == "providers":
            matches = sorted(
                (n for n, e in env_names.items() if rest.startswith(e + "_")),
                key=lambda n: -len(env_names[n]),
            )
            if not matches or len(rest) <= len(env_names[matches[0]]) + 1:
                raise config_error(
                    f"providers.{rest.lower()}",
                    f"environment variable {var} names no provider defined in the "
                    "configuration file",
                    var,
                )
            if sum(env_names[n] == env_names[matches[0]] for n in matches) > 1:
                raise config_error(
                    f"providers.{matches[0]}", f"{var} matches several providers", var
                )
            name, key = matches[0], rest[len(env_names[matches[0]]) + 1 :].lower()
            current = providers[name].get(key)
            if key == "headers" or isinstance(current, dict):
                raise config_error(
                    f"providers.{name}.{key}",
                    "is a table and cannot be set from the environment",
                    var,
                )
            providers[name][key] = env_provider_value(env[var], current)
            origin[(name, key)] = var

    for name, table in providers.items():
        kind = table.get("kind")
        if not isinstance(kind, str) or not kind.strip():
            raise config_error(
                f"providers.{name}.kind",
                "is required and must be a non-empty string",
                origin.get((name, "kind"), source),
            )
        protected = table.get(PROTECT_KEY, False)
        if not isinstance(protected, bool):
            raise config_error(
                f"providers.{name}.{PROTECT_KEY}",
                "must be a boolean (true or false)",
                origin.get((name, PROTECT_KEY), source),
            )
        headers = table.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise config_error(
                f"providers.{name}.headers",
                "invalid value (a table of strings is required)",
                source,
            )

    sections = {name: build_section(name, values[name]) for name in SECTIONS}
    if sections["database"].schema is not None and sections["database"].url.startswith("sqlite"):
        raise config_error(
            "database.schema", "is only supported with PostgreSQL", values["database"]["schema"][1]
        )
    d = sections["database"]
    for key, set_ in (("pooler", d.pooler != "none"), ("listen_url", d.listen_url is not None),
                      ("options", bool(d.options)),
                      ("synchronous_commit", d.synchronous_commit != "server")):
        if set_ and d.url.startswith("sqlite"):
            raise config_error(f"database.{key}", "is only supported with PostgreSQL",
                               values["database"][key][1])
    if d.url.startswith("postgresql"):
        try:  # the URL's query and the options together, as the engine will read them
            db.driver_options(make_url(d.url), d.options, d.pooler)
        except ValueError as exc:
            why = (" (a prepared statement's name would resolve on another client's server"
                   " connection)" if d.pooler == "transaction" else "")
            raise config_error("database.options", f"{exc}{why}", source) from None
    _check_protection(sections["protection"], providers, values["protection"], origin, source)
    return Config(**sections, providers=freeze(providers), source=source)


def _check_protection(
    prot: ProtectionConfig,
    providers: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, RawValue],
    origin: Mapping[tuple[str, str], str | None],
    source: str | None,
) -> None:
    def where(key: str) -> str | None:
        return values[key][1] if key in values else source

    if prot.keys and prot.active_key is None:
        raise config_error(
            "protection.active_key", "is required when keys are given", where("keys")
        )
    if prot.active_key is not None and prot.active_key not in prot.keys:
        raise config_error(
            "protection.active_key", "names no key of protection.keys", where("active_key")
        )
    for name, table in providers.items():
        if table.get(PROTECT_KEY) is True and not prot.keys:
            raise config_error(
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
    from outbox.protection.envelopes import Protection

    return Protection.from_references(
        cfg.protection.keys, cfg.protection.active_key, cfg.protected_providers(), environ
    )

