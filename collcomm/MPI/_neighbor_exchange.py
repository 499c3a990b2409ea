"""How a neighbourhood collective moves its blocks (the calls themselves: :mod:`._neighbor`).

A rank's neighbours come from its topology as :class:`Neighbors`; a :class:`Plan`, worked
out once per communicator, says what every call does with them, and :func:`exchange`
does it: one ``Isend`` a send block and one ``Irecv`` a receive block, straight from and
into the caller's buffers, on a hidden twin of the communicator (:mod:`._topo` makes it),
then a wait for all (:class:`Exchange`): what Open MPI's basic component does. An edge
to itself is a byte copy, done before any message.

Where the twin has native point-to-point (peers on this host) the messages go in one C
call instead (``P2P.exchange``, native/_p2p_exchange.c: the sends written to the peers'
rings, then the receives taken in each peer's order), as far as C takes them (a block
above the inline limit, a full ring, a message the engine holds: the rest the regular
way, :mod:`._neighbor_ops`); a non-blocking call writes its sends at once and takes its
receives in its wait (:class:`~._neighbor_ops.Started`). What C took for a call on plain
arrays (numpy arrays, or ``[array, counts, displs, datatype]`` specs) is kept per
layout (:class:`Neighborhood`), so the next call of that layout skips the parse: one C
call from the method (8 B blocks on a ring of 2 ranks: 3.1 µs → 0.7, BENCHMARKS.md).

Tags: the call's number on the communicator (``base``: every rank makes the same calls in
the same order; a persistent request keeps the number of its ``…_init``) plus a one-bit
code. Where a peer is a neighbour several times the blocks are paired by *keys*: on a
graph the n-th edge to a peer meets the n-th from it (code 0: messages of one tag arrive
in order); on a grid a block sent one step up lands in the receiver's slot for its
neighbour one step down (code: the direction of travel; a peer other than itself is a
grid neighbour along one dimension only, its coordinates differing in one, so the
direction tells its two blocks apart on a periodic dimension of size 2).
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, NamedTuple, NoReturn, Sequence

import numpy as np

from ..core import p2p
from ..errors import CollcommError
from ._consts import PROC_NULL
from ._errors import ERR_TOPOLOGY, ERR_TRUNCATE, Exception as MPIException, translate
from ._neighbor_ops import Exchange, Layout, Started, finish_blocking
from ._p2p_ops import EXACT
from ._request import ORPHANS, reap_orphans
from ._staging import Staged, finisher, unpack_staged
from ._types import Datatype

#: tag = call number * CODES + code
CODES = 2
#: claims of Started ops' receives (Neighborhood.claim's tokens)
_CLAIMS = itertools.count()


class Neighbors(NamedTuple):
    """A rank's neighbours: ranks (or PROC_NULL) in slot order; keys pair the n-th send to
    a peer with the receive it fills there (None: by order of appearance)."""

    sources: list[int]
    destinations: list[int]
    source_keys: Sequence[Any] | None = None
    destination_keys: Sequence[Any] | None = None


def _pairing(keys: Sequence[Any] | None, count: int) -> list[Any]:
    return list(keys) if keys is not None else [None] * count


class Plan:
    """What a rank's calls on one topology communicator do: ``sends`` ``(block, peer, code)``
    in slot order; ``recvs`` ``(slot, peer, code)`` in the order each peer sends (a receive
    waited for out of its peer's order leaves the native path: 38 µs against 11 for a
    ring of 2 in one test); ``local`` the edges to itself as ``(block, slot)`` (the n-th
    block sent to itself with a key fills the n-th slot expecting that key)."""

    __slots__ = ("nb", "sends", "recvs", "local")

    def __init__(self, nb: Neighbors, me: int, call: str) -> None:
        skeys, dkeys = _pairing(nb.source_keys, len(nb.sources)), _pairing(nb.destination_keys, len(nb.destinations))
        code = lambda key: 0 if key is None else key[1]   # noqa: E731 - a grid key's direction
        self.nb = nb
        self.sends = [(i, q, code(dkeys[i])) for i, q in enumerate(nb.destinations) if q not in (PROC_NULL, me)]
        self.recvs = sorted(((j, p, code(skeys[j])) for j, p in enumerate(nb.sources) if p not in (PROC_NULL, me)),
                            key=lambda t: t[2])
        to_me: dict[Any, list[int]] = {}
        for i, q in enumerate(nb.destinations):
            if q == me:
                to_me.setdefault(dkeys[i], []).append(i)
        self.local: list[tuple[int, int]] = []
        for j, p in enumerate(nb.sources):
            if p == me:
                mine = to_me.get(skeys[j])
                if not mine:
                    raise MPIException(ERR_TOPOLOGY, f"{call}: rank {me} lists itself as a source more often "
                                                     "than as a destination")
                self.local.append((mine.pop(0), j))
        if any(to_me.values()):
            raise MPIException(ERR_TOPOLOGY, f"{call}: rank {me} lists itself as a destination more often "
                                             "than as a source")


class Neighborhood:
    """A topology communicator's neighbourhood calls (``_CommRec.neighbor``, made on first
    use by Topocomm._neighbor_plan): the hidden ``twin`` they talk on, this rank's ``plan``,
    the number of the next call (``calls``) and the quick path of calls on plain arrays
    (:meth:`quick_run`, :meth:`quick_start`): ``quick`` maps a call's kind and its
    arrays' dtypes and shapes (and vector specs) to what P2P.exchange takes for them
    (a :class:`~._neighbor_ops.Layout`), kept by the first such
    call that ran natively; ``f`` the twin's native point-to-point entry; ``started`` the
    non-blocking calls begun in C whose receives are neither taken nor posted yet."""

    __slots__ = ("twin", "plan", "calls", "quick", "f", "g", "started", "starting", "claimed", "freeing", "lock")

    def __init__(self, twin: Any, plan: Plan, g: Any) -> None:
        self.twin, self.plan, self.calls, self.g = twin, plan, 0, g
        self.quick: dict[tuple[Any, ...], Layout] = {}
        self.f: Any = None
        self.started: set[Started] = set()   # (Started: its receives unclaimed)
        self.claimed: set[tuple[Started, int]] = set()   # (op, claim): its receives being taken
        self.freeing = False                 # (freed while some are: the last to settle frees the twin)
        self.lock = threading.Lock()         # (only to free the twin once)
        self.starting: Any = None      # the persistent request whose Start runs the regular way now

    def free(self) -> None:
        """The communicator freed: the receives of calls still pending posted (they complete
        as MPI has them), then the twin freed, at once or by the last thread still taking
        receives (whatever C leaves it, it posts on the twin)."""
        first: BaseException | None = None
        for op in list(self.started):
            try:
                op.orphan()
            except BaseException as exc:  # noqa: BLE001 - the others posted all the same
                first = first or exc
        self.freeing = True
        self._release()
        if first is not None:
            raise first

    def claim(self, op: Started) -> tuple[Started, int] | None:
        """This thread takes ``op``'s receives: its token (for :meth:`settle`), or None if
        another thread has (or they are posted). Marked claimed before it leaves
        ``started``, so a free never misses it."""
        token = (op, next(_CLAIMS))         # (unique: an attempt that fails drops its own mark only)
        self.claimed.add(token)
        try:
            self.started.remove(op)
        except KeyError:
            self.claimed.discard(token)
            if self.freeing:            # (a free that saw our mark leaves the twin to us)
                self._release()
            return None
        return token

    def settle(self, token: tuple[Started, int]) -> None:
        """The claimed op handed over or done: a freed communicator's twin freed by the last."""
        self.claimed.discard(token)
        if self.freeing:
            self._release()

    def _release(self) -> None:
        with self.lock:
            if not self.freeing or self.claimed:
                return
            self.freeing = False
        self.twin.Free()

    def take(self) -> int:
        """The next call's number (its tag base)."""
        calls = self.calls
        self.calls = (calls + 1) % (1 << 29)
        return calls * CODES

    def remember(self, f: Any, key: tuple[Any, ...], flat: Layout) -> None:
        """Keep ``flat`` for later calls of ``key``, where the quick path can tell a call C did
        not start from one it did: some message to move."""
        if (flat.nsends or flat.nrecvs) and len(self.quick) < 64:
            try:
                self.quick[key] = flat
            except TypeError:       # (counts that cannot be hashed, 0-d arrays say: not kept)
                return
            self.f = f

    def _layout(self, kind: int, send: Any, recv: Any, key: tuple[Any, ...] | None) -> Layout | None:
        """The kept layout for a call on ``send`` and ``recv`` (None: none, or not plain arrays)."""
        if type(send) is not np.ndarray or type(recv) is not np.ndarray:
            return None
        try:
            q = self.quick.get(plain_key(kind, send, recv) if key is None else key)
        except TypeError:     # (a vector spec's count that cannot be hashed: the regular path says what)
            return None
        if q is None or self.g._closed:
            return None
        if ORPHANS:
            reap_orphans()
        return q

    def quick_run(self, kind: int, send: Any, recv: Any, key: tuple[Any, ...] | None = None) -> bool:
        """A blocking call of ``kind`` on plain arrays like those of an earlier call that ran
        natively (``key``: its kind, dtypes, shapes and any vector specs, :func:`vector_key`;
        by default the arrays' dtypes and shapes): its messages in one C call, its number
        taken only once C started it (True); False having done nothing (the regular path
        then checks, numbers and moves it)."""
        q = self._layout(kind, send, recv, key)
        if q is None:
            return False
        base = self.calls * CODES
        try:    # (the buffers' layout and writability are checked in C: (0, 0), nothing done)
            i, j = self.f.exchange(send, recv, q.sends, q.recvs, base, EXACT, q.local)
        except BaseException as exc:
            self._moved(self.f.exchanged, None)
            _reraise(exc)
        if not (i or j):
            return False
        self.take()
        if i < q.nsends or j < q.nrecvs:
            finish_blocking(self.f, self.twin, base, send, recv, q, i, j)
        return True

    def quick_start(self, kind: int, send: Any, recv: Any, key: tuple[Any, ...] | None = None,
                    base: int | None = None, request: Any = None) -> Started | None:
        """The non-blocking form of :meth:`quick_run` (a persistent request's ``base``, else
        the next number, taken once C wrote a send): its sends written now, its receives
        left to its wait; None having done nothing. Only layouts with a send to write.
        Interrupted (or failed) once its sends were written, the call has started all the
        same: its op becomes ``request``'s (a persistent request: active, its Wait
        completes it), or, with no request to hold it, completes in the background."""
        q = self._layout(kind, send, recv, key)
        if q is None or not q.nsends:
            return None
        f = self.f
        number = self.calls * CODES if base is None else base
        try:
            i = f.exchange(send, recv, q.sends, (), number, EXACT, q.local)[0]
        except BaseException as exc:
            moved = f.exchanged
            self._moved(moved, base)          # (numbered before anything else can raise)
            if moved[0]:
                _begun(Started(f, self, number, send, recv, q, None, moved[0]), request)
            _reraise(exc)
        if not i:
            return None
        if base is None:
            self.take()
        return Started(f, self, number, send, recv, q, None, i)

    def _moved(self, moved: tuple[int, int], base: int | None) -> None:
        """P2P.exchange raised (an error, an interruption) having moved ``moved`` (sends,
        receives): the call's number taken if it moved a message (its peers count it)."""
        if base is None and any(moved):
            self.take()


