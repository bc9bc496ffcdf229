"""A TCP proxy that can be switched to *stall*: connections are accepted and never answered.

Used by tests to put a server that hangs (rather than one that refuses connections) in
front of a real S3 server::

    with StallProxy(("127.0.0.1", port)) as proxy:
        url = proxy.endpoint        # http://127.0.0.1:PROXYPORT
        proxy.stall()               # every request from now on waits forever
        proxy.resume()              # stalled connections are closed; new ones pass again

While stalled, the proxy accepts new connections and reads what clients send on new and
existing ones, but forwards nothing and answers nothing. :meth:`resume` closes the stalled
connections (as a server that recovers resets them) and forwards again. Without a target
(``target=None``) every connection stalls: a server that never answers at all.

:meth:`lose_responses` is the other half-failure: requests still reach the server (a PUT
lands) but the answers to those of one HTTP method are dropped, so the client times out on a
request that succeeded (the proxy reads the method at the start of each request it forwards:
plain HTTP/1.1, one request at a time per connection, as S3 clients send them).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")


class StallProxy:
    """A threaded TCP proxy to ``target`` (host, port) on 127.0.0.1, switchable to stall."""

    def __init__(self, target: tuple[str, int] | None) -> None:
        self.target = target
        self._stalled = target is None
        self._lose: bytes | None = None
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="stallproxy")
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stalled(self) -> bool:
        return self._stalled

    def stall(self) -> None:
        """From now on nothing is forwarded or answered, on any connection."""
        self._stalled = True

    def lose_responses(self, method: str = "PUT") -> None:
        """From now on the server's answers to ``method`` requests are dropped (the requests
        are still forwarded: they take effect; an interim ``100 Continue`` still passes, so
        that a request waiting for it sends its body)."""
        self._lose = method.encode() + b" "

    def resume(self) -> None:
        """Close every connection (the stalled ones never get an answer) and pass again."""
        if self.target is None:
            raise ValueError("a proxy without a target cannot resume")
        self._stalled, self._lose = False, None
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.add(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._track(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        request = [b""]
        if not self._stalled and self.target is not None:
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                return
            self._track(upstream)
            threading.Thread(
                target=self._pump, args=(upstream, client, request), daemon=True
            ).start()
        self._pump(client, upstream, request, answers=False)

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket | None,
        request: list[bytes],
        answers: bool = True,
    ) -> None:
        """Copy ``src`` to ``dst``; while stalled, read and drop (the peer waits forever).
        ``request[0]``: the start of the connection's last request (read on the way in; on
        the way back, ``answers``, the answer to a lost method is dropped)."""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            if self._stalled or dst is None:
                continue  # swallowed: no answer, no forwarding
            if not answers and data.startswith(_METHODS):
                request[0] = data[:16]  # a new request (a body chunk rarely starts so)
            lose = self._lose
            final = not data.startswith(b"HTTP/1.1 100 ")  # "100 Continue" lets a body go
            if answers and lose and request[0].startswith(lose) and final:
                continue  # the answer is lost
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._close_all()

    def __enter__(self) -> StallProxy:
        return self

    def __exit__(
        self,
        t: type[BaseException] | None,
        v: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
