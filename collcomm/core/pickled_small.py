"""Python objects through a group in one or two calls of plain bytes, through the fast call.

The bodies of :mod:`.pickled` move a packed list (sizes, pickles, out-of-band buffers) in
several algorithm steps inside one call of the regular path: 60-120 µs for an int at two
ranks on this project's VM, where mpi4py + Open MPI take 3-9. Most objects programs move
are small (numbers, flags, short lists, dicts of settings), so an object collective here is
first one byte collective of fixed :data:`SLOT`-byte slots, one per object: a 16-byte
header (the pickle's size, and for ``scatter`` what follows) and the pickle itself when it
fits (:data:`INLINE` bytes). ``bcast`` broadcasts the root's slot, ``scatter`` scatters the
root's slots, ``allgather`` / ``gather`` all-gather every rank's (so every rank knows every
size, and so what follows), ``alltoall`` all-gathers its sizes only. What does not fit
moves in a second call: the pickles over INLINE bytes (a broadcast, or the all_to_all with
split sizes that MPI's vector collectives use). Each call is offered to the group's fast
call first (one C call; :mod:`.fastpath`), else runs as the core's regular collective
(:mod:`.collectives`): the same call, so ranks that go different ways still meet.

A size may instead say :data:`BIG` (a pickle with out-of-band buffers, or over
:data:`SMALL_MAX` bytes: every rank then makes the second call the general way of
:mod:`.pickled`, with the pickles already made) or :data:`FAILED` (that rank could not
pickle its object: every rank raises, naming it, before any more traffic). Results are
unpickled afresh on every rank, the sender's own object too, as with the general way.
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from . import collectives, pickled
from .group import ProcessGroup
from .pickled import Serializer

#: the largest pickle (bytes) that moves as plain bytes; larger ones go the general way
SMALL_MAX = 64 * 1024
#: the bytes of one object's slot in the first call, its header's, and the pickle it holds
SLOT, HEADER = 256, 16
INLINE = SLOT - HEADER
#: header codes: this rank's object goes the general way / could not be pickled
BIG, FAILED = -1, -2
#: scatter's header: what follows its first call (the root knows, and says so in every slot)
DONE, OVERFLOW, GENERAL, FAILED_ANY = 0, 1, 2, 3
_HEAD = struct.Struct("<qq")

Pickled = tuple[bytes, list[Any], int, str]    # (pickle, out-of-band buffers, code, why it failed)
_NOTHING: Pickled = (b"", [], 0, "")


def _pickle(obj: Any, ser: Serializer) -> Pickled:
    oob: list[Any] = []
    try:
        data = ser.dumps(obj, pickled.out_of_band(ser.oob_min, oob))
        if not isinstance(data, (bytes, bytearray)):   # (a program's dumps: any bytes-like)
            data = memoryview(data).cast("B").tobytes()
    except Exception as exc:  # noqa: BLE001 - any pickling failure, reported on every rank
        return b"", [], FAILED, f"{type(obj).__name__} object cannot be pickled: {exc}"
    return data, oob, (len(data) if not oob and len(data) <= SMALL_MAX else BIG), ""


def _fill(slots: bytearray, at: int, p: Pickled, then: int = 0) -> None:
    """Slot ``at`` of ``slots`` (SLOT bytes each): ``p``'s header and its pickle if it fits."""
    code = p[2]
    _HEAD.pack_into(slots, at * SLOT, code, then)
    if 0 < code <= INLINE:
        slots[at * SLOT + HEADER:at * SLOT + HEADER + code] = p[0]


