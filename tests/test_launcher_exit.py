"""The exit path of the rank that hosts the store is bounded by its intended 10 s patience,
even when the store stops answering (issue 9, item 4: it used to take 10 + min(timeout, 60) s)."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from collcomm.core import bootstrap
from collcomm.rendezvous import PrefixStore
from collcomm.rendezvous import auth
from collcomm.rendezvous.tcp_client import TCPStore

TOKEN = b"exit-path-test-token"


class _SilentStore:
    """A store server that authenticates its client, then never answers a request."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        self.conns.append(conn)
        auth.authenticate(conn, TOKEN, initiator=False, timeout=5)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.timeout(30)
def test_await_others_bounded_when_store_stops_answering():
    server = _SilentStore()
    store = TCPStore("127.0.0.1", server.port, timeout=60, token=TOKEN)
    try:
        kv = PrefixStore("collcomm/init1", store)
        t0 = time.monotonic()
        finished = bootstrap._await_others(kv, size=2, patience=1.0)
        waited = time.monotonic() - t0
        assert not finished and 0.9 <= waited < 2.0, waited
        # closing the job then does not wait for the stuck request's lock either
        job = bootstrap.Job(0, 2, bootstrap.Identity(0, 2, 0, "test"), store=store,
                            store_stuck=True)
        t0 = time.monotonic()
        job.close()
        assert time.monotonic() - t0 < 1.0
    finally:
        server.close()


@pytest.mark.timeout(30)
def test_await_others_returns_when_everyone_joined():
    class Counter:
        def add(self, key: str, amount: int) -> int:
            return 3

    t0 = time.monotonic()
    assert bootstrap._await_others(Counter(), size=3, patience=5.0)
    assert time.monotonic() - t0 < 1.0
