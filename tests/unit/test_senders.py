"""The send threads: every call runs, never more than ``size`` at once, idle threads are
reused, a raising call does not end its thread, and shutdown drops what has not started.
Real threads; every wait is on an event, none on time."""

from __future__ import annotations

import logging
import threading

import pytest

from dispatcher.engine.senders import SendThreads
from tests.support.daemon import wait_until

WAIT = 10.0


def test_every_call_runs_once() -> None:
    pool = SendThreads(4, "t-send")
    seen: list[int] = []
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def call(i: int) -> None:
        with lock:
            seen.append(i)
        done.release()

    for i in range(200):
        pool.submit(call, i)
    for _ in range(200):
        assert done.acquire(timeout=WAIT)
    assert sorted(seen) == list(range(200))
    assert 1 <= pool.threads() <= 4
    pool.shutdown()


def test_at_most_size_run_at_once_and_the_rest_wait_their_turn() -> None:
    pool = SendThreads(3, "t-send")
    release = threading.Event()
    started = threading.Semaphore(0)
    finished = threading.Semaphore(0)
    running = 0
    most = 0
    lock = threading.Lock()

    def call(_: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        started.release()
        release.wait(WAIT)
        with lock:
            running -= 1
        finished.release()

    for i in range(7):
        pool.submit(call, i)
    for _ in range(3):
        assert started.acquire(timeout=WAIT)
    assert not started.acquire(timeout=0.2)  # the other four are queued, not running
    assert pool.threads() == 3
    release.set()
    for _ in range(7):
        assert finished.acquire(timeout=WAIT)
    assert most == 3
    pool.shutdown()


def test_an_idle_thread_takes_the_next_call() -> None:
    pool = SendThreads(8, "t-send")
    for _ in range(5):
        done = threading.Event()
        pool.submit(lambda e: e.set(), done)
        assert done.wait(WAIT)
        # the thread counts itself idle after its call returns: wait on that state
        wait_until(lambda: pool.idle() == 1, timeout=WAIT, interval=0.001,
                   message="the thread idle again")
    assert pool.threads() == 1
    pool.shutdown()


def test_a_raising_call_is_logged_and_its_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = SendThreads(1, "t-send")
    done = threading.Event()

    def boom(_: object) -> None:
        raise RuntimeError("a bug in a call")

    with caplog.at_level(logging.ERROR, logger="outboxd.dispatch"):
        pool.submit(boom, None)
        pool.submit(lambda e: e.set(), done)
        assert done.wait(WAIT)
    assert pool.threads() == 1
    assert any("raised" in r.getMessage() for r in caplog.records)
    pool.shutdown()


def test_shutdown_drops_calls_not_started_and_refuses_new_ones() -> None:
    pool = SendThreads(1, "t-send")
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    def first(_: object) -> None:
        started.set()
        release.wait(WAIT)

    pool.submit(first, None)
    assert started.wait(WAIT)
    for i in range(5):
        pool.submit(ran.append, i)
    pool.shutdown()
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == "t-send_0")
    thread.join(WAIT)
    assert not thread.is_alive()
    assert ran == []
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.append, 9)


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SendThreads(0, "t-send")
