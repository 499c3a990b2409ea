"""Every algorithm family of every collective against a numpy reference.

Each test runs one (family, world size, root) on thread-ranks (tests/threadcomm.py) and,
inside that one run, loops over counts 0, 1, 7, 1000, dtypes, ops and in-place variants.
Data is integer-valued so float sums are exact whatever the order of combination.
"""
from __future__ import annotations

import functools
import time

import numpy as np
import pytest

import collcomm.algorithms as algos
from collcomm.algorithms import ALGORITHMS, available, select
from collcomm.errors import InvalidArgumentError
from collcomm.ops import ReduceOp, resolve

try:
    from threadcomm import run_threads
except ImportError:  # tests/ imported as a package
    from tests.threadcomm import run_threads

SIZES = [1, 2, 3, 4, 5]
COUNTS = [0, 1, 7, 1000]
TIMEOUT = 15

REF = {"SUM": np.add, "MAX": np.maximum, "PRODUCT": np.multiply}


def data(rank: int, count: int, dtype, salt: int = 0) -> np.ndarray:
    """Small integer values, different per rank (|x| <= 3 so products stay small)."""
    x = (np.arange(count) * 7 + rank * 13 + salt * 5) % 7 - 3
    arr = x.astype(dtype)
    if np.dtype(dtype).kind == "c":
        arr = arr + 1j * ((np.arange(count) + rank) % 5).astype(dtype)
    return np.ascontiguousarray(arr)


def reduce_cases(with_exotic: bool = False):
    dtypes = [np.float64, np.int32] + ([np.float16, np.complex128] if with_exotic else [])
    cases = []
    for dtype in dtypes:
        kind = np.dtype(dtype).kind
        ops = ["SUM"] if kind == "c" else ["SUM", "MAX"] + (["PRODUCT"] if kind == "i" else [])
        for op in ops:
            for count in COUNTS:
                cases.append((count, dtype, op))
    return cases


def reference(n: int, count: int, dtype, op: str) -> np.ndarray:
    return functools.reduce(REF[op], [data(r, count, dtype) for r in range(n)]).astype(dtype)


def check_equal(got, expected, what):
    assert got is not None, what
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    np.testing.assert_array_equal(got, expected, err_msg=what)


#: Families that need the real topology (a shared-memory arena, several hosts): the
#: in-process test double has neither; tests/test_families.py runs them on real ranks.
TOPOLOGY = {"shm_direct", "hierarchical"}


def point_to_point(collective):
    return [f for f in available(collective) if f not in TOPOLOGY]


def families(collective):
    return [pytest.param(f, id=f) for f in point_to_point(collective)]


