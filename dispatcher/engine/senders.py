"""The threads that send: up to ``size`` threads taking calls from one queue.

A ``ThreadPoolExecutor`` builds a ``Future`` for every call (a condition with its lock,
a waiter list) so that someone can wait on its result. Nobody waits on a send: each one
hands its outcome to the recording queue itself (:meth:`dispatcher.engine.worker.Worker._finish`).
At a batch of 100 the futures alone were a sixth of the dispatch loop's Python, in the one
thread that claims, checks and marks. Here a call is a ``(function, argument)`` pair on a
queue; a thread is started when a call finds none idle, up to ``size``, and each runs
until :meth:`shutdown`.

The threads are daemon threads: a provider call that hangs does not hold the process at
exit (the daemon's shutdown waits for sends in flight up to its grace period; a send cut
off after that is one whose row's lease ends and whose outcome recovery settles).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("outboxd.dispatch")

Call = tuple[Callable[[Any], None], Any]


class SendThreads:
    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._name = name
        self._calls: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on one of the threads, in submission order of start."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the send threads are shut down")
            # idle: threads waiting for a call less the calls queued for them
            start = self._idle <= 0 and len(self._threads) < self._size
            if start:
                t = threading.Thread(
                    target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
            else:
                self._idle -= 1  # taken by an idle thread, or queued for the next free
        self._calls.put((fn, arg))
        if start:
            t.start()

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            fn, arg = call
            try:
                fn(arg)
            except Exception:  # the call's own bug: logged, the thread goes on
                log.exception("a send thread's call raised")
            with self._lock:
                self._idle += 1

    def threads(self) -> int:
        """Threads started so far."""
        return len(self._threads)

    def idle(self) -> int:
        """Threads waiting for a call."""
        return max(0, self._idle)

    def shutdown(self) -> None:
        """Drop the calls not yet started and let every thread end after its current
        call; returns at once."""
        with self._lock:
            self._closed = True
            n = len(self._threads)
        while True:
            try:
                self._calls.get_nowait()
            except queue.Empty:
                break
        for _ in range(n):
            self._calls.put(None)
