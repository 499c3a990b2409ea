"""Asking the other ranks of a job where they are, through the rendezvous store.

When a call times out, the flight recorder (:mod:`.recorder`) wants every rank's recent
calls per group. Each rank of a job of several runs a watcher thread (:class:`Exchange`)
blocked on its own store connection that answers such requests with its per-group state,
even while its main thread is stuck in a collective; a rank leaving the job cleanly leaves
its final state in the store. Nothing goes through the store per call.
:func:`gather_from` asks on a helper thread, so that a store that no longer answers costs
a bounded wait.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import CommTimeoutError
from ..helper_thread import HelperThread, run_with_patience

if TYPE_CHECKING:
    from .recorder import Recorder

log = logging.getLogger("collcomm")

#: how long a rank that timed out waits for the others' answers through the store
GATHER_SECONDS = 1.5


class Exchange:
    """Per-rank states on request, through the rendezvous store (see the module docstring).

    Keys (under ``collcomm/fr/<job>``): ``req`` (a counter), ``req/<g>`` (request g was
    made), ``state/<g>/<rank>`` (rank's answer to request g, JSON)."""

    def __init__(self, job: Any, rec: Recorder) -> None:
        from .bootstrap import _generation

        self.rec, self.rank, self.size = rec, job.rank, job.size
        self.store = job.store
        self.prefix = f"collcomm/fr/{rec.job}/{_generation}"
        self._stop = False
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        if self.store is not None:
            self._thread = HelperThread(self._watch, "collcomm-fr-watcher")
            self._thread.start()

    def _connect(self) -> Any:
        from ..rendezvous.file_store import FileStore
        from ..rendezvous.tcp_client import TCPStore

        s = self.store
        if isinstance(s, TCPStore):
            return TCPStore(s.host, s.port, token=s._token, timeout=30.0)
        if isinstance(s, FileStore):
            return FileStore(s.path, timeout=30.0, create=False)
        return None

    def _watch(self) -> None:
        try:
            self._conn = conn = self._connect()
            if conn is None:
                return
            g = 1
            while not self._stop:
                try:
                    conn.get(f"{self.prefix}/req/{g}", timeout=5.0)
                except CommTimeoutError:
                    continue
                if self._stop:
                    return
                conn.set(f"{self.prefix}/state/{g}/{self.rank}", json.dumps(self.state()))
                g += 1
        except Exception:  # noqa: BLE001 - the store went away: nobody can ask any more
            return

    def state(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "groups": self.rec.group_states()}

    def _final(self, r: int) -> Any:
        """Rank ``r``'s state as it left the job (published by :meth:`stop`), or None."""
        key = f"{self.prefix}/final/{r}"
        if not self.store.check([key]):
            return None
        st = json.loads(self.store.get(key, timeout=1.0))
        st["left"] = True
        return st

    def gather(self, timeout: float = GATHER_SECONDS) -> dict[int, Any]:
        """Every rank's state (None for ranks that did not answer within ``timeout``)."""
        out: dict[int, Any] = {r: None for r in range(self.size)}
        if self.store is None:
            out[self.rank] = self.state()
            return out
        store = self.store
        g = store.add(f"{self.prefix}/req", 1)
        self.store.set(f"{self.prefix}/req/{g}", str(self.rank))
        deadline = time.monotonic() + timeout
        for r in range(self.size):
            left = deadline - time.monotonic()
            try:
                if r == self.rank:
                    raise CommTimeoutError("self")
                out[r] = json.loads(self.store.get(f"{self.prefix}/state/{g}/{r}",
                                                   timeout=max(left, 0.01)))
            except CommTimeoutError:
                if r == self.rank:
                    out[r] = self.state()
                else:
                    out[r] = self._final(r)
            except Exception as exc:  # noqa: BLE001 - the store is gone: the rest stay unknown
                log.info("flight recorder: asking rank %d through the store failed: %r", r, exc)
                break
        return out

    def stop(self) -> None:
        """At the rank's clean exit: leave its final state in the store (one write, on a
        helper thread given 0.5 s: a store that no longer answers cannot hold the exit
        up), then stop the watcher."""
        if self.store is not None:
            def publish() -> None:
                try:
                    self.store.set(f"{self.prefix}/final/{self.rank}", json.dumps(self.state()))
                except Exception:  # noqa: BLE001 - the store may be gone already
                    pass

            run_with_patience(publish, "collcomm-fr-final", 0.5)
        self._stop = True
        conn = self._conn
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def gather_from(rec: Recorder, patience: float = GATHER_SECONDS + 1.0) -> dict[int, Any]:
    """Every rank's state, asked through the store on a helper thread joined for
    ``patience`` seconds at most: a store that no longer answers (a cut link, a dead host)
    costs that, not the store client's socket timeout."""
    if rec.exchange is None:
        return {rec.rank: {"rank": rec.rank, "groups": rec.group_states()}}
    box: list[Any] = []

    def ask() -> None:
        try:
            box.append(rec.exchange.gather())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append(exc)

    run_with_patience(ask, "collcomm-fr-gather", patience)
    if not box:
        raise RuntimeError(f"the rendezvous store did not answer within {patience:g} s")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]
