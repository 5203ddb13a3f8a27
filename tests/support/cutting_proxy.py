"""A loopback TCP proxy that loses one reply: the fault that makes a write ambiguous.

Every connection is relayed both ways to the real server. Once armed with a marker, the
client's bytes up to the end of the message holding the marker are relayed, the server's
replies after that are held back until the awaited reply has arrived — the server has
done the write — and then both sides are closed. The client saw its request leave and the
connection drop before any answer: it cannot know.

The defaults speak AMQP (the message ends with its frame; the awaited reply is the
broker's ``basic.ack``); ``message_end=None`` relays the whole chunk holding the marker
and ``reply`` names any other protocol's answer (Redis: ``b"\r\n"``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

FRAME_END = b"\xce"
BASIC_ACK = b"\x00\x3c\x00\x50"  # class basic (60), method ack (80)


class CuttingProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1", *,
                 message_end: bytes | None = FRAME_END, reply: bytes = BASIC_ACK) -> None:
        self._upstream = (host, upstream_port)
        self._message_end = message_end
        self._reply = reply
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cut = threading.Event()
        self._stopping = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes) -> None:
        """Cut the connection that next carries ``marker`` to the server."""
        with self._lock:
            self._marker = marker

    def _take(self, seen: bytes) -> int | None:
        """The end of the frame holding the armed marker in ``seen``, disarming; else None."""
        with self._lock:
            if self._marker is None or (at := seen.find(self._marker)) < 0:
                return None
            if self._message_end is None:
                self._marker = None
                return len(seen)
            end = seen.find(self._message_end, at)
            if end < 0:
                return None
            self._marker = None
            return end + len(self._message_end)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            cutting = threading.Event()
            threading.Thread(target=self._to_server, args=(client, server, cutting),
                             daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client, cutting),
                             daemon=True).start()

    def _to_server(self, client: socket.socket, server: socket.socket,
                   cutting: threading.Event) -> None:
        tail = b""
        try:
            while chunk := client.recv(65536):
                seen = tail + chunk
                end = self._take(seen)
                if end is None:
                    server.sendall(chunk)
                    tail = seen[-256:]
                    continue
                cutting.set()
                server.sendall(chunk[: max(0, end - len(tail))])
                return  # nothing more from this client reaches the server
        except OSError:
            pass
        finally:
            if not cutting.is_set():
                _close(client, server)

    def _to_client(self, server: socket.socket, client: socket.socket,
                   cutting: threading.Event) -> None:
        held = b""
        try:
            while chunk := server.recv(65536):
                if not cutting.is_set():
                    client.sendall(chunk)
                    continue
                held += chunk
                if self._reply in held:
                    break
        except OSError:
            pass
        if cutting.is_set():
            self.cut.set()
        _close(client, server)

    def close(self) -> None:
        self._stopping = True
        self._listener.close()
        for sock in self._sockets:
            _close(sock)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
