"""Reading one ``[providers.NAME]`` table: typed keys, errors that name the key.

Every provider kind reads its section through a :class:`SectionReader`, which takes keys
one by one with their types and defaults and, at the end, refuses any key nobody took.
Error messages name ``providers.NAME.KEY`` and never echo the value (it may be a
credential written where it should not be).

:func:`read_capabilities` reads the keys common to every kind and returns the declared
:class:`~providers.base.Capabilities`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from outbox.errors import ProviderConfigError
from providers.base import Capabilities, LookupConsistency

COMMON_KEYS = (
    "dedup_retention_seconds",
    "lookup_consistency",
    "lookup_settle_seconds",
    "in_flight_seconds",
    "fencing",
    "payload_schemas",
    "max_attempts",
    "max_elapsed_seconds",
    "retry_max_delay_seconds",
    "timeout_seconds",
    "workflow_versions",
    "policy",
)


class SectionReader:
    """Typed access to one raw provider table; :meth:`finish` rejects unread keys."""

    def __init__(self, name: str, section: Mapping[str, Any]) -> None:
        self.name = name
        self._section = dict(section)
        # protect_payloads is the dispatcher's (dispatcher.config), not the receiver's
        self._taken: set[str] = {"kind", "protect_payloads"}

    def key(self, key: str) -> str:
        return f"providers.{self.name}.{key}"

    def error(self, key: str, problem: str) -> ProviderConfigError:
        return ProviderConfigError(f"{self.key(key)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self._section

    def raw(self, key: str) -> Any:
        self._taken.add(key)
        return self._section.get(key)

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self.raw(key)
        if value is None:
            if required or default is None:
                raise self.error(key, "is required")
            return default
        if not isinstance(value, str) or not value:
            raise self.error(key, "must be a non-empty string")
        return value

    def optional_string(self, key: str) -> str | None:
        if self._section.get(key) is None:
            self._taken.add(key)
            return None
        return self.string(key, required=True)

    def number(
        self,
        key: str,
        default: float,
        *,
        minimum: float = 0.0,
        exclusive_minimum: bool = False,
    ) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, "must be a number")
        number = float(value)
        too_small = number <= minimum if exclusive_minimum else number < minimum
        if not math.isfinite(number) or too_small:
            relation = ">" if exclusive_minimum else ">="
            raise self.error(key, f"must be a finite number {relation} {minimum:g}")
        return number

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "must be an integer")
        if value < minimum:
            raise self.error(key, f"must be an integer >= {minimum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "must be true or false")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(repr(c) for c in choices)}")
        return value

    def table(self, key: str) -> Mapping[str, Any]:
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(key, "must be a table")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self._section) - self._taken)
        if unknown:
            raise self.error(unknown[0], "unknown key")


def read_capabilities(
    reader: SectionReader,
    *,
    lookup_available: bool,
    default_retention: float = 0.0,
    default_consistency: LookupConsistency = LookupConsistency.NONE,
) -> Capabilities:
    """Read the common capability keys; refuse declarations the provider cannot honour.

    ``lookup_available``: the provider has a way to look effects up. Without one the only
    honest ``lookup_consistency`` is ``"none"``. ``default_retention`` defaults to 0 (the
    receiver is not trusted to deduplicate, so no ambiguous attempt is ever re-sent
    blindly): the safe reading of a silent configuration.
    """
    retention = reader.number("dedup_retention_seconds", default_retention)
    consistency = LookupConsistency(
        reader.choice(
            "lookup_consistency",
            default_consistency.value if lookup_available else LookupConsistency.NONE.value,
            tuple(c.value for c in LookupConsistency),
        )
    )
    if consistency is not LookupConsistency.NONE and not lookup_available:
        raise reader.error("lookup_consistency", "must be 'none': this provider has no lookup")
    settle = reader.number("lookup_settle_seconds", 0.0)
    if consistency is LookupConsistency.EVENTUAL and not reader.has("lookup_settle_seconds"):
        raise reader.error("lookup_settle_seconds", "is required when lookup is 'eventual'")
    timeout = reader.number("timeout_seconds", 10.0, exclusive_minimum=True)
    in_flight = reader.number("in_flight_seconds", 2 * timeout)
    if in_flight < timeout:
        raise reader.error("in_flight_seconds", "must be >= timeout_seconds")
    schemas_raw = reader.raw("payload_schemas")
    if schemas_raw is None:
        schemas = frozenset({1})
    else:
        if (
            not isinstance(schemas_raw, list)
            or not schemas_raw
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                       for s in schemas_raw)
        ):
            raise reader.error("payload_schemas", "must be a non-empty list of integers >= 1")
        schemas = frozenset(schemas_raw)
    read_authority_keys(reader)
    return Capabilities(
        dedup_retention_seconds=retention,
        lookup_consistency=consistency,
        lookup_settle_seconds=settle,
        in_flight_seconds=in_flight,
        fencing=reader.boolean("fencing", False),
        payload_schemas=schemas,
        max_attempts=reader.integer("max_attempts", 8, minimum=1),
        max_elapsed_seconds=reader.number("max_elapsed_seconds", 600.0, exclusive_minimum=True),
        timeout_seconds=timeout,
        retry_max_delay_seconds=reader.number("retry_max_delay_seconds", 60.0,
                                              exclusive_minimum=True),
    )


def read_authority_keys(reader: SectionReader) -> tuple[frozenset[str] | None, str | None]:
    """Validate the keys the dispatcher's authority checks use (``dispatcher.engine.authority``):
    ``workflow_versions`` (a non-empty list of strings; absent: any version) and
    ``policy`` (``"package.module:function"``, imported by the daemon at start-up)."""
    versions_raw = reader.raw("workflow_versions")
    versions: frozenset[str] | None = None
    if versions_raw is not None:
        if (
            not isinstance(versions_raw, list)
            or not versions_raw
            or not all(isinstance(v, str) and v.strip() for v in versions_raw)
        ):
            raise reader.error("workflow_versions", "must be a non-empty list of strings")
        versions = frozenset(versions_raw)
    policy = reader.raw("policy")
    if policy is not None:
        module, sep, attr = policy.partition(":") if isinstance(policy, str) else ("", "", "")
        if not sep or not module.strip() or not attr.strip():
            raise reader.error("policy", "must be a string 'package.module:function'")
    return versions, policy
