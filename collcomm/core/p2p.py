"""Point-to-point on a process group with MPI's matching: tag masks, probes, loopback.

:meth:`ProcessGroup.p2p_isend` / ``p2p_irecv`` match exact tags in the group's user tag
space (``ctx | P2P kind | 35-bit user tag``, see :mod:`collcomm.core.group`). MPI also
needs a receive that matches any tag (``MPI_ANY_TAG``), a look at the next message
without receiving it (``MPI_Probe``) and a probe that claims the message for a later
receive (``MPI_Mprobe`` / ``MPI_Mrecv``). These functions take the group and give exactly
that, on the engine's extensions (:meth:`Engine.probe`, :meth:`Engine.mrecv`, receive
masks). ``mask`` arguments cover the 35 user bits: a received tag matches when it equals
``tag`` on the bits set in ``mask``; the ``ctx`` and kind bits always have to match, so
a wildcard never reaches another group's or a collective's messages.

A group without a transport (a world of one, a group of one rank) still sends to itself,
as MPI allows: its messages go through a loopback engine of this process (no channels;
the engine's self-send path).

Ranks are the group's local ranks; statuses carry the global source, the full tag and the
byte count (:func:`source_tag` maps them back).

:func:`native` gives a group's native point-to-point entry (``collcomm.native``'s ``P2P``,
see native/_p2p.c): one C call for a blocking small send to, or a blocking receive from, a
peer on this host with an exact tag, or None having done nothing (the caller then takes
the regular path, which raises every error). The front ends offer it their blocking
``send``/``recv`` (``collcomm.send``/``recv``, ``collcomm.MPI`` ``Send``/``Recv``/
``Sendrecv``). ``COLLCOMM_FAST=0`` or ``COLLCOMM_NATIVE=0`` turn it off. Asked to
(``record`` True: ``collcomm.send``/``recv``), it writes the flight recorder's record of
the call in C, the list ``observer.p2p`` writes (native/_record.c).

The non-blocking calls use it too (``collcomm.isend``/``irecv``/``batch_isend_irecv``,
``collcomm.MPI`` ``Isend``/``Irecv``): :func:`native_isend` sends at once (an inline record
the ring has room for; the regular path's shared-memory send completes at once too) and
gives a completed handle (:class:`Sent`); :func:`defer` gives a receive whose posting waits
for its ``wait()``, which then receives natively (:class:`Deferred`, with the argument for
its matching order). Anything else, or anything C declines, takes the regular path.
"""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ..errors import ClosedError, CollcommError, InvalidArgumentError
from ..transport.base import ANY_SOURCE, Handle, Status
from ..transport.engine import Engine
from ..transport.request import Incoming, describe
from . import fastpath
from .recorder import _P2PHandle, _perf
from .recorder_records import COMPLETED, ENTERED, FAILED, PACKAGE_PREFIX, R_PSTATE, R_PT1
from .call_comm import TimedHandle, as_bytes
from .group import ProcessGroup
from .p2p_sync import ack_sync, acker
from .tags import CTX_SHIFT, KIND_P2P, MAX_USER_TAG
from .p2p_fields import deferred_fields
from .timeouts import current_timeout

__all__ = ["Deferred", "MAX_USER_TAG", "Probed", "Sent", "cancel", "defer", "finished", "irecv", "isend",
           "mrecv", "native", "native_isend", "probe", "source_tag", "transport"]

_FULL = (1 << 64) - 1
_loopbacks: dict[int, Engine] = {}
_loop_lock = threading.Lock()


def transport(g: ProcessGroup) -> Any:
    """The group's transport, or this process's loopback engine for a group without one."""
    t = g.transport
    if type(t) is Engine:
        return t
    if t is not None:
        if not hasattr(t, "probe"):
            raise InvalidArgumentError(
                f"{g.describe()}: its transport ({type(t).__name__}) has no probe/tag masks")
        return t
    with _loop_lock:
        eng = _loopbacks.get(g.global_rank)
        if eng is None:
            eng = _loopbacks[g.global_rank] = Engine(g.global_rank, g.global_rank + 1, g.timeout)
    return eng


def native(g: ProcessGroup) -> Any:
    """The group's native point-to-point entry (made on first use), or None: no native
    core, ``COLLCOMM_FAST=0``, no transport, or no peer of the group on this host."""
    try:
        return g._p2p_native
    except AttributeError:
        pass
    g._p2p_native = f = _make_native(g)
    if f is None:
        g._p2p_shm = ()
    return f