# ---------------------------------------------------------------------- rooted


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("broadcast"))
def test_broadcast(family, n):
    fn = ALGORITHMS["broadcast"][family]
    cases = [(c, d) for d in (np.float64, np.int32) for c in COUNTS]

    def body(comm):
        out = []
        for root in range(n):
            for count, dtype in cases:
                buf = data(root, count, dtype) if comm.rank == root else np.zeros(count, dtype)
                fn(comm, buf, root)
                out.append(((root, count, dtype), buf))
        return out, comm.sent_messages

    results = run_threads(n, body, timeout=TIMEOUT)
    for rank, (out, sent) in enumerate(results):
        for (root, count, dtype), buf in out:
            check_equal(buf, data(root, count, dtype), f"{family} n={n} rank={rank} root={root} "
                                                       f"count={count} {np.dtype(dtype)}")
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("reduce"))
def test_reduce(family, n):
    fn = ALGORITHMS["reduce"][family]
    cases = reduce_cases()

    def body(comm):
        out = []
        for root in range(n):
            for inplace in (False, True):
                for count, dtype, op in cases:
                    send = data(comm.rank, count, dtype)
                    if comm.rank != root:
                        recv = None
                    else:
                        recv = send if inplace else np.full(count, 99, dtype)
                    fn(comm, send, recv, resolve(op, dtype, "reduce", comm.rank), root)
                    out.append(((root, inplace, count, dtype, op), send, recv))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (root, inplace, count, dtype, op), send, recv in out:
            what = f"{family} n={n} rank={rank} root={root} inplace={inplace} count={count} " \
                   f"{np.dtype(dtype)} {op}"
            if rank == root:
                check_equal(recv, reference(n, count, dtype, op), what)
            else:
                assert recv is None
                check_equal(send, data(rank, count, dtype), what + " (send modified)")
            if not (rank == root and inplace):
                check_equal(send, data(rank, count, dtype), what + " (send modified)")
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("gather"))
def test_gather(family, n):
    fn = ALGORITHMS["gather"][family]
    cases = [(c, d) for d in (np.float64, np.int32) for c in COUNTS]

    def body(comm):
        out = []
        for root in range(n):
            for inplace in (False, True):
                for count, dtype in cases:
                    send = data(comm.rank, count, dtype)
                    recv = None
                    if comm.rank == root:
                        recv = np.full(n * count, 99, dtype)
                        if inplace:
                            recv[root * count:(root + 1) * count] = send
                            send = recv[root * count:(root + 1) * count]
                    fn(comm, send, recv, root)
                    out.append(((root, inplace, count, dtype), send.copy(), recv))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (root, inplace, count, dtype), send, recv in out:
            what = f"{family} n={n} rank={rank} root={root} inplace={inplace} count={count} " \
                   f"{np.dtype(dtype)}"
            check_equal(send, data(rank, count, dtype), what + " (send modified)")
            if rank == root:
                expected = np.concatenate([data(r, count, dtype) for r in range(n)])
                check_equal(recv, expected, what)
            else:
                assert recv is None
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("scatter"))
def test_scatter(family, n):
    fn = ALGORITHMS["scatter"][family]
    cases = [(c, d) for d in (np.float64, np.int32) for c in COUNTS]

    def body(comm):
        out = []
        for root in range(n):
            for inplace in (False, True):
                for count, dtype in cases:
                    send = None
                    recv = np.full(count, 99, dtype)
                    if comm.rank == root:
                        send = np.concatenate([data(r, count, dtype, salt=root)
                                               for r in range(n)])
                        if inplace:
                            recv = send[root * count:(root + 1) * count]
                    fn(comm, send, recv, root)
                    out.append(((root, inplace, count, dtype), send, recv.copy()))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (root, inplace, count, dtype), send, recv in out:
            what = f"{family} n={n} rank={rank} root={root} inplace={inplace} count={count} " \
                   f"{np.dtype(dtype)}"
            check_equal(recv, data(rank, count, dtype, salt=root), what)
            if rank == root:
                expected = np.concatenate([data(r, count, dtype, salt=root) for r in range(n)])
                check_equal(send, expected, what + " (send modified)")
        if n == 1:
            assert sent == 0


# ---------------------------------------------------------------------- rootless


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("all_reduce"))
def test_all_reduce(family, n):
    fn = ALGORITHMS["all_reduce"][family]
    cases = reduce_cases(with_exotic=True)

    def body(comm):
        out = []
        for count, dtype, op in cases:
            buf = data(comm.rank, count, dtype)
            fn(comm, buf, resolve(op, dtype, "all_reduce", comm.rank))
            out.append(((count, dtype, op), buf))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (count, dtype, op), buf in out:
            check_equal(buf, reference(n, count, dtype, op),
                        f"{family} n={n} rank={rank} count={count} {np.dtype(dtype)} {op}")
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("all_gather"))
def test_all_gather(family, n):
    fn = ALGORITHMS["all_gather"][family]
    cases = [(c, d) for d in (np.float64, np.int32) for c in COUNTS]

    def body(comm):
        out = []
        for inplace in (False, True):
            for count, dtype in cases:
                recv = np.full(n * count, 99, dtype)
                send = data(comm.rank, count, dtype)
                if inplace:
                    recv[comm.rank * count:(comm.rank + 1) * count] = send
                    send = recv[comm.rank * count:(comm.rank + 1) * count]
                fn(comm, send, recv)
                out.append(((inplace, count, dtype), send.copy(), recv))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (inplace, count, dtype), send, recv in out:
            what = f"{family} n={n} rank={rank} inplace={inplace} count={count} {np.dtype(dtype)}"
            check_equal(recv, np.concatenate([data(r, count, dtype) for r in range(n)]), what)
            check_equal(send, data(rank, count, dtype), what + " (send modified)")
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("reduce_scatter"))
def test_reduce_scatter(family, n):
    fn = ALGORITHMS["reduce_scatter"][family]
    cases = reduce_cases()

    def body(comm):
        out = []
        for count, dtype, op in cases:
            send = data(comm.rank, n * count, dtype)
            recv = np.full(count, 99, dtype)
            fn(comm, send, recv, resolve(op, dtype, "reduce_scatter", comm.rank))
            out.append(((count, dtype, op), send, recv))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for (count, dtype, op), send, recv in out:
            what = f"{family} n={n} rank={rank} count={count} {np.dtype(dtype)} {op}"
            full = reference(n, n * count, dtype, op)
            check_equal(recv, full[rank * count:(rank + 1) * count], what)
            check_equal(send, data(rank, n * count, dtype), what + " (send modified)")
        if n == 1:
            assert sent == 0


