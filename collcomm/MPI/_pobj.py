"""Point to point with objects (``send/recv/isend/irecv/ssend/issend/sendrecv``; ``Message``,
what ``Mprobe``/``mprobe`` take, is in :mod:`._message`).

Objects are pickled by ``MPI.pickle`` (_pickle.py; in band). An object whose pickle has up to
EAGER - 8 = 65528 bytes travels as one message: an 8-byte length, then the pickle. A larger
one sends a 16-byte first part (the length and a *body id*, a number this process gives
each large object it sends), then the pickle as a *body* message tagged ``BODY | body id``
(tag bit 33; no user receive matches it). A receive takes the first message into a 64 KiB
buffer (posted at once, or, from a rank of this host, deferred to its wait as ``Irecv``
defers: matched in posting order either way, as in MPI) and, for a large object, then
asks for exactly that body: whatever order first parts are taken in (a message held by
``mprobe`` and received later included), each gets its own body. A probe of an object
message reports its first part (8 bytes more than the pickle; 16 bytes for a large one).
A message that is neither (sent with ``Send``) is refused with ``ERR_OTHER``.

The blocking ``send``, ``recv``, ``sendrecv`` and ``isend`` first try the group's native
point-to-point entry (:func:`collcomm.core.p2p.native`, as ``Send``/``Recv`` do): a small
object pickled and its message written to the peer's ring in one C call, a receive from a
given rank taken from it and unpickled in one (``P2P.obj_send``/``obj_recv``,
native/_p2p_obj.c; a large object's body then received the regular way); ``sendrecv`` is
one C call (``obj_sendrecv``: the two steps, the regular way taking over at the step C
declines). An ``irecv`` from a rank of this host is made by ``P2P.obj_irecv`` (its
deferred receive, op and Request) and its wait's common case is the module function
``obj_wait`` (native/_p2p_obj_irecv.c): the first part taken, a small object unpickled,
the buffer reused; ``_ObjRecv._ready`` does the rest. Whatever C declines goes the regular way,
before anything moved. An ``irecv`` freed while active still completes (``orphan``).
"""
from __future__ import annotations

import itertools
import struct
import threading
from pickle import loads as _stdlib_loads
from typing import Any, Callable

import numpy as np

from .. import native
from ..core import p2p
from ..core.pickled import dumps, loads
from ._pickle import pickle as _pickle
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import ERR_OTHER, Exception as MPIException, translate
from ._p2p_ops import (
    ACK, BODY, EXACT, SYNC, TAG_BITS, WILD, _EMPTY, _SENT, _Send, _dest, _native_tag, _request, _rtag, _source, _stag,
    complete,
)
from ._request import ORPHANS, Done, Request, Status, reap_orphans
from ._obj_spare import EAGER, SPARE as _SPARE, SPARE_MAX as _SPARE_MAX, first_buffer as _first_buffer

_LENGTH = struct.Struct("<q")
_DEFERRED = p2p.Deferred
_body_ids = itertools.count(1)


def _body(first: np.ndarray, nbytes: int) -> tuple[int, int | None]:
    """(pickle length, body id) of a received first part; the id is None for a small object
    (its pickle follows the length in the same message: ``nbytes == 8 + length``)."""
    if nbytes == 0:                     # (no bytes, a buffer send of [None, 0, 'B']: None)
        return 0, None
    size = _LENGTH.unpack_from(first)[0] if nbytes >= 8 else -8
    if nbytes == 8 + size:
        return size, None
    if nbytes == 16 and size > EAGER - 8:
        return size, _LENGTH.unpack_from(first, 8)[0]
    raise _not_an_object(nbytes)


def _not_an_object(nbytes: int) -> MPIException:
    return MPIException(ERR_OTHER, f"recv: a message of {nbytes} bytes is not an object's (a "
                                   "pickle with its length, or a large object's first part): "
                                   "sent with Send? (receive it with Recv)")