def _make_native(g: ProcessGroup) -> Any:
    from .. import native as nat
    from ..transport.arena import cpus
    from ..transport.shm import ShmChannel
    from ..transport.shm_lent import LEND_FROM_WORK

    t = g.transport
    if type(t) is not Engine or not fastpath.enabled():
        return None
    pipes = []
    for r in g.ranks:
        ch = t.channels.get(r)
        pipes.append(ch.pipe() if type(ch) is ShmChannel else None)
    if not any(p is not None for p in pipes):
        return None
    local = 1 + sum(type(c) is ShmChannel for c in t.channels.values())
    spin, yields = ((nat.SPIN_NS, nat.YIELDS) if local <= cpus()
                    else (nat.SPIN_NS_OVERSUBSCRIBED, nat.YIELDS_OVERSUBSCRIBED))
    spin = int(float(os.environ.get("COLLCOMM_SPIN_US", spin / 1000)) * 1000)
    yields = int(os.environ.get("COLLCOMM_YIELDS", yields))

    def check(channel: Any, nbytes: int, tag: int, elapsed: float) -> None:
        t.native_check(channel.peer, nbytes, tag, elapsed, current_timeout(g.timeout))

    g._p2p_shm = tuple(p is not None for p in pipes)   # local ranks a deferred receive may wait for
    obs = g.observer       # the records of collcomm.send/recv are written in C (_record.c)
    f = nat.core.P2P(t, check, tuple(pipes), (g.ctx << CTX_SHIFT) | KIND_P2P, spin, yields,
                     append=obs.append if obs is not None else None,
                     obs_index=obs.index if obs is not None else 0, pkg=PACKAGE_PREFIX)
    f.lend_from = LEND_FROM_WORK   # (isend / batch sends from there: lent, api_p2p_work.LentWork)
    return f


def finished(rec: list[Any] | None, ok: bool) -> None:
    """Mark a point-to-point record (one the native entry handed over) completed or failed."""
    if rec is not None:
        rec[R_PSTATE], rec[R_PT1] = (COMPLETED if ok else FAILED), _perf()


class Sent(Handle):
    """The handle of a non-blocking send the native entry completed at once (its bytes are
    in the peer's ring: the buffer is free again). ``rec``: its flight-recorder record,
    "entered" until waited for, as the regular path's (recorder._P2PHandle) is."""

    __slots__ = ("status", "rec")

    def __init__(self, status: Status, rec: list[Any] | None) -> None:
        self.status, self.rec = status, rec

    def wait(self, timeout: float | None = None) -> Status:
        if self.rec is not None:
            finished(self.rec, True)
        return self.status

    def test(self) -> bool:
        if self.rec is not None and self.rec[R_PSTATE] == ENTERED:
            finished(self.rec, True)
        return True


def native_isend(f: Any, g: ProcessGroup, arr: np.ndarray, dst: int, tag: int, sig: int,
                 record: bool) -> Sent | None:
    """A non-blocking send of ``arr`` to local rank ``dst`` done natively at once (one C
    call: an inline record the ring had room for), as a completed handle; or None having
    done nothing (the caller takes the regular path). ``record``: with its "entered"
    flight-recorder record, as ``ProcessGroup.p2p_isend`` makes."""
    if not f.send(arr, dst, tag, sig):
        return None
    return Sent(Status(g.ranks[dst], arr.nbytes, (g.ctx << CTX_SHIFT) | KIND_P2P | tag),
                f.note(False, dst) if record else None)


