"""Optional parts come with extras; without one, a single line names the extra to install.

The missing package is hidden from the import system for the test (``sys.modules[name] =
None`` makes ``import name`` fail as a missing package does)."""

from __future__ import annotations

import importlib
import sys

import pytest

from dispatcher.cli.main import main
from outbox.errors import MissingExtra, ProviderConfigError
from providers.registry import build_providers


def _without(monkeypatch: pytest.MonkeyPatch, package: str, *ours: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)
    for name in [n for n in sys.modules if n in ours or n.startswith(tuple(f"{o}." for o in ours))]:
        monkeypatch.delitem(sys.modules, name)


def test_a_nats_provider_without_the_nats_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without(monkeypatch, "nats", "providers.nats")
    section = {"kind": "nats", "url": "nats://127.0.0.1:4222", "subject": "s", "stream": "S"}
    with pytest.raises(ProviderConfigError) as caught:
        build_providers({"bus": section})
    assert str(caught.value) == (
        "providers.bus.kind: \"nats\" needs the nats extra: pip install 'outboxd[nats]'")


def test_a_redis_stream_provider_without_the_redis_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without(monkeypatch, "redis", "providers.redis_stream")
    section = {"kind": "redis_stream", "stream": "effects"}
    with pytest.raises(ProviderConfigError) as caught:
        build_providers({"bus": section})
    assert str(caught.value) == ("providers.bus.kind: \"redis_stream\" needs the redis "
                                 "extra: pip install 'outboxd[redis]'")


def test_the_console_without_the_console_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without(monkeypatch, "jinja2", "dispatcher.console")
    assert main(["console", "--hash-password"]) == 2
    err = capsys.readouterr().err
    assert err == ("outboxd: configuration error: outboxd console needs the console extra: "
                   "pip install 'outboxd[console]'\n")


def test_the_async_api_without_the_aio_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "greenlet", "outbox.aio")
    with pytest.raises(MissingExtra) as caught:
        importlib.import_module("outbox.aio")
    assert str(caught.value) == "outbox.aio needs the aio extra: pip install 'outboxd[aio]'"
    assert isinstance(caught.value, ImportError)  # what code guarding an import expects
