"""How a neighbourhood collective moves its blocks (the calls themselves: :mod:`._neighbor`).

A rank's neighbours come from its topology as :class:`Neighbors`; a :class:`Plan`, worked
out once per communicator, says what every call does with them, and :func:`exchange`
does it: one ``Isend`` a send block and one ``Irecv`` a receive block, straight from and
into the caller's buffers, on a hidden twin of the communicator (:mod:`._topo` makes it),
then a wait for all (:class:`Exchange`): what Open MPI's basic component does. An edge
to itself is a byte copy, done before any message.

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

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ..core import p2p
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import ERR_TOPOLOGY, ERR_TRUNCATE, Exception as MPIException, translate
from ._p2p_ops import EXACT
from ._request import Request
from ._staging import Staged, finisher, unpack_staged

#: tag = call number * CODES + code
CODES = 2


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


def _blocking(f: Any, twin: Any, plan: Plan, base: int, s_at: Sequence[tuple[int, int]], send: np.ndarray,
              r_at: Sequence[tuple[int, int]], recv: np.ndarray) -> None:
    """A blocking exchange on the native point-to-point entry ``f`` of the twin's group, as
    ``Send``/``Recv`` take it: each send done at once in C where it can (else an Isend),
    each receive received in C in its peer's order (else a Recv), then the sends waited
    for. Four native calls for a ring instead of four requests: 8 B at n = 2 ~20 -> 12-15 µs."""
    pending = []
    for i, q, code in plan.sends:
        off, length = s_at[i]
        piece = send[off:off + length]
        if not f.send(piece, q, base + code, 0):
            pending.append(twin.Isend(piece, q, base + code))
    for j, p, code in plan.recvs:
        off, length = r_at[j]
        piece = recv[off:off + length]
        try:
            got = f.recv(piece, p, base + code, EXACT, 0)
        except CollcommError as exc:
            raise translate(exc) from exc
        if got is None:                   # (C left it to the regular path)
            twin.Recv(piece, p, base + code)
    for r in pending:
        r.Wait()


def exchange(twin: Any, plan: Plan, base: int, s_at: Sequence[tuple[int, int]], send: np.ndarray,
             r_at: Sequence[tuple[int, int]], recv: np.ndarray, aop: bool, call: str, staged: Staged) -> Any:
    """Send block i (``send[off:off+len]``, ``s_at[i]``, in elements) to destination i and
    receive the block from source j into ``recv`` at ``r_at[j]`` (then ``staged``) on
    ``twin`` with tags from ``base``: an :class:`Exchange`, waited for here unless ``aop``."""
    _local_copies(plan, s_at, send, r_at, recv, call)
    if not aop:
        f = p2p.native(twin._grp(call))
        if f is not None:
            _blocking(f, twin, plan, base, s_at, send, r_at, recv)
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
