"""A loopback TCP proxy that loses one reply: the fault that makes a publish ambiguous.

Every connection is relayed both ways to the real server. Once armed with a marker, the
client's bytes up to the end of the AMQP frame holding the marker are relayed, the
server's replies after that are held back until the one holding the server's ``basic.ack``
has arrived — the broker has taken the message — and then both sides are closed. The
client saw its publish leave and the connection drop before any confirm: it cannot know.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

FRAME_END = b"\xce"
BASIC_ACK = b"\x00\x3c\x00\x50"  # class basic (60), method ack (80)


class CuttingProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self._upstream = (host, upstream_port)
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
            end = seen.find(FRAME_END, at)
            if end < 0:
                return None
            self._marker = None
            return end + 1

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
                if BASIC_ACK in held:
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
