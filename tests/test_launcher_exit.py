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


NO_THREADS_AT_EXIT = """
import atexit, threading
import numpy as np
import collcomm as dist

dist.init_process_group()
x = np.ones(2)
dist.all_reduce(x)


def no_threads() -> None:   # as Python 3.12 at exit (the program never calls destroy)
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    threading.Thread.start = refuse


atexit.register(no_threads)   # (atexit: last in, first out: before collcomm's own hook)
"""


@pytest.mark.timeout(90)
def test_leaving_at_exit_where_python_starts_no_thread(tmp_path):
    """A rank that leaves the job at exit (collcomm's atexit hook) where Python refuses new
    threads, as 3.12 does then: the store's host still waits for the others, the flight
    recorder's final state and the trace are still written: every rank's trace, merged by
    the launcher, and a clean exit."""
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(NO_THREADS_AT_EXIT)
    run = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "3", "--trace",
                          str(tmp_path / "trace"), str(script)], capture_output=True, text=True,
                         timeout=80)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == [
        "trace-rank0.json", "trace-rank1.json", "trace-rank2.json", "trace.json"], run.stderr
