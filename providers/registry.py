"""Building providers from configuration: ``[providers.NAME]`` tables → :class:`Provider`.

Each table has a ``kind``; the kind's builder reads its keys through a
:class:`~providers.options.SectionReader`, so an unknown key or a bad value is a
:class:`~outbox.errors.ProviderConfigError` naming ``providers.NAME.KEY``. Building
resolves secrets and (for brokers) reads what the broker itself declares, so a bad
configuration stops the daemon at start-up, not at the first dispatch.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from outbox.errors import ProviderConfigError
from providers.base import Provider
from providers.options import SectionReader

Builder = Callable[[str, SectionReader], Provider]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _build_http(name: str, reader: SectionReader) -> Provider:
    from providers.http import build_http

    return build_http(name, reader)


def _build_null(name: str, reader: SectionReader) -> Provider:
    from providers.null import build_null

    return build_null(name, reader)


def _needs_extra(kind: str, module: str, builder: str, package: str,
                 extra: str | None = None) -> Builder:
    """A builder imported only when ``kind`` is configured, from ``module``: its client
    ``package`` comes with the ``outboxd[extra]`` extra (``extra`` defaults to ``kind``),
    and without it the error is one line naming the extra."""
    extra = extra or kind

    def build(name: str, reader: SectionReader) -> Provider:
        try:
            built: Builder = getattr(importlib.import_module(module), builder)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != package:
                raise
            raise ProviderConfigError(f"providers.{name}.kind: \"{kind}\" needs the {extra} "
                                      f"extra: pip install 'outboxd[{extra}]'") from None
        return built(name, reader)

    return build


BUILDERS: Final[Mapping[str, Builder]] = {
    "http": _build_http,
    "null": _build_null,
    "nats": _needs_extra("nats", "providers.nats", "build_nats", "nats"),
    "rabbitmq": _needs_extra("rabbitmq", "providers.rabbitmq", "build_rabbitmq", "pika"),
    "redis_stream": _needs_extra("redis_stream", "providers.redis_stream",
                                 "build_redis_stream", "redis", extra="redis"),
}
KNOWN_KINDS: Final = frozenset(BUILDERS)


def build_provider(name: str, section: Mapping[str, Any]) -> Provider:
    if not _NAME.match(name):
        raise ProviderConfigError(
            f"providers.{name}: a provider name is 1-64 letters, digits, '_' or '-'"
        )
    if not isinstance(section, Mapping):
        raise ProviderConfigError(f"providers.{name}: must be a table")
    kind = section.get("kind")
    if kind is None:
        raise ProviderConfigError(f"providers.{name}.kind: is required")
    if not isinstance(kind, str) or kind not in BUILDERS:
        raise ProviderConfigError(
            f"providers.{name}.kind: unknown kind; known kinds: {', '.join(sorted(BUILDERS))}"
        )
    return BUILDERS[kind](name, SectionReader(name, section))


def build_providers(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Provider]:
    """Build every provider; on any error, close the ones already built and re-raise."""
    built: dict[str, Provider] = {}
    try:
        for name, section in sections.items():
            built[name] = build_provider(name, section)
    except BaseException:
        close_providers(built)
        raise
    return built


def close_providers(providers: Mapping[str, Provider]) -> None:
    for provider in providers.values():
        with contextlib.suppress(Exception):  # best effort: the process is going away
            provider.close()