def _received(g: Any, got: tuple, source: int, status: Status | None) -> Any:
    """The object of a message P2P.obj_recv took from ``source`` (``got``: its result), a
    large object's body received here; ``status`` filled."""
    small, obj, got_tag, size = got
    try:
        if small is None and obj == 0:  # (a message of no bytes is None, as mpi4py's)
            small, obj, size = True, None, 0
        elif small is None:             # (obj: the byte count of a message C could not read)
            raise _not_an_object(obj)
        if not small:                   # a large object: its body follows (obj: its id)
            data = np.empty(size, dtype=np.uint8)
            p2p.irecv(g, data, source, BODY | obj, p2p.MAX_USER_TAG, "recv").wait()
            obj = loads(data, _pickle)
    except CollcommError as exc:
        raise translate(exc) from exc
    if status is not None:
        status._set(source, got_tag, size)
    if ORPHANS:
        reap_orphans()
    return obj


_POSTING = threading.Lock()


class _ObjRecv:
    """An object receive: the first part (length + small pickle), then maybe a body."""

    __slots__ = ("_g", "_first", "_buf", "_body", "_data", "_exc", "_st", "_done", "value",
                 "source", "tag", "nbytes", "cancelled", "_src")

    def __init__(self, g: Any, first: Any, buf: np.ndarray, src: int | None = None) -> None:
        self._g, self._first, self._buf, self._src = g, first, buf, src   # (src: local, if given)
        self._body: Any = None
        self._data: np.ndarray | None = None
        self._exc: BaseException | None = None
        self._st: Any = None
        self._done = False
        self.value: Any = None
        self.source, self.tag, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, False

    def first_arrived(self) -> bool:
        if self._st is not None or self._exc is not None:
            return True
        try:
            if not self._first.test():
                return False
            self._st = self._first.wait()
        except BaseException as exc:  # noqa: BLE001 - raised by this request's own wait
            self._exc = exc
        return True

    def post_body(self) -> None:
        """Ask for this receive's body (found by its id: in any order), or take its pickle
        from the first part; once, whichever thread comes first."""
        with _POSTING:            # (two threads waiting on one request, erroneous in MPI:
                                  # one body asked for still)
            if self._exc is None and self._body is None and self._data is None:
                self._post_body()

    def _post_body(self) -> None:
        st = self._st
        src = self._src if self._src is not None else self._g.to_local(st.source)
        size, body = _body(self._buf, st.nbytes)
        if body is not None:
            self._data = np.empty(size, dtype=np.uint8)
            self._body = p2p.irecv(self._g, self._data, src, BODY | body, p2p.MAX_USER_TAG, "recv")
        else:
            self._data = memoryview(self._buf)[8:8 + size]    # (what loads is given anyway)
        self.source, self.tag, self.nbytes = src, st.tag & TAG_BITS, size

    def _ready(self, block: bool) -> bool:
        if self._done:
            return True
        if self._st is None and self._exc is None:
            if not block and not self.first_arrived():
                return False
            if block:
                try:
                    self._st = self._first.wait()
                except BaseException as exc:  # noqa: BLE001
                    self._exc = exc
        if self._data is None:
            self.post_body()
        if self._exc is not None:
            raise self._exc
        if self._body is not None:
            if not block and not self._body.test():
                return False
            self._body.wait()
        assert self._data is not None
        # (a message of no bytes, a buffer send of [None, 0, 'B'], is None: mpi4py's)
        value = _pickle.loads(self._data) if len(self._data) else None
        with _POSTING:                  # (once, whichever thread gets here first)
            if self._done:
                return True
            self.value, self._done = value, True
        # its message is in and read: the buffer serves the next receive, unless the
        # program's own loads may have kept a view of it
        if self._buf.size == EAGER and len(_SPARE) < _SPARE_MAX and _pickle.native[1] is _stdlib_loads:
            _SPARE.append(self._buf)
        return True

    def test(self) -> bool:
        return self._ready(False)

    def wait(self) -> None:
        if _OBJ_WAIT is None or _OBJ_WAIT(self, _pickle.native, _SPARE) is None:
            self._ready(True)

    def cancel(self) -> None:
        if not self._done and self._st is None and self._exc is None and p2p.cancel(self._g, self._first):
            self._done, self.cancelled = True, True

    def orphan(self) -> None:
        """Freed while active (``Request.Free``): it still completes, as MPI's does: tested
        at this rank's later completions and calls (``ORPHANS``) until its first part and,
        for a large object, its body (asked for once the first part is in) have arrived;
        the object is then unpickled and dropped. (Unfreed, a large object's body would
        stay with this rank's unreceived messages.)"""
        try:
            done = self.test()
        except Exception:  # noqa: BLE001 - a failed orphan has no one to tell
            return
        if not done:
            ORPHANS.append(self)


