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
rest of a blocking exchange C left. Blocks are ``flat`` tuples (``P2P.exchange``'s: byte
offset, byte length, peer, tag code per block) over contiguous buffers, moved as bytes.
"""
from __future__ import annotations

import time
from typing import Any, Callable, NoReturn

import numpy as np

from ..errors import CollcommError, CommTimeoutError
from ._consts import ANY_SOURCE, ANY_TAG
from ._errors import ERR_OTHER, Exception as MPIException, translate
from ._p2p_ops import EXACT
from ._request import Request


def finish_blocking(f: Any, twin: Any, base: int, send: np.ndarray, recv: np.ndarray, flat: tuple[Any, ...],
                    first_send: int, first_recv: int) -> None:
    """The rest of a blocking exchange that P2P.exchange left (from send ``first_send`` and
    receive ``first_recv`` of ``flat`` on; ``send`` and ``recv`` contiguous), on the native
    point-to-point entry ``f`` of the twin's group as ``Send``/``Recv`` take it: each send
    done at once in C where it can (else an Isend), each receive received in C in its
    peer's order (else a Recv), then the sends waited for. The blocks travel as bytes, as
    P2P.exchange moves them."""
    recvs = flat[1]
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


def send_rest(f: Any, twin: Any, base: int, send: np.ndarray, flat: tuple[Any, ...], first: int) -> list[Request]:
    """The sends of ``flat`` from ``first`` on: each written at once in C where it can, else
    an ``Isend`` (its request returned, in order)."""
    sends = flat[0]
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
    (its communicator's :class:`~._neighbor_exchange.Neighborhood`): ``twin``, ``started``
    (the ops whose receives no thread has claimed yet: whoever removes an op from it takes
    its receives, in C or as ``Irecv``s; freeing the communicator posts those left,
    :meth:`orphan`), ``waiting`` (the ops a thread takes in C now: the twin is freed once
    the last has left, ``freeing``/``release``), so an operation pending on a freed
    communicator still completes."""

    __slots__ = ("_f", "_owner", "_base", "_send", "_recv", "_flat", "_pending", "_after", "_ex", "_done")
    source, tag, nbytes, cancelled, value = ANY_SOURCE, ANY_TAG, 0, False, None   # (a collective's status)

    def __init__(self, f: Any, owner: Any, base: int, send: np.ndarray, recv: np.ndarray, flat: tuple[Any, ...],
                 after: Callable[[], Any] | None, sent: int) -> None:
        self._f, self._owner, self._base, self._send, self._recv, self._flat = f, owner, base, send, recv, flat
        self._after, self._ex, self._done = after, None, False
        self._pending = send_rest(f, owner.twin, base, send, flat, sent) if sent < flat[2] else []
        owner.started.add(self)

    def _claim(self) -> bool:
        """Whether this thread takes the receives (removed from ``started``: one thread does)."""
        try:
            self._owner.started.remove(self)
        except KeyError:
            return False
        return True

    def wait(self) -> None:
        ex = self._ex
        if ex is not None:
            ex.wait()
            return
        if self._done:
            return
        owner = self._owner
        owner.waiting.add(self)       # (before the claim: a free meanwhile leaves the twin to us)
        try:
            took = self._claim() and self._take()
        finally:
            owner.waiting.discard(self)
            if owner.freeing and not owner.waiting:
                owner.release()
        if took:
            if self._after is not None:
                self._after()
            return
        while self._ex is None and not self._done:     # (another thread has claimed it)
            time.sleep(0.0002)
        if self._ex is not None:
            self._ex.wait()

    def _take(self) -> bool:
        """The receives in C: True all taken (done), False the rest handed over."""
        flat = self._flat
        j = 0
        if flat[3]:
            try:
                j = self._f.exchange(self._send, self._recv, (), flat[1], self._base, EXACT)[1]
            except BaseException as exc:      # (the receives it did are done: the rest posted)
                self._raise(exc)
        if j < flat[3] or self._pending:      # (lent sends: done once their peers read them)
            self._hand_over(j)
            return False
        self._done = True
        return True

    def _raise(self, exc: BaseException) -> NoReturn:
        """The C receive raised: the receives it did not take posted, then the error raised
        (an interruption or a timeout: waited for again, by the Exchange; any other error
        fails it, so nothing is left posted to catch a later message)."""
        self._hand_over(self._f.exchanged[1])
        if not isinstance(exc, CollcommError):
            raise exc
        err = translate(exc)
        if not isinstance(exc, CommTimeoutError):
            assert self._ex is not None
            self._ex._fail(err)
        raise err from exc

    def _hand_over(self, received: int) -> None:
        """Post the receives from ``received`` on as ``Irecv``s (this thread claimed them); an
        :class:`Exchange` of them and the pending sends takes over (failed at once if
        posting fails)."""
        recvs = self._flat[1]
        rb = self._recv.reshape(-1).view(np.uint8)
        reqs: list[Request] = []
        twin = self._owner.twin
        try:
            for k in range(4 * received, len(recvs), 4):
                off, length, p, code = recvs[k:k + 4]
                reqs.append(twin.Irecv(rb[off:off + length], p, self._base + code))
        except BaseException as exc:     # (failed, or interrupted, midway: the posted ones ended)
            ex = Exchange(reqs + self._pending, self._after)
            ex._fail(exc if isinstance(exc, MPIException) else MPIException(
                ERR_OTHER, f"a neighbourhood exchange was interrupted ({type(exc).__name__}) while it "
                           "posted its receives"))
            self._ex = ex
            raise
        self._ex = Exchange(reqs + self._pending, self._after)

    def test(self) -> bool:
        if self._ex is None:
            if self._done or not self._claim():
                return self._done          # (or another thread holds it: not complete yet)
            self._hand_over(0)
        assert self._ex is not None
        return self._ex.test()

    def orphan(self) -> None:
        """Request.Free, or its communicator freed: the receives posted, so the exchange
        completes in the background (unless a thread has claimed them: its wait goes on)."""
        if self._claim():
            self._hand_over(0)

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


