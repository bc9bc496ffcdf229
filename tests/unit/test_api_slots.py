"""The catalog API server's connection slots: a SIGTERM that lands while a request's thread is
being started (``SystemExit`` out of ``Thread.start``'s wait, after the thread began) frees the
slot once, not twice (the bug: "Semaphore released too many times", a traceback in the
server's log at every such stop)."""

from __future__ import annotations

import socket
import threading
from typing import Any, cast

import pytest

from airfs.catalog.api import server as api_server


def test_exit_while_starting_a_request_thread_frees_its_slot_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    srv = api_server.Server(("127.0.0.1", 0), cast(Any, None), cast(Any, None), None)
    errors: list[BaseException] = []
    srv.handle_error = lambda request, addr: errors.append(  # type: ignore[method-assign]
        AssertionError("handle_error")
    )
    threads: list[threading.Thread] = []
    start = threading.Thread.start

    def start_then_exit(self: threading.Thread) -> None:
        start(self)  # the thread runs ...
        threads.append(self)
        raise SystemExit(0)  # ... and the signal handler's exit reaches the caller

    client = socket.create_connection(srv.server_address[:2])
    a, _ = srv.socket.accept()
    client.close()  # the request reads EOF at once: its thread ends
    try:
        monkeypatch.setattr(threading.Thread, "start", start_then_exit)
        with pytest.raises(SystemExit):
            srv.process_request(a, ("127.0.0.1", 1))
        monkeypatch.undo()
        for t in threads:
            t.join(10)
            assert not t.is_alive()
        # every slot is free again, and none was freed twice (BoundedSemaphore would raise)
        slots = srv._slots
        for _ in range(api_server.MAX_CONNECTIONS):
            assert slots.acquire(timeout=1)
        assert not slots.acquire(timeout=0.1)
        assert errors == []
    finally:
        srv.server_close()