class Deferred(deferred_fields(), Handle):  # type: ignore[misc]
    """A receive from a peer on this host whose posting is deferred to its ``wait()``,
    which then receives natively (native/_p2p.c, one C call) when it can.

    Matching order (MPI's: receives match in the order they were posted): the engine
    holds it in ``Engine._deferred`` (posting order) until then, and counts it as posted
    before anything that comes later: a receive posted in the engine (``Engine.irecv``),
    a probe, or a native receive (C declines while the engine holds a deferred receive)
    first posts every deferred receive, in order (``post``, the regular path's receive).
    Its own wait posts the receives deferred before it and, staying first in line
    (``waiting``: ``Engine.begin_native``/``end_native``), receives natively (``own``: the
    receives deferred after it do not stop it; those posted before it, and the early
    messages, do, as for any native receive); when C declines, it is posted then, before
    anything later. First in line already and the line's mutex free, those three steps are
    one C call (``P2P.own``, native/_p2p_own.c). Another thread that must post meanwhile stops that native wait (C's
    ``steal``) and waits for it to end, so no later receive is ever posted, nor a message
    polled into the engine matched by one, before it. ``test()`` tries the same
    without waiting (it stays deferred while nothing came). A wait with a timeout or under
    another call timeout than the one it started under posts it and takes the regular
    path, and so does anything C declines.
    """

    __slots__ = ()
    _IS_WORK = False       # (RecvWork: True) its wait returns True, its byte count checked

    def __init__(self, f: Any, g: ProcessGroup, eng: Engine, arr: np.ndarray, local: int, tag: int,
                 mask: int, sig: int, rec: list[Any] | None) -> None:
        self.f, self.g, self.eng, self.arr, self.local = f, g, eng, arr, local
        self.utag, self.umask, self.sig, self.rec = tag, mask, sig, rec
        self.tag = (g.ctx << CTX_SHIFT) | KIND_P2P | tag
        self.limit = current_timeout(g.timeout)
        self.h: Any = None          # the regular path's handle, once posted
        self.req: Any = None        # its engine request
        self.status: Status | None = None
        self.exc: BaseException | None = None
        self.waiting = False        # its wait is receiving natively (Engine.begin_native)
        self._ok, self._exc = False, None

    def post(self) -> None:
        """Post it in the engine (the regular path's receive); called in posting order,
        holding the engine's ``_defer_mutex``. An engine that refuses (aborted, closed)
        fails it."""
        try:
            self.req = self.eng._post_recv(_bytes(self.arr), self.g.ranks[self.local], self.tag,
                                           _mask(self.umask), self.sig, acker(self.umask))
        except CollcommError as exc:
            self.exc = exc
            return
        h: Any = TimedHandle(self.req, self.limit)
        self.h = h if self.rec is None else _P2PHandle(h, self.rec)

    def _done(self, n: int, tag: int) -> Status:
        """Received ``n`` bytes natively; ``tag``: the message's wire tag (``f.last_tag``
        right after the receive, on this thread: a wildcard receive's differs from its own)."""
        self.status = Status(self.g.ranks[self.local], n, tag)
        finished(self.rec, True)
        return self.status

    def _wait(self, timeout: float | None = None) -> Status:
        """``wait()``: the reference (native/_p2p_deferred.c does its common case in C)."""
        if self.status is not None:
            return self.status
        if self.h is None and self.exc is None:
            n: Any = False
            if timeout is None and current_timeout(self.g.timeout) == self.limit:
                f, eng = self.f, self.eng
                try:
                    # first in line and free: begin_native, the receive and end_native in
                    # one C call; else (False) those three here, if it may still begin
                    n = f.own(self)
                    if n is False and eng.begin_native(self):
                        n = None
                        n = f.recv(self.arr, self.local, self.utag, self.umask, self.sig, False, True)
                        if type(n) is int:    # (own too) its status before end_native: a
                            self._done(n, f.last_tag)   # Ctrl-C there must not lose it
                        eng.end_native(self, n is None)
                except CollcommError as exc:  # the peer lost, the timeout, the engine closed
                    self.exc = exc            # (own's or recv's: it is still first in line)
                    eng.end_native(self, False)
                except BaseException:         # (Ctrl-C: still pending, now posted, unless
                    if self.waiting:          # the message came; not waiting: ended before)
                        eng.end_native(self, self.status is None)
                    raise
            if self.status is not None:       # (received, by own or recv)
                return self.status
            if n is False and self.exc is None:   # never began: posted in its turn
                self.eng.post_deferred(self)
        if self.exc is not None:
            finished(self.rec, False)
            raise self.exc
        return self.h.wait(timeout)

    def test(self) -> bool:
        """Done? Still deferred, it first tries natively without waiting (C: ``block``
        False), holding the engine's ``_defer_mutex``, the receives deferred before it
        posted first; it stays deferred (first in line) if nothing came for it."""
        if self.status is not None:
            return True
        if self.h is None and self.exc is None:
            eng = self.eng
            with eng._defer_mutex:
                held = eng._deferred
                if self in held:
                    if any(d.waiting for d in held):
                        return False     # one before it is receiving natively: not yet
                    eng._post_before(self)
                    n = self.f.recv(self.arr, self.local, self.utag, self.umask, self.sig, False,
                                    True, False)
                    if n is False:
                        return False
                    del held[0]
                    if n is not None:
                        self._done(n, self.f.last_tag)
                        return True
                    self.post()                  # C left it: the regular path, in its turn
        if self.exc is not None:
            finished(self.rec, False)
            raise self.exc
        return bool(self.h.test())

    def cancel(self) -> bool:
        """Withdraw it if nothing matched it yet (its wait then raises ClosedError)."""
        if self.h is None and self.exc is None and self.status is None:
            if self.eng.withdraw_deferred(self):
                self.exc = ClosedError(f"rank {self.eng.rank}: the "
                                       f"{describe('recv', self.arr.nbytes, self.g.ranks[self.local], self.tag)}"
                                       " was cancelled")
                return True
        return self.req is not None and bool(self.eng.cancel(self.req))


