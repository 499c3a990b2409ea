"""The native shared-memory core (collcomm/native): built or not, it computes what the
Python path computes, bit for bit, and keeps every check the Python path makes.

* the kernels against numpy, every built-in op on every numeric dtype (in process);
* whole jobs on the native path, on the Python path (COLLCOMM_NATIVE=0) and mixed (one
  rank on each: the two implement one protocol), at n = 2 and 3 with odd counts, one-shot
  and two-shot sizes, compared byte for byte;
* mismatched calls (signature, all_to_all split sizes), a SIGKILLed peer, a timeout, all
  with the Python path's exceptions and texts;
* the GIL is released while a rank waits; heap buffers on some ranks only (the Python
  code finishes such calls); a job where the extension cannot be imported.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
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


# ------------------------------------------------------------------------- whole jobs
ONE_SHOT_COUNTS = (1, 7, 33, 1001)
TWO_SHOT = [("SUM", np.float32, 20_001), ("SUM", np.float16, 40_001), ("SUM", "bfloat16", 40_001),
            ("MIN", np.float64, 10_001), ("PRODUCT", np.int32, 20_001), ("MAX", "bfloat16", 40_003),
            # the one-step all_reduce's edge at n = 3 (6 KiB: arena_layout.all_reduce_one_step)
            ("SUM", np.float32, 1536), ("SUM", np.float32, 1537), ("MAX", np.float64, 769)]


def test_all_reduce_one_step_rule() -> None:
    # one step while (n-1)(n-2)/n x the bytes <= ALL_REDUCE_EXTRA (4 KiB), at most ONE_SHOT
    # with a core per rank; with more ranks than cores one step up to ONE_SHOT
    from collcomm.transport.arena_layout import ALL_REDUCE_EXTRA, ONE_SHOT, ONE_STEP_ALWAYS, all_reduce_one_step

    edges = {2: ONE_SHOT, 3: 6144, 4: 2730, 5: 1706, 8: 780, 16: 312}
    for n, edge in edges.items():
        assert all_reduce_one_step(edge, n, ALL_REDUCE_EXTRA), n
        assert not all_reduce_one_step(edge + 4 if n > 2 else edge + 1, n, ALL_REDUCE_EXTRA), n
        assert all_reduce_one_step(ONE_SHOT, n, ONE_STEP_ALWAYS)
        assert not all_reduce_one_step(ONE_SHOT + 1, n, ONE_STEP_ALWAYS)


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
            bad = [k for k in ref if got[k] != ref[k]]
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


# ------------------------------------------------------------------------- the checks
def _mismatch_rank() -> list[tuple[str, str]]:
    """Rank 1 differs in one field per case; every rank reports what it raised, and the
    group keeps working after each."""
    import collcomm as dist
    from collcomm.errors import MismatchError

    me, n = dist.get_rank(), dist.get_world_size()
    odd = me == 1
    f32 = np.float32
    cases = {
        "dtype": lambda: dist.all_reduce(np.ones(4, dtype=np.float64 if odd else f32)),
        "count": lambda: dist.all_reduce(np.ones(5 if odd else 4, dtype=f32)),
        "op": lambda: dist.all_reduce(np.ones(4, dtype=f32), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM),
        "root": lambda: dist.broadcast(np.ones(3, dtype=f32), src=1 if odd else 0),
        "collective": lambda: (dist.barrier() if odd else dist.all_reduce(np.ones(4, dtype=f32))),
        "reduce root": lambda: dist.reduce(np.ones(2, dtype=f32), dst=1 if odd else 0),
        "gather dtype": lambda: dist.all_gather_into_tensor(np.empty(2 * n, dtype=np.int32 if odd else f32),
                                                            np.ones(2, dtype=np.int32 if odd else f32)),
        "a2a splits": lambda: dist.all_to_all_single(
            np.empty(2 * n), np.arange(2.0 * n), output_split_sizes=[2] * n,
            input_split_sizes=[1, 2, 3] + [2] * (n - 3) if odd else [2] * n),
    }
    out = []
    for what, call in cases.items():
        try:
            call()
            out.append((what, "no error"))
        except MismatchError as exc:
            out.append((what, str(exc)))
        except Exception as exc:  # noqa: BLE001 - reported
            out.append((what, f"{type(exc).__name__}: {exc}"))
        x = np.full(3, me + 1.0)
        dist.all_reduce(x)
        assert x.tolist() == [n * (n + 1) / 2] * 3, (what, x)
    return out


@needs_core
@pytest.mark.timeout(200)
def test_mismatches_raise_the_python_paths_errors() -> None:
    nat = run_ranks(_mismatch_rank, 3, transport="shm", timeout=90,
                   env={"COLLCOMM_EAGER_ROOTED": "0"})   # (errors within the call, as Python)
    py = run_ranks(_mismatch_rank, 3, transport="shm", timeout=90, env={"COLLCOMM_NATIVE": "0"})
    def same(text: str) -> str:   # job-specific paths (a flight-recorder dump) aside
        return re.sub(r"collcomm-fr-[0-9a-f]+", "collcomm-fr-JOB", text)

    for r in range(3):
        for (what, got), (_, want) in zip(nat[r], py[r]):
            assert got != "no error" and "Error" not in got.split(":")[0], (r, what, got)
            assert same(got) == same(want), (r, what, got, want)


def _await_file(path: str, limit: float) -> None:
    """Until ``path`` exists (another rank's word that something happened), ``limit`` s at most."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _skip_rank(victim: int, gave_up: str) -> str:
    import collcomm as dist

    me = dist.get_rank()
    x = np.ones(2, dtype=np.float32)
    dist.all_reduce(x)
    if me == victim:
        _await_file(gave_up, 3.0)  # skips the next call; leaves after the others gave up
        return "skipped"
    t0 = time.monotonic()
    try:
        with dist.call_timeout(1.0):
            dist.all_reduce(x)
    except dist.CommTimeoutError as exc:
        took = time.monotonic() - t0
        open(gave_up, "w").close()
        return f"{took:.2f} {exc}"
    return "no error"


@needs_core
@pytest.mark.timeout(120)
def test_timeout_names_the_late_rank(tmp_path) -> None:
    res = run_ranks(_skip_rank, 2, 1, str(tmp_path / "gave-up"), transport="shm", timeout=60)
    elapsed, text = res[0].split(" ", 1)
    assert 0.9 < float(elapsed) < 3.0, res[0]
    assert "timed out after 1 s in shared memory" in text and "still waiting for rank 1" in text, text


def _loop_until_lost(victim: int, stamp: str) -> tuple[str, float, str]:
    """Loop on small all_reduces; the victim SIGKILLs itself in the middle of the loop,
    after writing down when."""
    import signal

    import collcomm as dist

    x = np.ones(2, dtype=np.float32)
    try:
        for i in range(10**9):
            if i == 300 and dist.get_rank() == victim:
                with open(stamp, "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(x)
    except Exception as exc:  # noqa: BLE001 - reported
        return type(exc).__name__, time.time(), str(exc)
    return "no error", time.time(), ""


@needs_core
@pytest.mark.timeout(120)
def test_sigkilled_peer_is_lost_quickly(tmp_path) -> None:
    """Ranks loop on small all_reduces on the native path; rank 2 is SIGKILLed in the
    middle: both survivors raise PeerLostError naming it within a few seconds."""
    stamp = str(tmp_path / "killed")
    outcomes = run_ranks(_loop_until_lost, 3, 2, stamp, transport="shm", timeout=60,
                         expect_failure=True)
    killed = float(open(stamp).read())
    assert outcomes[2].exitcode == -9
    for o in outcomes[:2]:
        assert o.ok, o.error
        kind, when, text = o.value
        assert kind == "PeerLostError", (kind, text)
        assert "rank 2" in text and "died" in text, text
        assert when - killed < 5.0, f"raised {when - killed:.1f} s after the kill"


def _gil_rank() -> int:
    """Rank 0 waits in a barrier for rank 1 (asleep for 0.6 s) while a thread of rank 0
    counts: the count grows only if the wait released the GIL."""
    import threading

    import collcomm as dist

    if dist.get_rank() == 1:
        dist.barrier()
        time.sleep(0.6)
        dist.barrier()
        return 0
    dist.barrier()
    stop, count = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    before = count[0]
    dist.barrier()
    after = count[0]
    stop.set()
    t.join()
    return after - before


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


def _all_reduce_or_error() -> str:
    import collcomm as dist
    from collcomm.errors import MismatchError

    import collcomm.core.runtime as rt

    try:
        buf = np.ones(3)
        dist.all_reduce(buf)
        big = np.arange(3000, dtype=np.float32)      # 12 KB: two steps at n = 3 by default
        dist.all_reduce(big)
        assert np.array_equal(big, np.arange(3000, dtype=np.float32) * 3)
        arena = rt.get_world("x")._arena
        core = arena.native_core
        return f"done {buf.tolist()} {arena.cores} {arena.all_reduce_extra} " \
               f"{arena.all_reduce_extra if core is None else core.all_reduce_extra}"
    except MismatchError as exc:
        return str(exc)


@pytest.mark.timeout(60)
def test_ranks_must_agree_on_the_all_reduce_steps() -> None:
    # one rank told COLLCOMM_ALL_REDUCE_EXTRA=0 (two steps from n = 3), the others not:
    # every rank refuses the arena with a MismatchError naming the setting, nobody hangs
    res = run_ranks(_all_reduce_or_error, 3, transport="shm", timeout=40,
                    rank_env={1: {"COLLCOMM_ALL_REDUCE_EXTRA": "0"}})
    for text in res:
        assert "COLLCOMM_ALL_REDUCE_EXTRA differs" in text and "rank 1: 0" in text, text
    # alike: a core per rank (the fewest any rank has) takes the bound, else one step to
    # ONE_SHOT; the native core gets the group's value
    from collcomm.transport.arena_layout import ONE_STEP_ALWAYS
    for env, cores, extra in (({"COLLCOMM_ALL_REDUCE_EXTRA": "0", "COLLCOMM_CORES": "3"}, 3, 0),
                              ({"COLLCOMM_CORES": "2"}, 2, ONE_STEP_ALWAYS)):
        same = run_ranks(_all_reduce_or_error, 3, transport="shm", timeout=40, env=env,
                         rank_env={2: {"COLLCOMM_CORES": "8"}})
        assert same == [f"done [3.0, 3.0, 3.0] {cores} {extra} {extra}"] * 3, same


def test_waiting_releases_the_gil() -> None:
    counted = run_ranks(_gil_rank, 2, transport="shm", timeout=60)[0]
    assert counted > 10_000, counted


def _heap_rank() -> dict[str, Any]:
    """all_reduce / broadcast / all_gather where only rank 0's buffer is in the shared heap
    (read in place): the native ranks hand the rest of the call to the Python code."""
    import collcomm as dist
    import collcomm.core.runtime as rt

    me, n = dist.get_rank(), dist.get_world_size()
    heap = dist.empty(6, dtype=np.float64)
    buf = heap if me == 0 else np.empty(6)
    buf[:] = np.arange(6) + me
    dist.all_reduce(buf)
    ar = buf.tolist()
    buf[:] = 7.0 + me
    dist.broadcast(buf, src=0)
    bc = buf.tolist()
    buf[:] = me
    ag = np.empty(6 * n)
    dist.all_gather_into_tensor(ag, buf)
    core = rt.get_world("x")._arena.native_core
    return {"all_reduce": ar, "broadcast": bc, "all_gather": ag.tolist(), "finished": core.finished}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fast", ["0", "1"])
def test_heap_buffer_on_one_rank_only(fast: str) -> None:
    # rank 0 takes the regular path (the fast call stages heap buffers like any other);
    # ranks 1 and 2 the regular path's native call, or the fast call (core/fastpath.py)
    res = run_ranks(_heap_rank, 3, transport="shm", timeout=60, env={"COLLCOMM_FAST": fast},
                    rank_env={0: {"COLLCOMM_FAST": "0"}})
    for r, out in enumerate(res):
        assert out["all_reduce"] == (np.arange(6) * 3 + 3).tolist()
        assert out["broadcast"] == [7.0] * 6
        assert out["all_gather"] == np.repeat(np.arange(3.0), 6).tolist()
        # ranks 1 and 2 ran their part natively up to the first sync, then Python finished
        assert out["finished"] == (0 if r == 0 else 3), out


def _interrupted_rank(done: str) -> str:
    """Rank 0 waits in a barrier that rank 1 never enters (it waits until rank 0 is done, 2 s
    at most); a SIGINT after 0.3 s must end rank 0's wait with KeyboardInterrupt (as in the
    Python path)."""
    import signal
    import threading

    import collcomm as dist

    if dist.get_rank() == 1:
        dist.barrier()
        _await_file(done, 2.0)
        return "slept"
    dist.barrier()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        with dist.call_timeout(10):
            dist.barrier()
    except KeyboardInterrupt:
        took = time.monotonic() - t0
        open(done, "w").close()
        return f"interrupted after {took:.2f} s"
    open(done, "w").close()
    return "not interrupted"


@needs_core
@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_wait(tmp_path) -> None:
    got = run_ranks(_interrupted_rank, 2, str(tmp_path / "done"), transport="shm", timeout=60,
                    expect_failure=True)[0]
    assert got.ok and got.value.startswith("interrupted"), (got.value, got.error)
    assert float(got.value.split()[2]) < 1.5, got.value


def _odd_buffers_rank() -> list[str]:
    """Buffers the core cannot take (a read-only output, a strided view) go to the Python
    code, which says what is wrong (or copes), the same on every rank; the group goes on."""
    import collcomm.core.runtime as rt
    from collcomm import algorithms

    g = rt.get_world("x")
    n, me = g.size, g.rank
    out = []
    recv = np.zeros(2 * n)
    recv.flags.writeable = False
    try:
        g.run("all_gather", lambda c: algorithms.all_gather(c, np.ones(2), recv, algorithm="shm_direct"))
        out.append("no error")
    except ValueError as exc:
        out.append(f"ValueError: {exc}")
    view = np.arange(16.0)[::2]                 # not contiguous
    view[:] = me + 1.0
    g.run("broadcast", lambda c: algorithms.broadcast(c, view, 0, algorithm="shm_direct"))
    out.append(str(view.tolist()))
    x = np.full(3, me + 1.0)
    g.run("all_reduce", lambda c: algorithms.all_reduce(c, x, ops.resolve("sum", x.dtype),
                                                         algorithm="shm_direct"))
    out.append(str(x.tolist()))
    return out


@needs_core
@pytest.mark.timeout(120)
def test_buffers_the_core_cannot_take_go_to_python() -> None:
    res = run_ranks(_odd_buffers_rank, 2, transport="shm", timeout=60)
    for r, out in enumerate(res):
        assert out[0].startswith("ValueError") and "read-only" in out[0], out[0]
        assert out[1] == str([1.0] * 8), out[1]
        assert out[2] == "[3.0, 3.0, 3.0]", out[2]
