"""Small objects pickled and unpickled in C without the pickle module (native/_obj_quick.c).

- ``quick_dumps`` writes exactly the bytes ``pickle.dumps`` writes (protocols 4 and 5) for
  None, bools, ints within 32 bits, floats (every special value), str and bytes under 256
  bytes, and tuples, lists and dicts of them (nested, shared, a list holding itself), over
  boundary values and random structures; it declines everything else (a subclass, a wider
  int, a longer str, a lone surrogate, a tuple inside itself, a pickle over 1 KiB);
- ``quick_loads`` reads those pickles back, shared objects shared again (and the same forms
  at protocols 2 and 3, but str and bytes, which those memoize with BINPUT: pickle's), to
  what ``pickle.loads`` gives, with the exact type, and leaves anything else to
  ``pickle.loads``: other pickles, a wrong frame length, a truncated or padded pickle,
  an opcode reaching below a MARK, an unhashable key; and of 20,000 pickles with bytes
  changed, inserted or cut, what it reads pickle.loads reads the same;
- a section of the shared MPI job (tests/mpi_checks.py, 1-5 ranks and TCP): the scalars
  through every object call, and between a rank with a serializer of its own (the pickle
  module's functions wrapped: never the quick way) and ranks on the quick way.
"""
from __future__ import annotations

import math
import pickle
import random
import struct
from typing import Any

import pytest

from tests.mpi_checks import SIZES, Checker, check, job

INTS = [0, 1, 5, 127, 128, 254, 255, 256, 257, 32767, 32768, 65534, 65535, 65536, 65537, 2**24, 2**31 - 2,
        2**31 - 1, -1, -2, -128, -129, -255, -256, -257, -65535, -65536, -65537, -2**31 + 1, -2**31]
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e300, -1e-300, 5e-324, float("inf"), float("-inf"), float("nan"),
          struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0], math.pi]
TEXTS = ["", "a", "abc", "é" * 3, "日本語", "x" * 255, "€" * 85, "\x00\x01"]
BYTES = [b"", b"ab", bytes(range(256))[:255], b"\x80\x05."]
SCALARS: list[Any] = [None, True, False, *INTS, *FLOATS, *TEXTS, *BYTES]
DECLINED: list[Any] = [2**31, -2**31 - 1, 2**70, "x" * 256, "€" * 86, b"y" * 256, "\ud800", 1j, bytearray(b"ab"),
                       (1, 2**40), [1, {"a": 1j}], {"k": [None, "\udc80"]}, list(range(600)), {1, 2}, frozenset()]


class MyInt(int):
    pass


class MyStr(str):
    pass


def _structure(rng: random.Random, depth: int = 0) -> Any:
    """A random nest of tuples, lists and dicts of scalars, some of its parts shared."""
    pool: list[Any] = []

    def one(d: int) -> Any:
        pick = rng.random()
        if d > 3 or pick < 0.45:
            v = rng.choice(SCALARS)
        elif pool and pick < 0.55:
            return rng.choice(pool)              # (the same object again: BINGET)
        elif pick < 0.7:
            v = tuple(one(d + 1) for _ in range(rng.randint(0, 5)))
        elif pick < 0.85:
            v = [one(d + 1) for _ in range(rng.randint(0, 5))]
        else:
            keys = [rng.choice([rng.randint(-300, 300), rng.choice(TEXTS), None, 1.5, (1, "k")]) for _ in range(4)]
            v = {k: one(d + 1) for k in keys[: rng.randint(0, 4)]}
        if not isinstance(v, (int, float, bool)) and v is not None:
            pool.append(v)
        return v

    return one(depth)


def _core() -> Any:
    from collcomm import native

    if native.core is None or not hasattr(native.core, "quick_dumps"):
        pytest.skip("the native core is not built")
    return native.core


def _key(v: Any) -> tuple:
    """Type and bits: NaN payloads and the sign of zero count."""
    return type(v), pickle.dumps(v, 5)


@pytest.mark.parametrize("protocol", [4, 5])
def test_quick_dumps_writes_pickles_bytes(protocol):
    core = _core()
    rng = random.Random(44)
    values = SCALARS + [rng.randint(-2**31, 2**31 - 1) for _ in range(2000)] + \
        [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(2000)] + \
        ["".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0xD7FF)])) for _ in range(rng.randint(0, 80)))
         for _ in range(500)]
    for v in values:
        got = core.quick_dumps(v, protocol)
        want = pickle.dumps(v, protocol)
        if got is None:    # (only a str whose UTF-8 is over 255 bytes, among the random ones)
            assert isinstance(v, str) and len(v.encode("utf-8", "surrogatepass")) > 255, repr(v)
            continue
        assert got == want, (v, got, want)


