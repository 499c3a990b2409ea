"""Point to point with buffers: ``Send/Recv/Isend/Irecv/Ssend/Sendrecv/Probe/Mprobe…``.

Messages travel in the communicator's user tag space (:mod:`collcomm.core.p2p`). Within
its 35 bits collcomm.MPI uses: bits 0–30 the MPI tag (``TAG_UB`` = 2**31 - 1), bit 31
*sync* (an ``Ssend``: the receiver answers with an *ack*, bit 32, the moment a receive
takes the message, whatever it waits for meanwhile: core/p2p_sync.py; the send completes
only then), bit 33 *body* (the second part of a large
object, see :mod:`._pobj`). Receives compare the ack and body bits, so ``ANY_TAG`` never
catches them.

``PROC_NULL`` as a peer completes at once (status source ``PROC_NULL``, tag ``ANY_TAG``,
count 0); a bad rank raises ``ERR_RANK``, a bad tag ``ERR_TAG``, a message longer than the
receive buffer ``ERR_TRUNCATE``. ``Isend`` (not synchronous) of a small array to a rank of
this host is sent at once natively, ``Irecv`` from one deferred to its completion, which
receives natively when it can (:mod:`collcomm.core.p2p`: ``native(g).send``, ``defer``).
Sends complete without the receiver (every send is
eager), so ``Bsend``/``Rsend`` are ``Send`` and need no attached buffer. ``Cancel`` of a
receive that nothing matched yet withdraws it (``Status.Is_cancelled()``).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

from ..core import p2p
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import translate
from ._msg import gapped, pinned, simple
from ._msg_plain import as_array, bound_at_init, plain_pair
from ._staging import Receiving, unpack_staged
from ._p2p_ops import (
    ACK, EXACT, SYNC, TAG_BITS, WILD, _EMPTY, _LentSend, _NativeRecv, _Pair, _Recv, _Send, _SENT, _dest, _native_tag,
    _null_status, _request, _rtag, _source, _stag, complete, Unpacked,
)
from ._types import _BY_NUMPY, PLAIN
from ..core.p2p_loans import patience_ns
from ..transport.shm_lent import LEND_FROM
from ._p2p_probes import Probes
from ._prequest import persistent
from ._request import ORPHANS, Done, Request, Status, reap_orphans

#: (module constants: the quick paths' arguments without attribute look-ups)
_NDARRAY, _DEFERRED = np.ndarray, p2p.Deferred


# ----------------------------------------------------------------------------- the mixin
class PointToPoint(Probes):
    """Point-to-point methods of a communicator (``self._grp(call)`` gives its group)."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    # -- buffers ---------------------------------------------------------------------------
    def _isend(self, buf: Any, dest: int, tag: int, sync: bool, call: str) -> Any:
        g = self._grp(call)
        d, t = _dest(g, dest, call), _stag(tag, call)
        if d is None:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        arr, _ = simple(buf, call, "buf")
        f = None if sync else p2p.native(g)
        if f is not None and f.send(arr, d, t, 0):   # sent at once natively, or nothing done
            return Done(None, ANY_SOURCE, ANY_TAG, 0)   # (what a completed _Send reads)
        try:
            handles = [p2p.isend(g, arr, d, (SYNC if sync else 0) | t, call, lend=call != "Send")]
            if sync:
                handles.append(p2p.irecv(g, _EMPTY, d, ACK | t, p2p.MAX_USER_TAG, call))
        except CollcommError as exc:
            raise translate(exc) from exc
        return _Send(handles)

    def _irecv(self, buf: Any, source: int, tag: int, call: str) -> Any:
        g = self._grp(call)
        if source == PROC_NULL:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        s, (t, mask) = _source(g, source, call), _rtag(tag, call)
        st = Receiving()
        arr, _ = simple(buf, call, "buf", writable=True, staged=st)
        f = None if s is None or s == g.rank else p2p.native(g)
        if f is not None and arr.dtype.kind in "biufc" and arr.flags.c_contiguous:
            # received natively at its wait if it can (core/p2p.py defer, in one C call)
            h = f.start(True, p2p.Deferred, g, arr, s, t, 0, False, mask)
            if h is not None:
                return _Recv(g, h) if not st else Unpacked(_Recv(g, h), st)
        try:
            r = _Recv(g, p2p.irecv(g, arr, s, t, mask, call))
        except CollcommError as exc:
            raise translate(exc) from exc
        return r if not st else Unpacked(r, st)

    _complete = staticmethod(lambda op, status=None: complete(op, status))

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        # sent at once in one C call (native/_p2p.c), else (nothing done) the regular way;
        # the group's native entry is made by a first regular call
        if type(buf) is not _NDARRAY and PLAIN is not None:
            buf = PLAIN(buf, 1, False)     # ([x, MPI.INT] and the like: x itself; _mpi_plain.c)
        g = self._h.g              # (_grp without its frame: the common call)
        if g is None or g._closed or ORPHANS:
            g = self._grp("Send")
        f = getattr(g, "_p2p_native", None)
        if not (f is not None and type(buf) is _NDARRAY and type(tag) is int
                and tag <= TAG_BITS and f.send(buf, dest, tag, 0)):
            if f is not None and type(buf) is not _NDARRAY and (a := as_array(buf, "Send", "buf")) is not None:
                return self.Send(a, dest, tag)   # (a spec of an array, [x, MPI.INT]: on the array)
            if gapped(buf):        # packed, then sent as an array (the fast path above)
                return self.Send(simple(buf, "Send", "buf")[0], dest, tag)
            self._complete(self._isend(buf, dest, tag, False, "Send"))

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        self._complete(self._isend(buf, dest, tag, True, "Ssend"))

    Bsend = Rsend = Send

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        if type(buf) is not _NDARRAY and PLAIN is not None:
            buf = PLAIN(buf, 1, False)     # ([x, MPI.INT] and the like: x itself)
        g = self._h.g              # (_grp without its frame: the common call)
        if g is None or g._closed or ORPHANS:
            g = self._grp("Isend")
        f = getattr(g, "_p2p_native", None)   # (made by a first general call)
        if f is not None and type(tag) is int and tag <= TAG_BITS:
            if (type(buf) is _NDARRAY and 0 < f.lend_from <= buf.nbytes and type(dest) is int
                    and (loan := f.lend(buf, dest, tag, 0)) is not None):
                return _request(_LentSend(f, g, dest, loan, buf))   # lent: read by the receiver
            r = f.mpi_isend(buf, dest, tag, _NDARRAY, Request, _SENT)   # sent at once, or None
            if r is not None:
                return r
            if type(buf) is not _NDARRAY and (a := as_array(buf, "Isend", "buf")) is not None:
                return self.Isend(a, dest, tag)   # (a spec of an array: on the array)
        if gapped(buf):
            return self.Isend(simple(buf, "Isend", "buf")[0], dest, tag)
        return _request(self._isend(buf, dest, tag, False, "Isend"))

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        return _request(self._isend(buf, dest, tag, True, "Issend"))

    Ibsend = Irsend = Isend

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,  # noqa: N802
             status: Status | None = None) -> None:
        if type(buf) is not _NDARRAY and PLAIN is not None:
            buf = PLAIN(buf, 1, True)      # ([x, MPI.INT] and the like: x itself)
        g = self._h.g              # (_grp without its frame: the common call)
        if g is None or g._closed or ORPHANS:
            g = self._grp("Recv")
        f = getattr(g, "_p2p_native", None)   # (made by a first regular call)
        if (f is not None and type(buf) is _NDARRAY and type(tag) is int
                and (0 <= tag <= TAG_BITS or tag == ANY_TAG)):    # (_native_tag's, inline)
            t, mask = tag, EXACT
            if tag < 0:
                t, mask = 0, WILD
            try:                   # a specific source only
                n = f.recv(buf, source, t, mask, 0)
            except CollcommError as exc:
                raise translate(exc) from exc
            if n is not None:
                if status is not None:
                    status._set(source, f.last_tag & TAG_BITS, n)
                if ORPHANS:
                    reap_orphans()
                return
        if f is not None and type(buf) is not _NDARRAY and (a := as_array(buf, "Recv", "buf", True)) is not None:
            return self.Recv(a, source, tag, status)   # (a spec of an array: into the array)
        if gapped(buf):            # into a packed temporary (the fast path), then unpacked
            st = Receiving()
            arr = simple(buf, "Recv", "buf", writable=True, staged=st)[0]
            got = status if status is not None else Status()
            self.Recv(arr, source, tag, got)
            unpack_staged(st, got.count)
            return
        self._complete(self._irecv(buf, source, tag, "Recv"), status)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        if type(buf) is not _NDARRAY and PLAIN is not None:
            buf = PLAIN(buf, 1, True)      # ([x, MPI.INT] and the like: x itself)
        g = self._h.g              # (_grp without its frame: the common call)
        if g is None or g._closed or ORPHANS:
            g = self._grp("Irecv")
        f = getattr(g, "_p2p_native", None)   # (made by a first general call)
        if (f is not None and type(source) is int and type(tag) is int
                and 0 <= source < g.size and source != g.rank):
            # _irecv's native start, its Request and op made in C (native/_p2p_mpi.c checks
            # the array: a plain 1-D C-contiguous writable numeric ndarray), without the
            # argument conversions (_native_tag's, inline); None: the general way
            if 0 <= tag <= TAG_BITS or tag == ANY_TAG:
                t, mask = tag, EXACT
                if tag < 0:
                    t, mask = 0, WILD
                r = f.mpi_irecv(g, buf, source, t, mask, _NDARRAY, _DEFERRED, _NativeRecv, Request)
                if r is not None:
                    return r
                if type(buf) is not _NDARRAY and (a := as_array(buf, "Irecv", "buf", True)) is not None:
                    return self.Irecv(a, source, tag)   # (a spec of an array: into the array)
        if gapped(buf):
            st = Receiving()
            r = self.Irecv(simple(buf, "Irecv", "buf", writable=True, staged=st)[0], source, tag)
            if r._op is not None:
                r._op = Unpacked(r._op, st)
            return r
        return _request(self._irecv(buf, source, tag, "Irecv"))

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        if PLAIN is not None and (type(sendbuf) is not _NDARRAY or type(recvbuf) is not _NDARRAY):
            sendbuf, recvbuf = PLAIN(sendbuf, 1, False), PLAIN(recvbuf, 1, True)   # (specs' arrays)
        g = self._h.g              # (_grp without its frame: the common call)
        if g is None or g._closed or ORPHANS:
            g = self._grp("Sendrecv")
        f = getattr(g, "_p2p_native", None) or p2p.native(g)     # (made by the first call)
        tm = (recvtag, EXACT) if type(recvtag) is int and 0 <= recvtag <= TAG_BITS else _native_tag(recvtag)
        if (f is not None and type(sendbuf) is _NDARRAY and type(recvbuf) is _NDARRAY
                and type(sendtag) is int and sendtag <= TAG_BITS and tm is not None
                and type(source) is int and 0 <= source < g.size
                and recvbuf.dtype in _BY_NUMPY and recvbuf.flags.writeable
                and recvbuf.flags.c_contiguous
                and ((loan := f.lend(sendbuf, dest, sendtag, 0) if sendbuf.nbytes >= LEND_FROM
                      else None) is not None or f.send(sendbuf, dest, sendtag, 0))):
            # sent, or lent (the receive's arguments were valid, so the regular path would
            # have sent it too); the receive in C, or the regular way if C leaves it; then
            # a lent send waited for (released by the receiver, or withdrawn)
            try:
                try:
                    n = f.recv(recvbuf, source, tm[0], tm[1], 0)
                except CollcommError as exc:
                    raise translate(exc) from exc
                if n is None:
                    self._complete(self._irecv(recvbuf, source, recvtag, "Sendrecv"), status)
                else:
                    if status is not None:
                        status._set(source, f.last_tag & TAG_BITS, n)
                    if ORPHANS:
                        reap_orphans()
            except BaseException:
                if loan is not None:     # (the receive's error is the one raised)
                    try:
                        f.loan_wait(dest, loan[0], loan[1], sendbuf, loan[2], 0, patience_ns(sendbuf.nbytes))
                    except BaseException:  # noqa: BLE001
                        pass
                raise
            if loan is not None:
                try:
                    f.loan_wait(dest, loan[0], loan[1], sendbuf, loan[2], 0, patience_ns(sendbuf.nbytes))
                except CollcommError as exc:
                    raise translate(exc) from exc
            return
        if f is not None and (type(sendbuf) is not _NDARRAY or type(recvbuf) is not _NDARRAY) and \
                (arrays := plain_pair(sendbuf, recvbuf, "Sendrecv")) is not None:
            return self.Sendrecv(arrays[0], dest, sendtag, arrays[1], source, recvtag, status)
        if gapped(sendbuf) or gapped(recvbuf):     # as arrays (the fast path above), then unpacked
            st = Receiving()
            rb = simple(recvbuf, "Sendrecv", "recvbuf", writable=True, staged=st)[0] if gapped(recvbuf) else recvbuf
            sb = simple(sendbuf, "Sendrecv", "sendbuf")[0] if gapped(sendbuf) else sendbuf
            got = status if status is not None or not st else Status()
            self.Sendrecv(sb, dest, sendtag, rb, source, recvtag, got)
            if st:
                unpack_staged(st, got.count)
            return
        self._check_send(sendbuf, dest, sendtag, "Sendrecv")   # (before the receive is posted)
        r = self._irecv(recvbuf, source, recvtag, "Sendrecv")
        s = self._isend(sendbuf, dest, sendtag, False, "Sendrecv")
        self._complete(s)
        self._complete(r, status)

    def _check_send(self, buf: Any, dest: int, tag: int, call: str) -> None:
        """Raise what ``_isend`` would raise for its arguments (the destination, the tag,
        the buffer spec), sending nothing: a Sendrecv whose send is wrong must not leave its
        receive posted (it would take the next call's message)."""
        g = self._grp(call)
        if _dest(g, dest, call) is not None:
            _stag(tag, call)
            simple(buf, call, "buf")

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,  # noqa: N802
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        if buf is None and dest == PROC_NULL and source == PROC_NULL:   # (nothing moves: as mpi4py)
            _null_status(status)
            return
        plain = type(buf) is _NDARRAY and buf.flags.c_contiguous and buf.dtype in _BY_NUMPY
        g = self._h.g
        f = None if g is None or g._closed or ORPHANS or not plain else getattr(g, "_p2p_native", None)
        if (f is not None and buf.flags.writeable and buf.nbytes < LEND_FROM
                and type(source) is int and 0 <= source < g.size
                and type(recvtag) is int and (0 <= recvtag <= TAG_BITS or recvtag == ANY_TAG)
                and type(sendtag) is int and sendtag <= TAG_BITS and f.send(buf, dest, sendtag, 0)):
            # written into the peer's ring at once (a copy): the buffer is free for the
            # receive, whose arguments were checked (its errors name no call)
            self.Recv(buf, source, recvtag, status)
            return
        arr = buf if plain else simple(buf, "Sendrecv_replace", "buf")[0]    # (packed, for a derived type)
        self.Sendrecv(arr.copy(), dest, sendtag, buf, source, recvtag, status)

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        self._check_send(sendbuf, dest, sendtag, "Isendrecv")   # (before the receive is posted)
        r = self._irecv(recvbuf, source, recvtag, "Isendrecv")
        return _request(_Pair(self._isend(sendbuf, dest, sendtag, False, "Isendrecv"), r))

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,  # noqa: N802
                          recvtag: int = ANY_TAG) -> Request:
        arr, _ = simple(buf, "Isendrecv_replace", "buf")
        return self.Isendrecv(arr.copy(), dest, sendtag, buf, source, recvtag)

    # -- persistent ------------------------------------------------------------------------------
    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Any:  # noqa: N802
        buf = pinned(buf)
        p = persistent(lambda: self._isend(buf, dest, tag, False, "Send_init"))
        arr = buf if type(buf) is _NDARRAY else as_array(buf, "Send_init", "buf") if bound_at_init(buf) else None
        if p._persist is not None and arr is not None:     # (Start's quick way)
            g = self._h.g
            f = _entry(g) if _QUICK_SEND is not None and type(tag) is int and 0 <= tag <= TAG_BITS else None
            p._persist.quick = [partial(_QUICK_SEND, self._h, g, f, arr, dest, tag) if f is not None
                                else partial(_quick_send_start, self._h, arr, dest, tag)]
        return p

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf: Any, dest: int, tag: int = 0) -> Any:  # noqa: N802
        buf = pinned(buf)
        return persistent(lambda: self._isend(buf, dest, tag, True, "Ssend_init"))

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Any:  # noqa: N802
        buf = pinned(buf)
        p = persistent(lambda: self._irecv(buf, source, tag, "Recv_init"))
        arr = buf if type(buf) is _NDARRAY else as_array(buf, "Recv_init", "buf", True) if bound_at_init(buf) else None
        if (p._persist is not None and arr is not None and type(source) is int and source >= 0
                and type(tag) is int and (0 <= tag <= TAG_BITS or tag == ANY_TAG)):   # (Start's quick way)
            g = self._h.g
            mask = EXACT if tag >= 0 else WILD
            f = (_entry(g) if _QUICK_RECV is not None and g is not None and source < g.size and source != g.rank
                 else None)
            p._persist.quick = [partial(_QUICK_RECV, self._h, g, f, arr, source, max(tag, 0), mask) if f is not None
                                else partial(_quick_recv_start, self._h, arr, source, max(tag, 0), mask)]
        return p