def _reraise(exc: BaseException) -> NoReturn:
    if isinstance(exc, CollcommError):
        raise translate(exc) from exc
    raise exc


def plain_key(kind: int, send: np.ndarray, recv: np.ndarray) -> tuple[Any, ...]:
    """The quick path's key of a call of ``kind`` on plain arrays: their dtypes and shapes."""
    return kind, send.dtype, send.shape, recv.dtype, recv.shape


def _begun(op: Started, request: Any) -> None:
    """A non-blocking call interrupted (or failed) once its sends were written: ``op``
    becomes ``request``'s operation (active: its Wait completes it), or, with no request,
    its receives are posted so it completes in the background (as a freed request)."""
    if request is not None and request._op is None:
        request._op = op
    else:
        op.orphan()


def vector_key(spec: Any) -> tuple[Any, ...] | None:
    """The quick path's key of a vector buffer spec ``[array, counts, displs, datatype]``
    (what fixes its blocks' bytes: the array's dtype and shape, the counts, displacements
    and type), or None for a spec of another form."""
    if (type(spec) is not list and type(spec) is not tuple) or len(spec) != 4:
        return None
    arr, counts, displs, dt = spec
    if type(arr) is not np.ndarray or type(dt) is not Datatype:
        return None
    try:       # (items that cannot be hashed: never kept, never found)
        return arr.dtype, arr.shape, tuple(counts), tuple(displs), dt._t
    except TypeError:
        return None