def test_quick_dumps_writes_pickles_bytes_for_containers():
    core = _core()
    rng = random.Random(4)
    looped: list[Any] = [1, "a"]
    looped.append(looped)
    looped_dict: dict[str, Any] = {"x": (1, 2)}
    looped_dict["self"] = [looped_dict]
    for v in [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [1], {}, {"a": 1}, {"step": 3, "loss": 0.25},
              ((), ()), ([],), list(range(300)), looped, looped_dict] + [_structure(rng) for _ in range(3000)]:
        for protocol in (4, 5):
            got = core.quick_dumps(v, protocol)
            want = pickle.dumps(v, protocol)
            assert got is None or got == want, (v, got, want)
            if got is None:       # (only over 1 KiB, or nested deeper than 16)
                assert len(want) > 1000 or repr(v).count("[") + repr(v).count("(") > 16, repr(v)


def test_quick_dumps_declines_the_rest():
    from collections import OrderedDict, defaultdict, namedtuple

    core = _core()
    inner: list[Any] = []
    loop = (1, inner)
    inner.append(loop)          # (a tuple inside itself: pickle's recursive form)
    deep: Any = 1
    for _ in range(20):
        deep = [deep]
    point = namedtuple("point", "x y")
    for v in DECLINED + [MyInt(3), MyStr("s"), [MyInt(1)], OrderedDict(a=1), defaultdict(int), point(1, 2),
                         loop, deep, [c * 200 for c in "xyzwvu"]]:
        assert core.quick_dumps(v, 5) is None, repr(v)[:80]
    with pytest.raises(TypeError):
        core.quick_dumps(1, 3)          # (only the framed protocols)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_quick_loads_reads_them_back(protocol):
    core = _core()
    for v in SCALARS:
        if protocol < 4 and isinstance(v, (bytes, str)):
            assert core.quick_loads(pickle.dumps(v, protocol)) is None   # (other opcodes, BINPUT: pickle's)
            continue
        got = core.quick_loads(pickle.dumps(v, protocol))
        assert got is not None and _key(got[0]) == _key(v), (v, got)
    for v in DECLINED:
        try:
            data = pickle.dumps(v, protocol)
        except pickle.PicklingError:
            continue
        assert core.quick_loads(data) is None or _key(core.quick_loads(data)[0]) == _key(v), repr(v)


def test_quick_loads_leaves_malformed_pickles_to_pickle():
    core = _core()
    for v in [5, 300, 70000, -1, 1.5, "abc", b"ab", None, True]:
        data = pickle.dumps(v, 5)
        bad = [data[:-1], data + b".", data[:-1] + b"x", data[:2] + data[3:], b"\x80\x06" + data[2:],
               b"\x80\x01" + data[2:], data.replace(b"\x94", b"\x95") if b"\x94" in data else data[:1]]
        if b"\x95" in data[:3]:      # a frame: its length one off either way
            n = int.from_bytes(data[3:11], "little")
            bad += [data[:3] + (n + d).to_bytes(8, "little") + data[11:] for d in (-1, 1)]
        for b in bad:
            assert core.quick_loads(b) is None, (v, b)
    assert core.quick_loads(b"\x80\x05\x8c\x01\xff\x94.") is None      # (invalid UTF-8: pickle raises)
    assert core.quick_loads(b"") is None and core.quick_loads(b"\x80\x05") is None
    for bad in [b"\x80\x05](K\x01K\x02e0.", b"\x80\x05](K\x01a.", b"\x80\x05K\x01(\x85.", b"\x80\x05(\x94).",
                b"\x80\x05}](K\x01s.", b"\x80\x05}]K\x01s.", b"\x80\x05K\x01K\x02.", b"\x80\x05(K\x01.",
                b"\x80\x05h\x00.", b"\x80\x05K\x01e.", b"\x80\x05)K\x01a.", b"\x80\x05]\x94K\x01h\x01a."]:
        assert core.quick_loads(bad) is None, bad    # (pickle raises, or takes the top of its stack)
    # a dict of one list key: pickle raises TypeError; the quick way hands it over
    bad = b"\x80\x05}\x94]\x94K\x01s."
    assert core.quick_loads(bad) is None
    with pytest.raises(TypeError):
        pickle.loads(bad)


