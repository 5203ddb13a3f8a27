"""A TCP fault proxy of our own (asyncio, in a background thread) between the dispatchers
and PostgreSQL.

    proxy = FaultProxy("127.0.0.1", pg_port)   # listens on proxy.port
    proxy.set_mode("delay", seconds=0.2)       # every chunk waits 200 ms each way
    proxy.set_mode("blackhole")                # bytes are swallowed, nothing answers
    proxy.reset_all()                          # RST every open connection
    proxy.set_mode("drop_commit_reply")        # forward a COMMIT, drop its reply, RST
    proxy.set_mode("forward")

``blackhole`` keeps connections open and silently discards what either side sends, like a
partition; leaving it (:meth:`set_mode` to anything else) resets the connections it held,
so a client blocked in ``recv`` sees an error instead of waiting for ever (the dispatcher
has no statement timeout of its own). ``drop_commit_reply`` watches the client's bytes for
a simple-query ``COMMIT``: the statement reaches the server (which commits) and the reply is
replaced by a reset — the client cannot know whether its transaction committed.

Counters (``stats()``) say how often each fault actually hit a connection, so a run can
prove its proxy faults fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import Counter
from typing import Any

MODES = ("forward", "delay", "blackhole", "drop_commit_reply")
CHUNK = 65536


class _Pair:
    def __init__(self, cw: asyncio.StreamWriter, sw: asyncio.StreamWriter) -> None:
        self.client_writer = cw
        self.server_writer = sw
        self.commit_sent = False
        self.held = False  # saw blackhole mode while open

    def abort(self) -> None:
        for w in (self.client_writer, self.server_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
            with contextlib.suppress(Exception):
                w.transport.abort()


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = 0
        self.mode = "forward"
        self.delay_seconds = 0.0
        self.counts: Counter[str] = Counter()
        self._pairs: set[_Pair] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")

    # -- control (any thread) -----------------------------------------------------------
    def set_mode(self, mode: str, *, seconds: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(mode)
        self._call(self._set_mode, mode, seconds)

    def reset_all(self) -> int:
        """RST every open connection (both sides). Returns how many were reset."""
        result: int = self._call(self._reset_all)
        return result

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    # -- loop side -------------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, self.host, 0)
            self.port = int(self._server.sockets[0].getsockname()[1])
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()
        self._loop.close()

    def _set_mode(self, mode: str, seconds: float) -> None:
        leaving_blackhole = self.mode == "blackhole" and mode != "blackhole"
        self.mode = mode
        self.delay_seconds = seconds
        self.counts[f"mode:{mode}"] += 1
        if leaving_blackhole:
            for pair in [p for p in self._pairs if p.held]:
                self.counts["blackhole_reset"] += 1
                pair.abort()
                self._pairs.discard(pair)

    def _reset_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.abort()
        self._pairs.clear()
        self.counts["reset"] += len(pairs)
        return len(pairs)

    def _shutdown(self) -> None:
        self._reset_all()
        if self._server is not None:
            self._server.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            self.counts["connect_refused"] += 1
            cw.transport.abort()
            return
        pair = _Pair(cw, sw)
        self._pairs.add(pair)
        self.counts["connections"] += 1
        try:
            await asyncio.gather(self._pump(cr, sw, pair, upstream=True),
                                 self._pump(sr, cw, pair, upstream=False))
        finally:
            self._pairs.discard(pair)
            for w in (cw, sw):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pair: _Pair, *, upstream: bool) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                mode = self.mode
                if mode == "blackhole":
                    pair.held = True
                    self.counts["blackholed_chunks"] += 1
                    continue
                if mode == "delay" and self.delay_seconds > 0:
                    self.counts["delayed_chunks"] += 1
                    await asyncio.sleep(self.delay_seconds)
                if upstream and mode == "drop_commit_reply" and _is_commit(data):
                    pair.commit_sent = True
                if not upstream and pair.commit_sent:
                    # the server answered a COMMIT: swallow the answer and reset both sides
                    self.counts["commit_reply_dropped"] += 1
                    pair.abort()
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort() if pair.commit_sent else writer.close()


def _is_commit(data: bytes) -> bool:
    """A simple-protocol Query message (``Q``) whose text is ``COMMIT``."""
    return data[:1] == b"Q" and b"COMMIT" in data[5:64].upper()
