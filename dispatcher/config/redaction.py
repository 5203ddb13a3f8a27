"""Configuration as shown to people: error messages that name ``section.key`` and its source,
and the ``outboxd status`` view; neither ever shows a credential-like value."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from dispatcher.config.sections import SECTIONS, Config
from outbox.errors import ConfigError

REDACTED = "<redacted>"
_SECRETISH = re.compile(r"(?i)pass(word|wd)?|secret|token|credential|api_?key|auth|private")


def config_error(key: str, problem: str, source: str | None) -> ConfigError:
    """The error for ``key``: ``section.key: problem``, with where the value came from."""
    return ConfigError(f"{key}: {problem}", key=key, source=source)


def echo_value(key: str, value: Any) -> str:
    """``, got VALUE`` for an error message, or nothing when ``key`` may hold a credential."""
    if (key in ("database.url", "database.listen_url", "database.options")
            or key.startswith("protection.") or _SECRETISH.search(key)):
        return ""
    return f", got {value!r}"


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
    out: dict[str, Any] = {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}
    out["database"] = {k: _plain(k, v) for k, v in out["database"].items()}
    out["providers"] = {name: _plain(name, table) for name, table in cfg.providers.items()}
    out["source"] = cfg.source
    return out