def test_quick_loads_of_mutated_pickles_agrees_with_pickle():
    """Pickles of random structures with bytes changed, inserted, repeated or cut (a peer's
    bytes are read here): what quick_loads reads, pickle.loads reads the same (shared parts
    included); nothing read that pickle refuses (20,000 mutations here; 260,000 more, some
    under AddressSanitizer, in session 45's development, without a finding)."""
    core = _core()
    rng = random.Random(11)
    ops = b"\x80\x95\x94N\x88\x89KMJG\x8c\x8dCBXh\x85\x86\x87)(\x8e\x93]}aeus.q0t"
    read = 0
    for _ in range(20000):
        v = _structure(rng) if rng.random() < 0.8 else rng.choice(SCALARS)
        data = bytearray(pickle.dumps(v, rng.choice([2, 3, 4, 5])))
        for _ in range(rng.randint(1, 4)):
            at, k = rng.randrange(len(data)), rng.random()
            if k < 0.3:
                data[at] = rng.randrange(256)
            elif k < 0.5:
                data[at] = rng.choice(ops)
            elif k < 0.65:
                del data[at]
            elif k < 0.8:
                data.insert(at, rng.choice(ops))
            elif k < 0.9:
                data[at:at] = data[rng.randrange(len(data)):][:rng.randint(1, 6)]
            else:
                del data[at:at + rng.randint(1, 8)]
            if not data:
                break
        got = core.quick_loads(bytes(data))
        if got is not None:
            read += 1
            assert _key(pickle.loads(bytes(data))) == _key(got[0]), bytes(data)
    assert read > 100          # (some mutations leave a pickle it reads: the check ran)


def test_quick_loads_keeps_what_is_shared():
    core = _core()
    rng = random.Random(5)
    shared = [1, 2]
    looped: list[Any] = [shared, shared]
    looped.append(looped)
    got = core.quick_loads(pickle.dumps(looped, 5))[0]
    assert got[0] is got[1] and got[2] is got and got[0] == [1, 2]
    for _ in range(3000):
        v = _structure(rng)
        data = pickle.dumps(v, 5)
        got = core.quick_loads(data)
        if got is None:
            assert len(data) > 1000, repr(v)[:80]
            continue
        assert pickle.dumps(got[0], 5) == data, repr(v)[:80]


# ----------------------------------------------------------------------------- through a job
def _all_calls(c: Checker, comm: Any, what: str) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    rng = random.Random(8)
    objs = SCALARS + [_structure(rng) for _ in range(40)]
    for i in range(0, len(objs), 7):
        vals = [objs[(i + j) % len(objs)] for j in range(n)]
        mine = vals[r]
        keys = [_key(v) for v in vals]
        c.eq(_key(comm.bcast(mine, n - 1)), keys[n - 1], f"{what}: bcast {vals[n - 1]!r:.30}")
        got = comm.gather(mine, 0)
        c.eq([_key(v) for v in got] if r == 0 else got, keys if r == 0 else None, f"{what}: gather")
        c.eq([_key(v) for v in comm.allgather(mine)], keys, f"{what}: allgather")
        c.eq(_key(comm.scatter(vals if r == 0 else None, 0)), keys[r], f"{what}: scatter")
        c.eq([_key(v) for v in comm.alltoall([mine] * n)], keys, f"{what}: alltoall")
        c.eq(_key(comm.sendrecv(mine, nxt, 5, None, prv, 5)), keys[prv], f"{what}: sendrecv")
        req = comm.irecv(source=prv, tag=6)
        comm.send(mine, nxt, 6)
        c.eq(_key(req.wait()), keys[prv], f"{what}: irecv + send")
        sreq = comm.isend(mine, nxt, 7)
        c.eq(_key(comm.recv(None, prv, 7)), keys[prv], f"{what}: isend + recv")
        sreq.wait()
    c.eq(comm.allreduce(r + 0.5), sum(j + 0.5 for j in range(n)), f"{what}: allreduce of floats")
    c.eq(comm.allreduce(2**31 - 1 - r), sum(2**31 - 1 - j for j in range(n)), f"{what}: allreduce past 32 bits")


def obj_quick_checks(c: Checker, MPI, comm) -> None:
    _all_calls(c, comm, "standard pickle")
    calls = [0]

    def dumps(obj, *protocol):
        calls[0] += 1
        return pickle.dumps(obj, *protocol)

    def loads(data, *rest):
        calls[0] += 1
        return pickle.loads(data, *rest)

    if comm.rank == 0:               # (rank 0's own functions; the others the quick way)
        MPI.pickle.__init__(dumps, loads)
    try:
        _all_calls(c, comm, "rank 0's own serializer")
    finally:
        MPI.pickle.__init__()
    c.true(comm.rank != 0 or calls[0] > 0, "rank 0's own serializer was called")
    comm.barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_obj_quick(n):
    check(job(n), "obj_quick")


@pytest.mark.timeout(160)
def test_obj_quick_over_tcp():
    check(job(3, "tcp"), "obj_quick")