def _quick_send_start(h: Any, buf: Any, dest: Any, tag: int) -> Any:
    """A persistent ``Send_init``'s ``Start`` in one C call (``Prequest.Start``'s quick way):
    the array written into the peer's ring at once (a copy), the op a send done (``_SENT``);
    None, nothing done: the general start (a lent or queued send, an error to raise)."""
    g = h.g
    f = None if g is None or g._closed or ORPHANS else getattr(g, "_p2p_native", None) or p2p.native(g)
    if f is not None and tag <= TAG_BITS and f.send(buf, dest, tag, 0):
        return _SENT
    return None


def _quick_recv_start(h: Any, buf: Any, source: int, tag: int, mask: int) -> Any:
    """A persistent ``Recv_init``'s ``Start`` as ``Irecv``'s native start (``P2P.mpi_irecv``:
    a deferred receive in the engine's line, its op a ``_NativeRecv``); None, nothing done:
    the general start."""
    g = h.g
    if g is None or g._closed or ORPHANS or source >= g.size or source == g.rank:
        return None
    f = getattr(g, "_p2p_native", None) or p2p.native(g)     # (made by the first start)
    r = None if f is None else f.mpi_irecv(g, buf, source, tag, mask, _NDARRAY, _DEFERRED, _NativeRecv, Request)
    return None if r is None else r._op


def _entry(g: Any) -> Any:
    """The native point-to-point entry a persistent request's C start calls (made here, at
    ``…_init``, as the first start would make it), or None: the Python start. The C start
    checks at each ``Start`` that the communicator still has group ``g`` and that the entry
    is not paused (a closed group pauses its entry: ProcessGroup.close)."""
    return None if g is None or g._closed else p2p.native(g)


def _quick_in_c() -> tuple[Any, Any]:
    """The native core's persistent send and receive starts (native/_mpi_pstart.c: the two
    functions above in one C call where the communicator still has the group of ``…_init``
    and its native entry is not paused, else these functions), or (None, None) without the
    core."""
    from .. import native

    core = native.core
    setup = getattr(core, "mpi_quick_setup", None) if core is not None else None
    if setup is None:
        return None, None
    setup(_quick_send_start, _quick_recv_start, ORPHANS, _SENT, _NDARRAY, _DEFERRED, _NativeRecv, Request)
    return core.mpi_quick_send, core.mpi_quick_recv


_QUICK_SEND, _QUICK_RECV = _quick_in_c()