def _local_copies(plan: Plan, s_at: Sequence[tuple[int, int]], send: np.ndarray,
                  r_at: Sequence[tuple[int, int]], recv: np.ndarray, call: str) -> None:
    """The edges to itself, as bytes (what a message would carry), each checked first."""
    si, ri = send.itemsize, recv.itemsize
    for i, j in plan.local:
        if s_at[i][1] * si > r_at[j][1] * ri:
            raise MPIException(ERR_TRUNCATE, f"{call}: a block of {s_at[i][1] * si} bytes to itself does not "
                                             f"fit its receive block of {r_at[j][1] * ri} bytes")
    if plan.local:
        sb, rb = send.reshape(-1).view(np.uint8), recv.reshape(-1).view(np.uint8)
        for i, j in plan.local:
            (so, sl), ro = s_at[i], r_at[j][0]
            rb[ro * ri:ro * ri + sl * si] = sb[so * si:(so + sl) * si]


def _flat(items: Sequence[tuple[int, int, int]], at: Sequence[tuple[int, int]], itemsize: int) -> tuple[int, ...]:
    """A plan's ``sends`` or ``recvs`` as P2P.exchange reads them: (byte offset, byte length,
    peer, code) per block, flat."""
    out: list[int] = []
    for k, peer, code in items:
        off, length = at[k]
        out += (off * itemsize, length * itemsize, peer, code)
    return tuple(out)