#: _ObjRecv.wait's common case in one C call (native/_p2p_obj_irecv.c), or None
_OBJ_WAIT = getattr(native.core, "obj_wait", None)
#: what P2P.obj_irecv writes in a new _ObjRecv's slots (in __slots__ order), but _g,
#: _first, _buf and _src (its own): what __init__ writes
_OBJ_INIT = (None, None, None, None, None, None, None, False, None, ANY_SOURCE, ANY_TAG, 0, False, None)


def _send_object(g: Any, obj: Any, dest: int, tag: int, sync: bool, call: str,
                 pickled: Any = None) -> list[Any]:
    data = dumps(obj, call, _pickle) if pickled is None else np.frombuffer(pickled, dtype=np.uint8)
    flags = SYNC if sync else 0
    handles = []
    if data.size <= EAGER - 8:
        msg = np.empty(8 + data.size, dtype=np.uint8)
        msg[:8].view(np.int64)[0] = data.size
        msg[8:] = data
        handles.append(p2p.isend(g, msg, dest, flags | tag, call))
    else:
        body = next(_body_ids) & TAG_BITS
        handles.append(p2p.isend(g, np.array([data.size, body], dtype=np.int64), dest, flags | tag, call))
        handles.append(p2p.isend(g, data, dest, BODY | body, call))
    if sync:
        handles.append(p2p.irecv(g, _EMPTY, dest, ACK | tag, p2p.MAX_USER_TAG, call))
    return handles


def _recv_object(g: Any, source: int | None, tag: int, mask: int, call: str) -> _ObjRecv:
    buf = _first_buffer()
    f = None if source is None or source == g.rank else p2p.native(g)
    # from a rank of this host: received natively at its wait if it can (core/p2p.py
    # Deferred, as Irecv's), else posted in the engine
    h = None if f is None else f.start(True, p2p.Deferred, g, buf, source, tag, 0, False, mask)
    return _ObjRecv(g, p2p.irecv(g, buf, source, tag, mask, call) if h is None else h, buf, source)