def _codes(slots: bytearray, count: int) -> list[int]:
    return memoryview(slots).cast("q")[0:count * (SLOT // 8):SLOT // 8].tolist()


def _raise_failed(g: ProcessGroup, name: str, codes: Sequence[int], ranks: Sequence[int],
                  mine: Sequence[Pickled]) -> None:
    """InvalidArgumentError on every rank if some object could not be pickled (``codes``
    are the header's, of the objects of ``ranks``)."""
    if FAILED not in codes:
        return
    bad = sorted({r for c, r in zip(codes, ranks) if c == FAILED})
    why = next((p[3] for p in mine if p[2] == FAILED), "")
    here = f": {why}" if why else " (see that rank's error)"
    raise InvalidArgumentError(f"{name} on {g.describe()}: an object of rank(s) "
                               f"{[g.to_global(r) for r in bad]} cannot be pickled{here}")


# -- byte collectives of bytearrays: the fast call's, else the core's --------------------------
def _u8(buf: bytearray | None) -> np.ndarray | None:
    return None if buf is None else np.frombuffer(buf, dtype=np.uint8)


def _bcast(g: ProcessGroup, buf: bytearray, root: int, name: str) -> None:
    fast = g.fast
    if fast is None or not fast.broadcast(buf, root, name):
        collectives.broadcast(g, _u8(buf), root, name=name)


def _all_gather(g: ProcessGroup, send: bytearray, recv: bytearray, name: str) -> None:
    fast = g.fast
    if fast is None or not fast.all_gather(send, recv, name):
        collectives.all_gather(g, _u8(send), _u8(recv), name=name)


def _scatter(g: ProcessGroup, send: bytearray | None, recv: bytearray, root: int, name: str) -> None:
    fast = g.fast
    if fast is None or not fast.scatter(send, recv, root, name):
        collectives.scatter(g, _u8(send), _u8(recv), root, name=name)


def _a2a(g: ProcessGroup, send: bytearray, sc: list[int], recv: bytearray, rc: list[int], name: str) -> None:
    fast = g.fast
    if fast is None or not fast.all_to_all_v(send, sc, None, recv, rc, None, name):
        collectives.all_to_all(g, _u8(send), sc, _u8(recv), rc, name=name)


# -- reading the results -------------------------------------------------------------------------
def _overflow(codes: Sequence[int]) -> list[int]:
    """The sizes that move in the second call: the pickles that did not fit their slot."""
    return [c if c > INLINE else 0 for c in codes]


def _unpickled(ser: Serializer, slots: bytearray, codes: Sequence[int], rest: bytearray | None,
               which: Sequence[int]) -> list[Any]:
    """The objects of slots ``which``: inline, or in turn from ``rest`` (the second call's)."""
    out, at = [], 0
    view = memoryview(slots)
    for i in which:
        c = codes[i]
        if c <= INLINE:
            out.append(ser.loads(view[i * SLOT + HEADER:i * SLOT + HEADER + c], ()))
        else:
            assert rest is not None
            out.append(ser.loads(memoryview(rest)[at:at + c], ()))
            at += c
    return out


def _gather_rest(g: ProcessGroup, mine: Pickled, codes: list[int], root: int | None, name: str
                 ) -> bytearray | None:
    """The second call of allgather (root None) / gather: the pickles over INLINE bytes,
    in rank order, on every rank / on the root."""
    sizes = _overflow(codes)
    if not any(sizes):
        return None
    n, me = g.size, g.rank
    send = bytearray(mine[0] if sizes[me] else b"")
    recv = bytearray(sum(sizes) if root is None or me == root else 0)
    if root is None and all(s == sizes[0] for s in sizes):
        _all_gather(g, send, recv, name)
    elif root is None:
        _a2a(g, send * n, [len(send)] * n, recv, sizes, name)
    else:
        sc = [0] * n
        sc[root] = sizes[me]
        _a2a(g, send, sc, recv, sizes if me == root else [0] * n, name)
    return recv


# -- the object collectives ---------------------------------------------------------------------
def _made(data: bytes | None) -> Pickled:
    """What _pickle gives, for a pickle the fast call's object entries made (in band)."""
    if data is None:
        return _NOTHING
    return data, [], len(data) if len(data) <= SMALL_MAX else BIG, ""


def bcast(g: ProcessGroup, obj: Any, root: int, name: str, ser: Serializer) -> Any:
    """``root``'s ``obj``, unpickled on every rank (the root too)."""
    fast = g.fast
    if fast is not None and ser.native is not None:
        got = fast.obj_bcast(obj, root, name, ser.native)
        if got is not None:
            return got[1] if got[0] else _bcast_after(g, got[1], _made(got[2]), obj, root, name, ser)
    slot = bytearray(SLOT)
    mine: Pickled = _NOTHING
    if g.rank == root:
        mine = _pickle(obj, ser)
        _fill(slot, 0, mine)
    _bcast(g, slot, root, name)
    return _bcast_after(g, slot, mine, obj, root, name, ser)


def _bcast_after(g: ProcessGroup, slot: bytearray, mine: Pickled, obj: Any, root: int, name: str,
                 ser: Serializer) -> Any:
    """bcast once its first call filled ``slot`` (``mine``: the root's pickle)."""
    code = _HEAD.unpack_from(slot)[0]
    if 0 < code <= INLINE:                        # (the common case)
        return ser.loads(memoryview(slot)[HEADER:HEADER + code], ())
    _raise_failed(g, name, [code], [root], [mine])
    if code == BIG:
        packed = pickled.pack_one(mine[0], mine[1]) if g.rank == root else None
        return pickled.bcast_objects(g, [obj] if g.rank == root else None, root, name, True, ser, packed)[0]
    rest = bytearray(mine[0]) if g.rank == root else bytearray(code)
    _bcast(g, rest, root, name)
    return ser.loads(memoryview(rest), ())


def allgather(g: ProcessGroup, obj: Any, name: str, ser: Serializer) -> list[Any]:
    """Every rank's ``obj`` in rank order, on every rank."""
    return _gathered(g, obj, None, name, ser)  # type: ignore[return-value]


def gather(g: ProcessGroup, obj: Any, root: int, name: str, ser: Serializer) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on ``root``; None elsewhere."""
    return _gathered(g, obj, root, name, ser)


def _gathered(g: ProcessGroup, obj: Any, root: int | None, name: str, ser: Serializer) -> list[Any] | None:
    fast = g.fast
    if fast is not None and ser.native is not None:
        got = fast.obj_gathered(obj, -1 if root is None else root, name, ser.native)
        if got is not None:
            return got[1] if got[0] else _gathered_after(g, got[1], _made(got[2]), obj, root, name, ser)
    mine = _pickle(obj, ser)
    own = bytearray(SLOT)
    _fill(own, 0, mine)
    slots = bytearray(g.size * SLOT)
    _all_gather(g, own, slots, name)
    return _gathered_after(g, slots, mine, obj, root, name, ser)


def _gathered_after(g: ProcessGroup, slots: bytearray, mine: Pickled, obj: Any, root: int | None,
                    name: str, ser: Serializer) -> list[Any] | None:
    """allgather / gather once every rank's slot is in ``slots`` (``mine``: this rank's pickle)."""
    n, me = g.size, g.rank
    codes = _codes(slots, n)
    top = max(codes)
    if top <= INLINE and min(codes) > 0:          # (the common case: every pickle in its slot)
        return _unpickled(ser, slots, codes, None, range(n)) if root is None or me == root else None
    _raise_failed(g, name, codes, range(n), [mine])
    if BIG in codes:
        packed = pickled.pack_one(mine[0], mine[1])
        if root is None:
            return pickled.all_gather_objects(g, obj, name, ser, packed)
        return pickled.gather_objects(g, obj, root, name, ser, packed)
    rest = _gather_rest(g, mine, codes, root, name)
    return _unpickled(ser, slots, codes, rest, range(n)) if root is None or me == root else None


def scatter(g: ProcessGroup, objs: Sequence[Any] | None, root: int, name: str, ser: Serializer) -> Any:
    """Item i of ``root``'s ``objs`` (one per rank; None elsewhere) to rank i."""
    fast = g.fast
    if fast is not None and ser.native is not None:
        got = fast.obj_scatter(objs, root, name, ser.native)
        if got is not None:
            return got[1] if got[0] else _scatter_after(
                g, got[1], [_made(d) for d in got[2]] if got[2] is not None else [], objs, root, name, ser)
    n, me = g.size, g.rank
    mine: list[Pickled] = []
    slots = None
    if me == root:
        assert objs is not None
        mine = [_pickle(o, ser) for o in tuple(objs)]   # (the items first: pickling runs the
        codes = [p[2] for p in mine]                     # program's code, which may change the list)
        then = (FAILED_ANY if FAILED in codes else GENERAL if BIG in codes
                else OVERFLOW if any(_overflow(codes)) else DONE)
        slots = bytearray(n * SLOT)
        for i, p in enumerate(mine):
            _fill(slots, i, p, then)
    slot = bytearray(SLOT)
    _scatter(g, slots, slot, root, name)
    return _scatter_after(g, slot, mine, objs, root, name, ser)


def _scatter_after(g: ProcessGroup, slot: bytearray, mine: list[Pickled], objs: Sequence[Any] | None,
                   root: int, name: str, ser: Serializer) -> Any:
    """scatter once its first call filled ``slot`` (``mine``: the root's pickles)."""
    n, me = g.size, g.rank
    code, then = _HEAD.unpack_from(slot, 0)
    if then == FAILED_ANY:
        bad = [i for i, p in enumerate(mine) if p[2] == FAILED] or [0]
        _raise_failed(g, name, [FAILED] * len(bad), [root] * len(bad), mine)
    if then == GENERAL:
        packs = [pickled.pack_one(p[0], p[1]) for p in mine] if me == root else None
        return pickled.scatter_objects(g, objs, root, name, ser, packs)
    rest = None
    if then == OVERFLOW:
        sizes = _overflow([p[2] for p in mine]) if me == root else [0] * n
        send = bytearray(b"".join(p[0] for p, s in zip(mine, sizes) if s)) if me == root else bytearray()
        rc = [0] * n
        rc[root] = code if code > INLINE else 0
        rest = bytearray(rc[root])
        _a2a(g, send, sizes, rest, rc, name)
    return _unpickled(ser, slot, [code], rest, (0,))[0]


def alltoall(g: ProcessGroup, objs: Sequence[Any], name: str, ser: Serializer) -> list[Any]:
    """Item j of every rank's ``objs`` (one per rank) to rank j; what each rank sent this
    one, in rank order: the sizes all-gathered, then the pickles in one all_to_all."""
    fast = g.fast
    if fast is not None and ser.native is not None and type(objs) is list:
        got = fast.obj_alltoall(objs, name, ser.native)
        if got is not None:
            return got[1] if got[0] else _alltoall_after(g, got[1], [_made(d) for d in got[2]], objs, name, ser)
    mine = [_pickle(o, ser) for o in tuple(objs)]       # (as scatter's)
    table = bytearray(8 * g.size * g.size)           # row i: rank i's sizes (int64)
    _all_gather(g, bytearray(np.array([p[2] for p in mine], dtype=np.int64).tobytes()), table, name)
    return _alltoall_after(g, table, mine, objs, name, ser)


def _alltoall_after(g: ProcessGroup, table: bytearray, mine: list[Pickled], objs: Sequence[Any], name: str,
                    ser: Serializer) -> list[Any]:
    """alltoall once the size table is in ``table`` (``mine``: this rank's pickles)."""
    n, me = g.size, g.rank
    sizes = memoryview(table).cast("q").tolist()
    _raise_failed(g, name, sizes, [i // n for i in range(n * n)], mine)
    if BIG in sizes:
        return pickled.all_to_all_objects(g, objs, name, ser, [pickled.pack_one(p[0], p[1]) for p in mine])
    sc = sizes[me * n:(me + 1) * n]
    rc = sizes[me::n]
    recv = bytearray(sum(rc))
    _a2a(g, bytearray(b"".join(p[0] for p in mine)), sc, recv, rc, name)
    out, at = [], 0
    view = memoryview(recv)
    for c in rc:
        out.append(ser.loads(view[at:at + c], ()))
        at += c
    return out