def _flats(nbh: Neighborhood, s_at: Sequence[tuple[int, int]], send: np.ndarray, r_at: Sequence[tuple[int, int]],
           recv: np.ndarray) -> Layout:
    """What P2P.exchange takes for these blocks (Neighborhood.quick's values)."""
    plan = nbh.plan
    si, ri = send.itemsize, recv.itemsize
    return Layout(_flat(plan.sends, s_at, si), _flat(plan.recvs, r_at, ri), len(plan.sends), len(plan.recvs),
                  tuple(x for i, j in plan.local for x in (s_at[i][0] * si, r_at[j][0] * ri, s_at[i][1] * si)))


def exchange(nbh: Neighborhood, base: int, s_at: Sequence[tuple[int, int]], send: np.ndarray,
             r_at: Sequence[tuple[int, int]], recv: np.ndarray, aop: bool, call: str, staged: Staged,
             key: tuple[Any, ...] | None = None) -> Any:
    """Send block i (``send[off:off+len]``, ``s_at[i]``, in elements) to destination i and
    receive the block from source j into ``recv`` at ``r_at[j]`` (then ``staged``) on
    the twin with tags from ``base``; waited for here unless ``aop`` (then the request's
    operation: a :class:`Started` where the twin has native point-to-point, else an
    :class:`Exchange`). Natively the messages go in one C call (P2P.exchange) as far as C
    takes them, the rest the regular way; ``key`` (plain arrays: :func:`vector_key`,
    Neighborhood.quick_run) keeps what C took for the quick path of later calls."""
    twin, plan = nbh.twin, nbh.plan
    _local_copies(plan, s_at, send, r_at, recv, call)
    f = p2p.native(twin._grp(call))
    if f is not None:
        flat = _flats(nbh, s_at, send, r_at, recv)
        try:
            i, j = f.exchange(send, recv, flat.sends, () if aop else flat.recvs, base, EXACT)
        except BaseException as exc:
            if aop and f.exchanged[0]:     # (started all the same: its request's, or in the background)
                _begun(Started(f, nbh, base, send, recv, flat, finisher(staged), f.exchanged[0]), nbh.starting)
            _reraise(exc)
        if key is not None and (i or j):
            nbh.remember(f, key, flat)
        if aop:
            return Started(f, nbh, base, send, recv, flat, finisher(staged), i)
        if i < flat.nsends or j < flat.nrecvs:
            finish_blocking(f, twin, base, send, recv, flat, i, j)
        unpack_staged(staged)
        return None
    sends = []
    for i, q, code in plan.sends:
        off, length = s_at[i]
        sends.append(twin.Isend(send[off:off + length], q, base + code))
    reqs = []
    for j, p, code in plan.recvs:
        off, length = r_at[j]
        reqs.append(twin.Irecv(recv[off:off + length], p, base + code))
    op = Exchange(reqs + sends, finisher(staged))
    if aop:
        return op
    op.wait()
    return None
