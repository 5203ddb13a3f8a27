"""Transport failures: before the request was written (retryable) or after (ambiguous)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from providers.base import Outcome, OutcomeKind, Provider, TransportPhase
from tests.providers.scripted import Reply, ScriptedServer, make_dispatch
from tests.support.sim import SimProcess

MakeProvider = Callable[..., Provider]


def assert_before_write(outcome: Outcome, error_class: str) -> None:
    assert outcome.kind is OutcomeKind.RETRYABLE
    assert outcome.transport_phase is TransportPhase.BEFORE_WRITE
    assert outcome.error_class == error_class
    assert outcome.status_code is None and outcome.receipt is None
    assert outcome.evidence["transport_phase"] == "before_write"


def assert_after_write(outcome: Outcome, error_class: str) -> None:
    assert outcome.kind is OutcomeKind.AMBIGUOUS
    assert outcome.transport_phase is TransportPhase.AFTER_WRITE
    assert outcome.error_class == error_class
    assert outcome.status_code is None and outcome.receipt is None
    assert outcome.evidence["transport_phase"] == "after_write"


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A listening socket that never accepts, its backlog filled: new SYNs are dropped."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield port
    for filler in fillers:
        filler.close()
    listener.close()


def test_connection_refused_is_retryable_before_write(
    make_provider: MakeProvider, closed_port: int
) -> None:
    provider = make_provider(kind="http", url=f"http://127.0.0.1:{closed_port}/effects")
    assert_before_write(provider.send(make_dispatch()), "ConnectError")


def test_connect_timeout_is_retryable_before_write(
    make_provider: MakeProvider, full_backlog: int
) -> None:
    provider = make_provider(kind="http", url=f"http://127.0.0.1:{full_backlog}/effects",
                             timeout_seconds=2, connect_timeout_seconds=0.3)
    started = time.monotonic()
    assert_before_write(provider.send(make_dispatch()), "ConnectTimeout")
    assert time.monotonic() - started < 1.5


def test_pool_timeout_is_retryable_before_write(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(action="hang"))
    provider = make_provider(kind="http", url=f"{scripted.url}/effects", timeout_seconds=2,
                             connect_timeout_seconds=0.3, max_connections=1)
    first: list[Outcome] = []
    holder = threading.Thread(target=lambda: first.append(provider.send(make_dispatch())))
    holder.start()
    deadline = time.monotonic() + 2
    while not scripted.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert_before_write(provider.send(make_dispatch()), "PoolTimeout")
    holder.join()
    assert_after_write(first[0], "ReadTimeout")
    assert len(scripted.requests) == 1


def test_read_timeout_is_ambiguous_after_write(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(action="hang"))
    provider = make_provider(kind="http", url=f"{scripted.url}/effects", timeout_seconds=0.5)
    assert_after_write(provider.send(make_dispatch()), "ReadTimeout")
    assert len(scripted.requests) == 1  # the receiver did get it


def test_connection_closed_without_response_is_ambiguous(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(action="close"))
    provider = make_provider(kind="http", url=f"{scripted.url}/effects")
    assert_after_write(provider.send(make_dispatch()), "RemoteProtocolError")


def test_truncated_response_body_is_ambiguous(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(201, {}, b'{"id": "abc"}', action="partial"))
    provider = make_provider(kind="http", url=f"{scripted.url}/effects")
    assert_after_write(provider.send(make_dispatch()), "RemoteProtocolError")


def test_total_timeout_bounds_a_trickling_response(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(200, {}, b"x" * 100, action="trickle", delay=0.05))
    provider = make_provider(kind="http", url=f"{scripted.url}/effects", timeout_seconds=0.6)
    started = time.monotonic()
    assert_after_write(provider.send(make_dispatch()), "TotalTimeout")
    assert time.monotonic() - started < 2


def test_one_pooled_client_serves_many_threads(
    make_provider: MakeProvider, tmp_path: Path
) -> None:
    # Against the sim in its own process: the scripted in-process server's own threads
    # are not a reliable keep-alive peer under this load.
    with SimProcess(tmp_path) as sim:
        provider = make_provider(kind="http", url=sim.effects_url, max_connections=4)
        outcomes: list[Outcome] = []
        lock = threading.Lock()

        def worker() -> None:
            for _ in range(10):
                outcome = provider.send(make_dispatch())
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failures = [(o.kind.value, o.error_class) for o in outcomes
                    if o.kind is not OutcomeKind.APPLIED]
        assert failures == []
        assert len(outcomes) == 80
        stats = sim.stats()
        assert stats["total_effects"] == 80 and stats["duplicates"] == 0
