"""SIGTERM/SIGINT handling that cannot deadlock the thread it interrupts."""

from __future__ import annotations

import os
import signal
import threading

from outbox.stop_signals import StopSignals


def test_the_handler_returns_while_its_thread_holds_a_lock_the_stop_needs() -> None:
    # A handler runs wherever the main thread is, e.g. inside Event.wait holding the
    # event's lock; a handler that set that event itself would wait forever.
    lock = threading.Lock()
    stopped = threading.Event()

    def on_signal(name: str) -> None:
        assert name == "SIGTERM"
        with lock:
            stopped.set()

    with StopSignals(on_signal) as signals:
        with lock:
            signals.handler(signal.SIGTERM, None)  # returns: it takes no lock
            assert not stopped.is_set()
        assert stopped.wait(5)


def test_a_real_signal_reaches_the_callback_and_uninstall_restores_the_handler() -> None:
    names: list[str] = []
    received = threading.Event()
    before = signal.getsignal(signal.SIGINT)

    def on_signal(name: str) -> None:
        names.append(name)
        received.set()

    with StopSignals(on_signal):
        os.kill(os.getpid(), signal.SIGINT)
        assert received.wait(5)
    assert names == ["SIGINT"]
    assert signal.getsignal(signal.SIGINT) is before
