"""A TCP proxy in front of an etcd member that can hold etcd's answers.

For the moment a request has landed (etcd answered it: a lease granted, a
key put) but the client has not read the answer yet: what a cancel or a
timeout right then leaves behind in etcd.  The proxy reads the HTTP/2
frames gRPC sends both ways (a 9-byte header: length, type, flags, stream)
and changes no byte.  Holding stops the etcd-to-client direction at the
first frame of the held answer, so nothing is reordered; the client's side
flows on, and the proxy says when the client gave up on the request
(RST_STREAM) or sent another one (a new stream: a revoke, the next step).

    with EtcdProxy(cluster.endpoints[0]) as proxy:
        proxy.hold_answer(1)      # the next request's answer
        ...                       # the client sends it; etcd answers
        proxy.wait_held()         # etcd has answered; the client waits
        ...                       # cancel the client, or let its timeout pass
        proxy.wait_client_moved()
        proxy.release()
"""

from __future__ import annotations

import contextlib
import socket
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM = 0x0, 0x1, 0x3
# A guard against a hang (a failure), never a synchronisation by time.
GUARD = 30.0


class EtcdProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._mu = threading.Lock()
        self._armed = 0  # the answer to the n-th new request from now is held
        self._held_stream = 0
        self._streams_seen = 0  # the highest stream the client opened
        self.held = threading.Event()
        self.client_moved = threading.Event()
        self._released = threading.Event()
        self._released.set()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_answer(self, nth: int = 1) -> None:
        """Hold etcd's answer to the nth request the client sends from now on."""
        with self._mu:
            self._armed, self._held_stream = nth, 0
            self.held.clear()
            self.client_moved.clear()
            self._released.clear()

    def wait_held(self) -> None:
        assert self.held.wait(GUARD), "etcd never answered the request to hold"

    def wait_client_moved(self) -> None:
        """Until the client cancelled a request or sent a new one, after the hold."""
        assert self.client_moved.wait(GUARD), "the client neither gave up nor went on"

    def release(self) -> None:
        with self._mu:
            self._armed = 0
            self._released.set()

    def close(self) -> None:
        self._closed = True
        self.release()
        self.listener.close()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> EtcdProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pumping ----------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        pending = b""
        preface = len(PREFACE) if from_client else 0
        try:
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                pending += chunk
                if preface:
                    taken = min(preface, len(pending))
                    sink.sendall(pending[:taken])
                    pending, preface = pending[taken:], preface - taken
                while len(pending) >= 9:
                    length = int.from_bytes(pending[:3], "big")
                    if len(pending) < 9 + length:
                        break
                    frame, pending = pending[: 9 + length], pending[9 + length :]
                    self._forward(frame, sink, from_client)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _forward(self, frame: bytes, sink: socket.socket, from_client: bool) -> None:
        kind, stream = frame[3], int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
        if from_client:
            self._seen_from_client(kind, stream)
        elif self._held(kind, stream):
            self.held.set()
            self._released.wait()
        sink.sendall(frame)

    def _seen_from_client(self, kind: int, stream: int) -> None:
        with self._mu:
            opened = kind == HEADERS and stream > self._streams_seen
            if opened:
                self._streams_seen = stream
            if self.held.is_set() and (opened or kind == RST_STREAM):
                self.client_moved.set()
            if opened and self._armed and not self._held_stream:
                self._armed -= 1
                if not self._armed:
                    self._held_stream = stream

    def _held(self, kind: int, stream: int) -> bool:
        """The first frame of the held answer (the pump stops there)."""
        with self._mu:
            return (
                not self._released.is_set()
                and stream == self._held_stream != 0
                and kind in (DATA, HEADERS)
            )
