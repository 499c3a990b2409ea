"""The native shared-memory core (collcomm/native): built or not, it computes what the
Python path computes, bit for bit.

* the kernels against numpy, every built-in op on every numeric dtype (in process), and
  the wait policy's settings;
* whole jobs on the native path, on the Python path (COLLCOMM_NATIVE=0) and mixed (one
  rank on each: the two implement one protocol), at n = 2 and 3 with odd counts, one-shot
  and two-shot sizes, compared byte for byte; a job where the extension cannot be imported.

That it keeps every check the Python path makes: tests/test_native_checks.py.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
import pytest

from collcomm import native, ops
from collcomm.errors import InvalidArgumentError
from tests.harness import ROOT, run_ranks

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"]
DTYPES: list[Any] = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                     np.int64, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                     np.complex128, "bfloat16"]
#: pairs the core may leave to Python: numpy's complex product uses fused multiply-adds in
#: its SIMD loop where the CPU has them, and its NaN signs there are not reproduced
MAY_REFUSE = {("PRODUCT", "c", "complex64"), ("PRODUCT", "c", "complex128")}
#: ops whose result may be either of two different NaNs meeting in one element: IEEE 754
#: leaves the choice open and numpy's SIMD body and scalar tail choose differently, so
#: bit-identity is tested with one NaN encoding there (and NaN-for-NaN with many)
ARITHMETIC = ("SUM", "PRODUCT", "AVG")

needs_core = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def _allowed(op: str, dtype: Any) -> bool:
    try:
        ops.resolve(op, dtype if dtype == "bfloat16" else np.dtype(dtype))
    except InvalidArgumentError:
        return False
    return True


def _storage(dtype: Any) -> np.dtype:
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def _data(rng: np.random.Generator, dtype: Any, count: int, op: str) -> np.ndarray:
    x = _random(rng, dtype, count)
    return native.one_nan(x, dtype == "bfloat16") if op in ARITHMETIC else x


def _same_but_nan_encoding(want: np.ndarray, got: np.ndarray, bf16: bool) -> bool:
    """Equal bytes wherever either is not a NaN, and NaN in the same places."""
    def nan(x: np.ndarray) -> np.ndarray:
        if bf16:
            return np.isnan((x.view(np.uint16).astype(np.uint32) << 16).view(np.float32))
        if x.dtype.kind == "c":
            return np.isnan(x.real) | np.isnan(x.imag)
        return np.isnan(x)

    wn, gn = nan(want), nan(got)
    return bool(np.array_equal(wn, gn)) and want[~wn].tobytes() == got[~gn].tobytes()


def _random(rng: np.random.Generator, dtype: Any, count: int) -> np.ndarray:
    """Values of every kind: for floats zeros of both signs, infinities, NaNs (two
    payloads), extremes, subnormals and random magnitudes; raw bit patterns for the
    16-bit floats; the whole range for integers."""
    st = _storage(dtype)
    if dtype == "bfloat16" or st == np.float16:
        return rng.integers(0, 1 << 16, count, dtype=np.uint16).view(st)
    if st.kind == "b":
        return rng.integers(0, 2, count).astype(np.bool_)
    if st.kind in "iu":
        info = np.iinfo(st)
        return rng.integers(info.min, info.max, count, dtype=st, endpoint=True)
    real = np.dtype(f"f{st.itemsize // 2}") if st.kind == "c" else st
    fi = np.finfo(real)
    nan2 = (np.array([np.nan], dtype=real).view(f"u{real.itemsize}") | 1).view(real)
    pool = np.concatenate([np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, fi.max, -fi.max,
                                     fi.tiny, fi.smallest_subnormal, 1.0, -1.0], dtype=real), nan2])

    def part() -> np.ndarray:
        x = (rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(real)
        special = rng.random(count) < 0.25
        x[special] = pool[rng.integers(0, len(pool), int(special.sum()))]
        return x

    if st.kind == "c":
        out = np.empty(count, dtype=st)
        out.real, out.imag = part(), part()
        return out
    return part()


# ------------------------------------------------------------------------- in process
def test_core_is_built_where_a_compiler_is() -> None:
    """A checkout with a C compiler gets the core (``pip install -e .`` builds it); without
    one, collcomm says why and runs on Python."""
    if native.core is None and "COLLCOMM_NATIVE=0" in native.reason:
        pytest.skip("COLLCOMM_NATIVE=0 in this environment")
    if not (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")):
        assert native.core is None and "not built" in native.reason
        return
    assert native.core is not None, native.reason


@needs_core
@pytest.mark.parametrize("op", OPS)
def test_kernels_match_numpy_bit_for_bit(op: str) -> None:
    """Every dtype the op allows, lengths 1-67 and 1001 (SIMD bodies and tails): the C
    kernel leaves the same bytes as the Python combiner (numpy) does."""
    rng = np.random.default_rng(abs(hash(op)) % 2**32)
    for dtype in DTYPES:
        if not _allowed(op, dtype):
            continue
        st = _storage(dtype)
        fn = ops.resolve(op, dtype if dtype == "bfloat16" else st)
        code = native.code_for(fn, st)
        name = "bfloat16" if dtype == "bfloat16" else st.name
        kind = "bf16" if dtype == "bfloat16" else st.kind
        tag = ("SUM" if op == "AVG" else op, kind, st.name)
        if code < 0:
            assert tag in MAY_REFUSE, f"{op} on {name} left to Python: {native.refused.get(tag)}"
            continue
        for count in list(range(1, 68)) + [1001]:
            a, b = _data(rng, dtype, count, op), _data(rng, dtype, count, op)
            want, got = a.copy(), a.copy()
            with np.errstate(all="ignore"):
                fn(want, b)
            native.core.combine(code, got, b)
            assert want.tobytes() == got.tobytes(), (op, name, count, a, b, want, got)
            if op in ARITHMETIC and kind in ("f", "c", "bf16"):
                # NaNs of several encodings: the same values, NaN where numpy has NaN
                a, b = _random(rng, dtype, count), _random(rng, dtype, count)
                want, got = a.copy(), a.copy()
                with np.errstate(all="ignore"):
                    fn(want, b)
                native.core.combine(code, got, b)
                assert _same_but_nan_encoding(want, got, kind == "bf16"), (op, name, count, a, b)


@needs_core
def test_refused_pairs_are_only_the_known_ones() -> None:
    for op in OPS:
        for dtype in DTYPES:
            if _allowed(op, dtype):
                st = _storage(dtype)
                native.code_for(ops.resolve(op, dtype if dtype == "bfloat16" else st), st)
    assert set(native.refused) <= MAY_REFUSE, native.refused


def test_user_functions_and_odd_dtypes_stay_in_python() -> None:
    assert native.code_for(ops.resolve(lambda a, b: a + b, np.dtype(np.float32)), np.dtype(np.float32)) == -1
    assert native.code_for(ops.resolve("sum", np.dtype(np.longdouble)), np.dtype(np.longdouble)) == -1 \
        or np.dtype(np.longdouble).itemsize == 8
    big_endian = np.dtype(">f4")
    assert native.code_for(ops.resolve("sum", big_endian), big_endian) == -1


@needs_core
@pytest.mark.timeout(120)
def test_wait_policy_follows_cores_and_the_environment(monkeypatch) -> None:
    # with a CPU per rank a wait polls 1 ms before the futex, with more ranks than CPUs not
    # at all; COLLCOMM_CORES says how many CPUs, COLLCOMM_POLL_US how long
    from collcomm.transport import arena, peer_process

    monkeypatch.delenv("COLLCOMM_POLL_US", raising=False)
    monkeypatch.setenv("COLLCOMM_CORES", "4")
    assert peer_process.cpus() == 4
    assert arena.poll_seconds(4, peer_process.cpus()) == arena.POLL_SECONDS == 1e-3
    assert arena.poll_seconds(5, peer_process.cpus()) == 0.0
    monkeypatch.setenv("COLLCOMM_POLL_US", "250")
    assert arena.poll_seconds(5, peer_process.cpus()) == pytest.approx(250e-6)
    from collcomm.transport import shm_segments
    for bad in ("soon", "inf", "nan", "1e9", "-5"):   # not a number of µs up to 100 ms: the default
        shm_segments._warned.discard("poll_us")
        monkeypatch.setenv("COLLCOMM_POLL_US", bad)
        with pytest.warns(RuntimeWarning, match="COLLCOMM_POLL_US"):
            assert arena.poll_seconds(4, peer_process.cpus()) == 1e-3
    monkeypatch.setenv("COLLCOMM_CORES", "many")      # not a count: the affinity mask, a warning
    shm_segments._warned.discard("cores")
    with pytest.warns(RuntimeWarning, match="COLLCOMM_CORES"):
        assert peer_process.cpus() == len(os.sched_getaffinity(0))


# ------------------------------------------------------------------------- whole jobs
ONE_SHOT_COUNTS = (1, 7, 33, 1001)
TWO_SHOT = [("SUM", np.float32, 20_001), ("SUM", np.float16, 40_001), ("SUM", "bfloat16", 40_001),
            ("MIN", np.float64, 10_001), ("PRODUCT", np.int32, 20_001), ("MAX", "bfloat16", 40_003),
            # the one-step all_reduce's edge at n = 3 (6 KiB: arena_layout.all_reduce_one_step)
            ("SUM", np.float32, 1536), ("SUM", np.float32, 1537), ("MAX", np.float64, 769)]


def _identity_rank() -> dict[str, Any]:
    """Every op x dtype through all_reduce, reduce and reduce_scatter (core.collectives,
    the layer every front end calls); returns the bytes of every result."""
    import collcomm.core.collectives as cc
    import collcomm.core.runtime as rt

    g = rt.get_world("test_native")
    n, me = g.size, g.rank
    out: dict[str, bytes] = {}
    calls = 0
    cases = [(op, dt, c) for op in OPS for dt in DTYPES if _allowed(op, dt) for c in ONE_SHOT_COUNTS]
    cases += TWO_SHOT
    with np.errstate(all="ignore"):
        for i, (op, dtype, count) in enumerate(cases):
            rng = np.random.default_rng([i, me])
            logical = dtype if dtype == "bfloat16" else None
            key = f"{op}/{dtype if isinstance(dtype, str) else np.dtype(dtype).name}/{count}"
            buf = _data(rng, dtype, count, op)
            cc.all_reduce(g, buf, op, dtype=logical, algorithm="shm_direct")
            out["all_reduce " + key] = buf.tobytes()
            send = _data(rng, dtype, count, op)
            root = i % n
            recv = np.empty_like(send) if me == root else None
            cc.reduce(g, send, recv, op, root, dtype=logical, algorithm="shm_direct")
            if recv is not None:
                out["reduce " + key] = recv.tobytes()
            if count <= 1001:
                send = _data(rng, dtype, n * count, op)
                recv = np.empty(count, dtype=send.dtype)
                cc.reduce_scatter(g, send, recv, op, dtype=logical, algorithm="shm_direct")
                out["reduce_scatter " + key] = recv.tobytes()
                calls += 1
            calls += 2
    core = getattr(g._arena, "native_core", None)
    return {"results": out, "calls": calls, "native": None if core is None else (core.done, core.finished)}


def _nan_encoding_only(key: str, want: bytes, got: bytes) -> bool:
    """A result of SUM, PRODUCT or AVG that differs from the Python path's only in which
    NaN it holds where two meet: ``inf - inf`` or ``0 * inf`` makes the CPU's default NaN
    (sign set), the data's NaN has it clear, and IEEE 754 leaves open which of two NaN
    operands an operation returns; numpy 2.2 returns the other one than numpy 2.4-2.5 and
    the core (found running the suite on Python 3.10, whose newest numpy is 2.2.6). Every
    other bit must still agree."""
    op, dtype, _ = key.split(" ", 1)[1].split("/")
    if op not in ARITHMETIC or dtype not in ("float16", "float32", "float64", "complex64",
                                             "complex128", "bfloat16"):
        return False
    store = _storage(dtype)
    return _same_but_nan_encoding(np.frombuffer(want, store), np.frombuffer(got, store),
                                  dtype == "bfloat16")


def _mode_env(mode: str, n: int) -> dict[int, dict[str, str]] | None:
    if mode == "native":
        return None
    if mode == "python":
        return {r: {"COLLCOMM_NATIVE": "0"} for r in range(n)}
    return {1: {"COLLCOMM_NATIVE": "0"}}   # mixed: rank 1 on Python, the others native


@needs_core
@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3])
def test_native_and_python_paths_agree_bit_for_bit(n: int) -> None:
    jobs = {mode: run_ranks(_identity_rank, n, transport="shm", timeout=280, rank_env=_mode_env(mode, n))
            for mode in ("native", "python", "mixed")}
    for r in range(n):
        calls = jobs["native"][r]["calls"]
        done, finished = jobs["native"][r]["native"]
        # every call but the complex products the core leaves to Python ran natively
        assert done >= calls * 0.95 and finished == 0, (done, finished, calls)
        assert jobs["python"][r]["native"] is None
        assert (jobs["mixed"][r]["native"] is None) == (r == 1)
        ref = jobs["python"][r]["results"]
        for mode in ("native", "mixed"):
            got = jobs[mode][r]["results"]
            assert got.keys() == ref.keys()
            bad = [k for k in ref if got[k] != ref[k] and not _nan_encoding_only(k, ref[k], got[k])]
            assert not bad, f"rank {r}, {mode} vs python: {len(bad)} results differ: {bad[:10]}"
    # all_reduce: the same bits on every rank
    for key, value in jobs["native"][0]["results"].items():
        if key.startswith("all_reduce"):
            assert all(jobs["native"][r]["results"][key] == value for r in range(n)), key


def _every_collective_rank() -> dict[str, Any]:
    """Each collective once, on plain arrays: the results and the core's counters."""
    import collcomm as dist
    import collcomm.core.runtime as rt

    n, me = dist.get_world_size(), dist.get_rank()
    res: dict[str, Any] = {}
    x = np.arange(5, dtype=np.float64) + me
    dist.all_reduce(x)
    res["all_reduce"] = x.tolist()
    b = np.arange(3, dtype=np.int16) * (me + 1)
    dist.broadcast(b, src=n - 1)
    res["broadcast"] = b.tolist()
    r = np.full(4, float(me + 1))
    dist.reduce(r, dst=0, op=dist.ReduceOp.MAX)
    res["reduce"] = r.tolist()
    ag = np.empty(2 * n, dtype=np.int64)
    dist.all_gather_into_tensor(ag, np.array([me, 10 * me]))
    res["all_gather"] = ag.tolist()
    chunks = [np.empty(2, dtype=np.float32) for _ in range(n)] if me == 1 else None
    dist.gather(np.full(2, me, dtype=np.float32), chunks, dst=1)
    res["gather"] = None if chunks is None else [c.tolist() for c in chunks]
    sc = np.empty(3, dtype=np.uint8)
    dist.scatter(sc, [np.full(3, j + 7, dtype=np.uint8) for j in range(n)] if me == 0 else None, src=0)
    res["scatter"] = sc.tolist()
    rs = np.empty(2, dtype=np.float32)
    dist.reduce_scatter_tensor(rs, np.arange(2.0 * n, dtype=np.float32) * (me + 1))
    res["reduce_scatter"] = rs.tolist()
    a2 = np.empty(n * 3, dtype=np.int32)
    dist.all_to_all_single(a2, np.arange(3 * n, dtype=np.int32) + 100 * me)
    res["all_to_all"] = a2.tolist()
    sizes = [j + 1 for j in range(n)]            # uneven: rank i sends j+1 elements to j
    a2v = np.empty((me + 1) * n, dtype=np.float64)
    dist.all_to_all_single(a2v, np.concatenate([np.full(j + 1, 10.0 * me + j) for j in range(n)]),
                           output_split_sizes=[me + 1] * n, input_split_sizes=sizes)
    res["all_to_allv"] = a2v.tolist()
    # point-to-point: a ring exchange by batch, then by isend/irecv (the works are C
    # objects with the core, core/p2p.py's stand-in class without it)
    got = np.zeros(2, dtype=np.int32)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.array([me, 1], np.int32), (me + 1) % n),
                                    dist.P2POp(dist.irecv, got, (me - 1) % n)])
    res["exchange"] = ([w.wait() for w in works], got.tolist(), works[1].source_rank())
    w = dist.irecv(got, (me - 1) % n, tag=3)
    dist.isend(np.array([me, 2], np.int32), (me + 1) % n, tag=3).wait()
    res["isend/irecv"] = (w.wait(), got.tolist(), w.is_success())
    dist.barrier()
    core = getattr(rt.get_world("x")._arena, "native_core", None)
    res["native"] = None if core is None else (core.done, core.finished)
    res["reason"] = __import__("collcomm.native", fromlist=["reason"]).reason
    return res


@pytest.mark.timeout(200)
def test_every_collective_without_the_build(tmp_path) -> None:
    """Ranks that cannot import the extension (as after an install without a compiler)
    say why and compute the same results as ranks that have it."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nsys.modules['collcomm.native._shmcore'] = None  # as if never built\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "COLLCOMM_NATIVE": "1"}
    without = run_ranks(_every_collective_rank, 3, transport="shm", timeout=90, env=env)
    for res in without:
        assert res["native"] is None and res["reason"].startswith("not built"), res["reason"]
    if native.core is None:
        return
    with_core = run_ranks(_every_collective_rank, 3, transport="shm", timeout=90)
    for a, b in zip(with_core, without):
        assert a["native"] is not None and a["native"][0] >= 10, a["native"]
        assert {k: v for k, v in a.items() if k not in ("native", "reason")} == \
               {k: v for k, v in b.items() if k not in ("native", "reason")}