def a2a_counts(n: int, uniform: int | None):
    """counts[i][j]: elements rank i sends to rank j (uneven, with zeros, unless uniform)."""
    if uniform is not None:
        return [[uniform] * n for _ in range(n)]
    return [[(i * 3 + j * 5 + 1) % 4 * (1 + (i + j) % 3) for j in range(n)] for i in range(n)]


def a2a_block(i: int, j: int, c: int) -> np.ndarray:
    return (i * 1000 + j * 100 + np.arange(c)).astype(np.float64)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("all_to_all"))
def test_all_to_all(family, n):
    fn = ALGORITHMS["all_to_all"][family]
    layouts = [a2a_counts(n, u) for u in COUNTS]
    if family != "bruck":
        layouts.append(a2a_counts(n, None))

    def body(comm):
        out = []
        r = comm.rank
        for counts in layouts:
            send_counts = counts[r]
            recv_counts = [counts[i][r] for i in range(n)]
            send = np.concatenate([a2a_block(r, j, send_counts[j]) for j in range(n)])
            recv = np.full(sum(recv_counts), -1.0)
            fn(comm, send, send_counts, recv, recv_counts)
            out.append((counts, send, recv))
        return out, comm.sent_messages

    for rank, (out, sent) in enumerate(run_threads(n, body, timeout=TIMEOUT)):
        for counts, send, recv in out:
            what = f"{family} n={n} rank={rank} counts={counts}"
            expected = np.concatenate([a2a_block(i, rank, counts[i][rank]) for i in range(n)])
            check_equal(recv, expected, what)
            check_equal(send, np.concatenate([a2a_block(rank, j, counts[rank][j])
                                              for j in range(n)]), what + " (send modified)")
        if n == 1:
            assert sent == 0


@pytest.mark.parametrize("n", [2, 3])
def test_bruck_all_to_all_rejects_uneven_counts(n):
    counts = [[1 + j for j in range(n)] for _ in range(n)]  # uneven on every rank

    def body(comm):
        r = comm.rank
        send = np.zeros(sum(counts[r]))
        recv = np.zeros(sum(counts[i][r] for i in range(n)))
        algos.all_to_all(comm, send, counts[r], recv, [counts[i][r] for i in range(n)],
                         algorithm="bruck")

    with pytest.raises(InvalidArgumentError, match="equal counts"):
        run_threads(n, body, timeout=TIMEOUT)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("family", families("barrier"))
def test_barrier(family, n):
    fn = ALGORITHMS["barrier"][family]

    def body(comm):
        fn(comm)  # line everybody up first
        time.sleep(0.03 * comm.rank)
        arrived = time.monotonic()
        fn(comm)
        return arrived, time.monotonic(), comm.sent_messages

    results = run_threads(n, body, timeout=TIMEOUT)
    last_arrival = max(a for a, _, _ in results)
    assert all(left >= last_arrival for _, left, _ in results)
    if n == 1:
        assert results[0][2] == 0


# ---------------------------------------------------------------------- dispatch


def test_registry_covers_every_collective():
    assert set(ALGORITHMS) == {"broadcast", "reduce", "all_reduce", "all_gather",
                               "reduce_scatter", "gather", "scatter", "all_to_all", "barrier"}
    for collective in ALGORITHMS:
        assert "linear" in available(collective)


def test_select_explicit_env_and_auto(monkeypatch):
    monkeypatch.delenv("COLLCOMM_ALGO_ALL_REDUCE", raising=False)
    table = ALGORITHMS["all_reduce"]
    # auto follows the α-β cost model: few rounds when latency-bound, least data when not
    assert select("all_reduce", 8, 4) is table["recursive_doubling"]
    assert select("all_reduce", 64 << 20, 4) in (table["ring"], table["rabenseifner"])
    assert select("all_reduce", 8, 4, "ring") is table["ring"]
    assert select("broadcast", 1 << 20, 4, "binomial") is ALGORITHMS["broadcast"]["tree"]
    assert select("broadcast", 8, 4) is ALGORITHMS["broadcast"]["tree"]
    assert select("all_to_all", 8, 4) is ALGORITHMS["all_to_all"]["pairwise"]
    assert select("barrier", 0, 4) is ALGORITHMS["barrier"]["dissemination"]
    assert select("all_gather", 8, 4) in (ALGORITHMS["all_gather"]["bruck"],
                                          ALGORITHMS["all_gather"]["recursive_doubling"])
    assert select("reduce_scatter", 64 << 20, 4) in (ALGORITHMS["reduce_scatter"]["ring"],
                                                     ALGORITHMS["reduce_scatter"]["recursive_halving"])
    assert select("all_reduce", 8, 4, shm=True) is table["shm_direct"]
    assert select("all_reduce", 8, 4, hosts=2) is table["hierarchical"]
    monkeypatch.setenv("COLLCOMM_ALGO_ALL_REDUCE", "linear")
    assert select("all_reduce", 1 << 20, 4) is table["linear"]
    assert select("all_reduce", 1 << 20, 4, "ring") is table["ring"]  # explicit wins
    monkeypatch.setenv("COLLCOMM_ALGO_ALL_REDUCE", "bogus")
    with pytest.raises(InvalidArgumentError, match="COLLCOMM_ALGO_ALL_REDUCE"):
        select("all_reduce", 8, 4)


