"""The requests of collcomm.MPI's neighbourhood exchanges (:mod:`._neighbor_exchange` plans
and starts them) and the regular way of what the native calls leave.

:class:`Exchange` is the regular one: an ``Isend`` a send block and an ``Irecv`` a receive
block, waited for together. :class:`Started` is a non-blocking exchange begun in C
(``Ineighbor_…``, a persistent request's ``Start``): its sends written at once by
``P2P.exchange`` (what C did not take: ``Isend``s), its receives taken by its wait in one
more ``P2P.exchange``; anything else before that wait ends (a test, a free, an error or an
interruption in the wait) posts the receives still to come as ``Irecv``s and leaves the
rest to an :class:`Exchange`, so a test never blocks, a freed request completes in the
background and a timed-out one can be waited for again. :func:`finish_blocking` is the
rest of a blocking exchange C left. Blocks are a :class:`Layout` (``P2P.exchange``'s flat
tuples) over contiguous buffers, moved as bytes.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from ..core.timeouts import scope, started_under
from ..errors import CollcommError, CommTimeoutError
from ._consts import ANY_SOURCE, ANY_TAG
from ._errors import Exception as MPIException, translate
from ._p2p_ops import EXACT
from ._request import Request, _poll


class Layout(NamedTuple):
    """What ``P2P.exchange`` takes for a call's blocks: ``sends`` and ``recvs`` flat
    (byte offset, byte length, peer, tag code per block), their counts, and ``local`` flat
    (send offset, receive offset, byte length per edge to itself)."""

    sends: tuple[int, ...]
    recvs: tuple[int, ...]
    nsends: int
    nrecvs: int
    local: tuple[int, ...]


def finish_blocking(f: Any, twin: Any, base: int, send: np.ndarray, recv: np.ndarray, flat: Layout,
                    first_send: int, first_recv: int) -> None:
    """The rest of a blocking exchange that P2P.exchange left (from send ``first_send`` and
    receive ``first_recv`` of ``flat`` on; ``send`` and ``recv`` contiguous), on the native
    point-to-point entry ``f`` of the twin's group as ``Send``/``Recv`` take it: each send
    done at once in C where it can (else an Isend), each receive received in C in its
    peer's order (else a Recv), then the sends waited for. The blocks travel as bytes, as
    P2P.exchange moves them."""
    recvs = flat.recvs
    rb = recv.reshape(-1).view(np.uint8)
    pending = send_rest(f, twin, base, send, flat, first_send)
    for k in range(4 * first_recv, len(recvs), 4):
        off, length, p, code = recvs[k:k + 4]
        piece = rb[off:off + length]
        try:
            got = f.recv(piece, p, base + code, EXACT, 0)
        except CollcommError as exc:
            raise translate(exc) from exc
        if got is None:                   # (C left it to the regular path)
            twin.Recv(piece, p, base + code)
    for r in pending:
        r.Wait()


def send_rest(f: Any, twin: Any, base: int, send: np.ndarray, flat: Layout, first: int) -> list[Request]:
    """The sends of ``flat`` from ``first`` on: each written at once in C where it can, else
    an ``Isend`` (its request returned, in order)."""
    sends = flat.sends
    sb = send.reshape(-1).view(np.uint8)
    pending = []
    for k in range(4 * first, len(sends), 4):
        off, length, q, code = sends[k:k + 4]
        piece = sb[off:off + length]
        if not f.send(piece, q, base + code, 0):
            pending.append(twin.Isend(piece, q, base + code))
    return pending


class Started:
    """A non-blocking exchange begun in C (see the module docstring): ``sent`` of its sends
    written by the caller's ``P2P.exchange``, the rest written or posted here. ``owner``
    is its communicator's :class:`~._neighbor_exchange.Neighborhood`: the thread that
    claims the op there (:meth:`~._neighbor_exchange.Neighborhood.claim`: one does) takes
    its receives, in C or as ``Irecv``s, and settles it after (``settle``), so a freed
    communicator keeps its twin until then and an operation pending on it still completes;
    a claimed op always ends handed over or done, whatever interrupts it."""

    __slots__ = ("_f", "_owner", "_base", "_send", "_recv", "_flat", "_pending", "_after", "_ex", "_done",
                 "_scope")
    source, tag, nbytes, cancelled, value = ANY_SOURCE, ANY_TAG, 0, False, None   # (a collective's status)

    def __init__(self, f: Any, owner: Any, base: int, send: np.ndarray, recv: np.ndarray, flat: Layout,
                 after: Callable[[], Any] | None, sent: int) -> None:
        self._f, self._owner, self._base, self._send, self._recv, self._flat = f, owner, base, send, recv, flat
        self._after, self._ex, self._done, self._scope = after, None, False, scope()
        self._pending = send_rest(f, owner.twin, base, send, flat, sent) if sent < flat.nsends else []
        owner.started.add(self)

    def wait(self) -> None:
        ex = self._ex
        if ex is not None:
            ex.wait()
            return
        if self._done:
            return
        owner = self._owner
        token = owner.claim(self)
        if token is not None:
            try:
                if scope() != self._scope:       # (a wait under another call_timeout than its
                    self._hand_over(0)           # start's: the regular requests, bounded by that)
                elif self._take():
                    return
            finally:
                owner.settle(token)
        else:       # (another thread holds it: its outcome, within the timeout)
            _poll(lambda: self._ex is not None or self._done, "Wait", 1)
        if self._ex is not None:
            self._ex.wait()

    def _take(self) -> bool:
        """The receives in C (this thread claimed them): True all taken (done), False the
        rest handed over. Whatever raises before the hand-over (an error in C, an
        interruption there or just after), the receives C did not take are posted first."""
        flat = self._flat
        try:
            j = self._f.exchange(self._send, self._recv, (), flat.recvs, self._base, EXACT)[1] if flat.nrecvs else 0
            if j < flat.nrecvs or self._pending:      # (lent sends: done once their peers read them)
                self._hand_over(j)
                return False
        except BaseException as exc:
            if self._ex is not None:      # (handed over already: its own error)
                raise
            fail = None
            if isinstance(exc, CollcommError):
                err = translate(exc)
                fail = None if isinstance(exc, CommTimeoutError) else err   # (a timeout: waited for again)
            self._hand_over(self._f.exchanged[1] if flat.nrecvs else 0, fail)
            if isinstance(exc, CollcommError):
                raise err from exc
            raise
        try:
            if self._after is not None:
                self._after()           # (before it shows done: the staged unpacks)
        finally:
            self._done = True
        return True

    def _hand_over(self, received: int, fail: MPIException | None = None) -> None:
        """Post the receives from ``received`` on as ``Irecv``s (this thread claimed them); an
        :class:`Exchange` of them and the pending sends takes over, failed with ``fail``
        (or with a posting's error: the posted ones ended) before anyone sees it."""
        recvs = self._flat.recvs
        rb = self._recv.reshape(-1).view(np.uint8)
        reqs: list[Request] = []
        twin = self._owner.twin
        raised: BaseException | None = None
        try:
            with started_under(self._scope):      # (bounded as if posted at its start)
                for k in range(4 * received, len(recvs), 4):
                    off, length, p, code = recvs[k:k + 4]
                    reqs.append(twin.Irecv(rb[off:off + length], p, self._base + code))
        except BaseException as exc:     # (failed, or interrupted, midway)
            raised = exc
            fail = fail or (exc if isinstance(exc, MPIException) else translate(CollcommError(
                f"a neighbourhood exchange was interrupted ({type(exc).__name__}) while it posted its "
                "receives")))
        ex = Exchange(reqs + self._pending, self._after)
        if fail is not None:
            ex._fail(fail)
        self._ex = ex
        if raised is not None:
            raise raised

    def test(self) -> bool:
        if self._ex is None:
            if self._done:
                return True
            token = self._owner.claim(self)
            if token is None:
                return self._done          # (another thread holds it: not complete yet)
            try:
                self._hand_over(0)
            finally:
                self._owner.settle(token)
        assert self._ex is not None
        return self._ex.test()

    def orphan(self) -> None:
        """Request.Free, or its communicator freed: the receives posted, so the exchange
        completes in the background (unless a thread has claimed them: its wait goes on)."""
        token = self._owner.claim(self)
        if token is not None:
            try:
                self._hand_over(0)
            finally:
                self._owner.settle(token)

    def cancel(self) -> None:
        return None     # a collective cannot be cancelled (MPI: erroneous); it completes


class Exchange:
    """A neighbourhood exchange in flight: its receives, then its sends (a large send is
    lent: its wait lasts until the peer's receive reads it), then ``after`` (the staged
    unpacks of a receive type with gaps). An error completes it, the other requests ended
    (no receive left posted to catch a later message), and every later wait raises it
    again; a timeout leaves it as it was, to be waited for again."""

    __slots__ = ("_reqs", "_after", "_done", "_exc", "value")
    source, tag, nbytes, cancelled = ANY_SOURCE, ANY_TAG, 0, False   # (a collective's status)

    def __init__(self, reqs: list[Request], after: Callable[[], Any] | None) -> None:
        self._reqs, self._after, self._done, self._exc, self.value = reqs, after, False, None, None

    def test(self) -> bool:
        if not self._done and all(r._settled() for r in self._reqs if r):
            self.wait()
        elif self._exc is not None:
            raise self._exc
        return self._done

    def wait(self) -> None:
        if self._exc is not None:
            raise self._exc
        if self._done:
            return
        for r in self._reqs:
            try:
                r.Wait()
            except MPIException as exc:
                if r:            # still active: a timeout (the rest goes on; wait again)
                    raise
                self._fail(exc)
                raise
        self._done = True
        if self._after is not None:
            self._after()

    def _fail(self, exc: BaseException) -> None:
        self._exc, self._done = exc, True
        for r in self._reqs:
            try:
                if r and not r.Test():
                    r.Cancel()
            except Exception:  # noqa: BLE001 - the first error is the one to raise
                pass

    def cancel(self) -> None:
        return None     # a collective cannot be cancelled (MPI: erroneous); it completes