class ObjectPointToPoint:
    """Object point-to-point methods of a communicator."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm
    _h: Any                       # the communicator's handle (_comm._CommRec), from Comm

    def _osend(self, obj: Any, dest: int, tag: int, sync: bool, call: str, pickled: bytes | None = None) -> Any:
        g = self._grp(call)
        d, t = _dest(g, dest, call), _stag(tag, call)
        if d is None:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        try:
            return _Send(_send_object(g, obj, d, t, sync, call, pickled))
        except CollcommError as exc:
            raise translate(exc) from exc

    def _orecv(self, source: int, tag: int, call: str) -> Any:
        g = self._grp(call)
        if source == PROC_NULL:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        s, (t, mask) = _source(g, source, call), _rtag(tag, call)
        try:
            return _recv_object(g, s, t, mask, call)
        except CollcommError as exc:
            raise translate(exc) from exc

    def _fast_send(self, obj: Any, dest: Any, tag: Any) -> Any:
        """True: ``obj`` sent to ``dest`` in one C call (pickled there too: P2P.obj_send,
        native/_p2p_obj.c); else nothing sent (no native entry, an object too large for one
        message, a message the C call declines, or one that did not pickle in band: the
        regular path pickles it again and reports or sends it) and its pickle, or None, for
        the regular path to send."""
        g = self._h.g
        f = None if g is None or g._closed or ORPHANS else getattr(g, "_p2p_native", None) or p2p.native(g)
        if f is None or type(tag) is not int or not 0 <= tag <= TAG_BITS:
            return None
        try:
            return f.obj_send(obj, dest, tag, _pickle.native)
        except CollcommError as exc:
            raise translate(exc) from exc

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        pickled = self._fast_send(obj, dest, tag)
        if pickled is not True:
            complete(self._osend(obj, dest, tag, False, "send", pickled))

    bsend = send

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        complete(self._osend(obj, dest, tag, True, "ssend"))

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        # written to the peer's ring at once if it can (complete: MPI lets a buffered
        # send complete before its receive), else the regular way with that pickle
        pickled = self._fast_send(obj, dest, tag)
        return _request(_SENT if pickled is True else self._osend(obj, dest, tag, False, "isend", pickled))

    ibsend = isend

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return _request(self._osend(obj, dest, tag, True, "issend"))

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        """The next object from ``source`` with ``tag`` (``buf`` is accepted and unused)."""
        g = self._h.g
        f = None if g is None or g._closed or ORPHANS else getattr(g, "_p2p_native", None) or p2p.native(g)
        if f is not None and type(source) is int and 0 <= source < g.size and source != g.rank:
            # (_native_tag's work inline)
            tm = (tag, EXACT) if type(tag) is int and 0 <= tag <= TAG_BITS else _native_tag(tag)
            if tm is not None:      # (received and unpickled in one C call: P2P.obj_recv)
                try:
                    got = f.obj_recv(source, tm[0], tm[1], _pickle.native)
                except CollcommError as exc:
                    raise translate(exc) from exc
                if got is not None:
                    if got[0] is True and status is None and not ORPHANS:
                        return got[1]           # (a small object: _received's common case)
                    return _received(g, got, source, status)
        return complete(self._orecv(source, tag, "recv"), status)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        g = self._h.g
        f = None if g is None or g._closed or ORPHANS or type(source) is not int or type(tag) is not int \
            or not 0 <= source < g.size or source == g.rank else getattr(g, "_p2p_native", None)
        if f is not None and (0 <= tag <= TAG_BITS or tag == ANY_TAG):
            # (_orecv's native way, its request made in C: the common call; _native_tag's
            # and _first_buffer's work inline)
            try:
                first = _SPARE.pop()
            except IndexError:
                first = np.empty(EAGER, dtype=np.uint8)
            t, mask = tag, EXACT
            if tag < 0:
                t, mask = 0, WILD
            try:
                r = f.obj_irecv(g, first, source, t, mask, _DEFERRED, _ObjRecv, Request, _OBJ_INIT)
            except CollcommError as exc:
                raise translate(exc) from exc
            if r is not None:
                return r
            _SPARE.append(first)
        return _request(self._orecv(source, tag, "irecv"))

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> Any:
        g = self._grp("sendrecv")
        f = p2p.native(g)
        tm = None if f is None or type(source) is not int or not 0 <= source < g.size or source == g.rank \
            or type(sendtag) is not int or not 0 <= sendtag <= TAG_BITS else _native_tag(recvtag)
        if tm is not None:       # (the send and the receive in one C call: the common case)
            try:
                got = f.obj_sendrecv(sendobj, dest, sendtag, source, tm[0], tm[1], _pickle.native)
            except CollcommError as exc:
                raise translate(exc) from exc
            if type(got) is tuple:
                return _received(g, got, source, status)
            pickled = got
        else:
            pickled = self._fast_send(sendobj, dest, sendtag)
        if pickled is True:     # (in the peer's ring already; the receive C left, or that
            # its checks refuse, the regular way's: trying C again would decline again)
            return complete(self._orecv(source, recvtag, "sendrecv"), status)
        if pickled is None:      # (pickled before the receive is posted: a failure leaves none behind)
            try:
                pickled = dumps(sendobj, "sendrecv", _pickle)
            except CollcommError as exc:
                raise translate(exc) from exc
        r = self._orecv(source, recvtag, "sendrecv")
        complete(self._osend(sendobj, dest, sendtag, False, "sendrecv", pickled))
        return complete(r, status)