def defer(f: Any, g: ProcessGroup, arr: np.ndarray, src: int, tag: int, mask: int, sig: int,
          record: bool, cls: Any = Deferred) -> Any:
    """A receive into ``arr`` from local rank ``src`` (a peer on this host) deferred to its
    wait (a :class:`Deferred`, or of its subclass ``cls``), or None (no shared-memory
    channel to ``src``, the engine closed, aborted or missing a peer: the caller takes the
    regular path, which raises or fails as always). ``record``: with its "entered"
    flight-recorder record."""
    eng = g.transport
    if (eng._aborted is not None or eng._closed or eng.lost  # type: ignore[union-attr]
            or not g._p2p_shm[src]):
        return None
    d = cls(f, g, eng, arr, src, tag, mask, sig, f.note(True, src) if record else None)
    eng.defer(d)  # type: ignore[union-attr]
    return d


def _space(g: ProcessGroup, tag: int, op: str) -> int:
    return g._p2p_tag(tag, op)


def _mask(mask: int) -> int:
    """A 35-bit user mask as a full 64-bit one (context and kind bits always compared)."""
    return (_FULL ^ MAX_USER_TAG) | (mask & MAX_USER_TAG)


def _bytes(arr: np.ndarray) -> memoryview:
    """``as_bytes(arr)`` (the bytes of a C-contiguous array, no copy), cheaper for the
    arrays a buffer protocol can cast to bytes directly; anything else goes to as_bytes."""
    try:
        view = memoryview(arr)
        if view.c_contiguous:
            return view.cast("B")
    except (ValueError, TypeError, NotImplementedError, BufferError):
        pass
    return as_bytes(arr)


def isend(g: ProcessGroup, arr: np.ndarray, dst: int, tag: int, op: str = "isend",
          lend: bool = False) -> Handle:
    """Send ``arr`` to local rank ``dst`` with user tag ``tag``; ``lend``: a non-blocking
    send (``arr`` untouched until it is done: see Transport.isend)."""
    h = transport(g).isend(_bytes(arr), g.ranks[dst], _space(g, tag, op), lend=lend)
    return TimedHandle(h, current_timeout(g.timeout))


def irecv(g: ProcessGroup, arr: np.ndarray, src: int | None, tag: int, mask: int = MAX_USER_TAG,
          op: str = "irecv") -> Handle:
    """Receive into ``arr`` from local rank ``src`` (None: any) a message whose user tag
    equals ``tag`` on the bits of ``mask``."""
    gsrc = ANY_SOURCE if src is None else g.ranks[src]
    h = transport(g).irecv(_bytes(arr), gsrc, _space(g, tag, op), _mask(mask), 0, acker(mask))
    return TimedHandle(h, current_timeout(g.timeout))


class Probed:
    """A message seen by :func:`probe`: its local source, user tag and size in bytes."""

    __slots__ = ("source", "tag", "nbytes", "_raw")

    def __init__(self, g: ProcessGroup, raw: Incoming) -> None:
        self.source = g.to_local(raw.source)
        self.tag = raw.tag & MAX_USER_TAG
        self.nbytes = raw.nbytes
        self._raw = raw

    def __repr__(self) -> str:
        return f"Probed(source={self.source}, tag={self.tag:#x}, nbytes={self.nbytes})"


def probe(g: ProcessGroup, src: int | None, tag: int, mask: int = MAX_USER_TAG, *,
          block: bool, take: bool = False, op: str = "probe") -> Probed | None:
    """The first early message a receive ``(src, tag, mask)`` would match, or None
    (``block``: wait for one, under the call timeout). ``take``: claim it for :func:`mrecv`."""
    gsrc = ANY_SOURCE if src is None else g.ranks[src]
    raw = transport(g).probe(gsrc, _space(g, tag, op), _mask(mask), block=block, take=take,
                             timeout=current_timeout(g.timeout))
    return None if raw is None else Probed(g, raw)


def mrecv(g: ProcessGroup, message: Probed, arr: np.ndarray) -> Handle:
    """Receive the message :func:`probe` claimed into ``arr``."""
    h = transport(g).mrecv(message._raw, as_bytes(arr), ack_sync)
    return TimedHandle(h, current_timeout(g.timeout))


def cancel(g: ProcessGroup, handle: Handle) -> bool:
    """Withdraw a receive nothing has matched yet (its wait then raises ClosedError)."""
    if type(handle) is Deferred:
        return handle.cancel()
    while hasattr(handle, "_h"):      # the recorder's and TimedHandle's wrappers
        handle = handle._h
    return bool(transport(g).cancel(handle))


def source_tag(g: ProcessGroup, st: Status) -> tuple[int, int]:
    """(local source, user tag) of a completed receive's status."""
    return g.to_local(st.source), (st.tag & MAX_USER_TAG) if st.tag >= 0 else -1
