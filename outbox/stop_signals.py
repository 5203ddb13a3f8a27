"""SIGTERM and SIGINT turned into a call on an ordinary thread.

Python runs a signal handler in the main thread between two bytecodes, wherever that
thread happens to be, including inside ``threading.Event.wait`` at the moment it holds
the event's internal (non-reentrant) lock. A handler that calls ``event.set()`` on such an
event then waits for a lock its own thread holds: the process never stops, and only
SIGKILL ends it. Rare, but a fleet sends SIGTERM often.

So the handler here takes no lock: it writes the signal's number to a pipe (``os.write``
is safe anywhere), and a small daemon thread reads the pipe and makes the call, free to
log, set events and start threads like any other code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Install with :meth:`install` (main thread only); ``on_signal`` receives the
    signal's name (``"SIGTERM"``) on the watcher thread, once per signal delivered."""

    def __init__(self, on_signal: Callable[[str], None],
                 signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._previous: dict[signal.Signals, Any] = {}
        self._read_fd = self._write_fd = -1
        self._thread: threading.Thread | None = None

    def install(self) -> StopSignals:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a full pipe drops a repeat, never blocks
        self._thread = threading.Thread(target=self._watch, name="stop-signals", daemon=True)
        self._thread.start()
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self.handler)
        return self

    def handler(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler proper: one ``write`` to the pipe and nothing else."""
        with contextlib.suppress(OSError):  # a full or closed pipe: a stop is already due
            os.write(self._write_fd, bytes([signum & 0xFF]))

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self._on_signal(signal.Signals(signum).name)

    def uninstall(self) -> None:
        """Restore the previous handlers and end the watcher thread."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._write_fd >= 0:
            os.close(self._write_fd)  # the watcher reads end-of-file and returns
            self._write_fd = -1
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
