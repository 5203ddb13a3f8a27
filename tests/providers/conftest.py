"""Fixtures for the provider tests: a scripted real HTTP server and provider builders."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = str(Path(__file__).resolve().parents[2])
if REPO_ROOT not in sys.path:  # ``tests.support`` / ``tests.providers`` as packages
    sys.path.insert(0, REPO_ROOT)

from providers.base import Provider  # noqa: E402
from providers.registry import build_providers  # noqa: E402
from tests.providers.scripted import ScriptedServer  # noqa: E402


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_provider() -> Iterator[Callable[..., Provider]]:
    """``make_provider(kind="http", url=..., **keys)``; closes what it built."""
    built: list[Provider] = []

    def make(name: str = "p", **section: Any) -> Provider:
        provider = build_providers({name: section})[name]
        built.append(provider)
        return provider

    yield make
    for provider in built:
        provider.close()