def test_select_unknown_names_list_valid_ones():
    with pytest.raises(InvalidArgumentError) as info:
        select("all_reduce", 8, 4, "quantum")
    msg = str(info.value)
    assert "quantum" in msg and "ring" in msg and "recursive_doubling" in msg
    with pytest.raises(InvalidArgumentError, match="all_reduce"):
        select("allreduce_typo", 8, 4)


def test_entry_points_dispatch(monkeypatch):
    monkeypatch.delenv("COLLCOMM_ALGO_ALL_REDUCE", raising=False)
    n = 3

    def body(comm):
        out = {}
        fn = resolve(ReduceOp.SUM, np.float64)
        for algorithm in ["auto"] + point_to_point("all_reduce"):
            buf = data(comm.rank, 7, np.float64)
            algos.all_reduce(comm, buf, fn, algorithm=algorithm)
            out[algorithm] = buf
        big = np.ones(20000)  # 160 KB: auto picks ring
        algos.all_reduce(comm, big, fn)
        out["big"] = big
        b = np.arange(5.0) if comm.rank == 1 else np.zeros(5)
        algos.broadcast(comm, b, 1)
        out["bcast"] = b
        g = np.empty(3 * 2) if comm.rank == 0 else None
        algos.gather(comm, np.full(2, float(comm.rank)), g, 0)
        s = np.empty(2)
        algos.scatter(comm, np.arange(6.0) if comm.rank == 2 else None, s, 2)
        rs = np.empty(2)
        algos.reduce_scatter(comm, np.arange(6.0), rs, fn)
        ag = np.empty(3 * 2)
        algos.all_gather(comm, np.full(2, float(comm.rank)), ag)
        a2a = np.empty(3)
        algos.all_to_all(comm, np.arange(3.0) + 10 * comm.rank, [1, 1, 1], a2a, [1, 1, 1])
        red = np.empty(2) if comm.rank == 0 else None
        algos.reduce(comm, np.ones(2), red, fn, 0)
        algos.barrier(comm)
        out.update(g=g, s=s, rs=rs, ag=ag, a2a=a2a, red=red)
        return out

    results = run_threads(n, body, timeout=TIMEOUT)
    expected = reference(n, 7, np.float64, "SUM")
    for rank, out in enumerate(results):
        for algorithm in ["auto"] + point_to_point("all_reduce"):
            check_equal(out[algorithm], expected, algorithm)
        check_equal(out["big"], np.full(20000, 3.0), "big")
        check_equal(out["bcast"], np.arange(5.0), "bcast")
        check_equal(out["s"], np.arange(6.0)[2 * rank:2 * rank + 2], "scatter")
        check_equal(out["rs"], 3 * np.arange(6.0)[2 * rank:2 * rank + 2], "reduce_scatter")
        check_equal(out["ag"], np.repeat(np.arange(3.0), 2), "all_gather")
        check_equal(out["a2a"], np.arange(3.0) * 10 + rank, "all_to_all")
    check_equal(results[0]["g"], np.repeat(np.arange(3.0), 2), "gather")
    check_equal(results[0]["red"], np.full(2, 3.0), "reduce")


def test_threadcomm_detects_mismatch_without_hanging():
    from collcomm.errors import CollcommError

    def body(comm):
        if comm.rank == 0:
            comm.irecv(np.empty(1), 1).wait()  # rank 1 never sends: must time out, not hang

    t0 = time.monotonic()
    with pytest.raises(CollcommError):
        run_threads(2, body, timeout=0.5)
    assert time.monotonic() - t0 < 5

    def too_big(comm):
        if comm.rank == 0:
            comm.isend(np.zeros(4), 1).wait()
        else:
            comm.irecv(np.empty(2), 0).wait()

    with pytest.raises(CollcommError, match="larger"):
        run_threads(2, too_big, timeout=2)
