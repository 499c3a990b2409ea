"""The native shared-memory core: the arena barrier and the one-host collectives in C.

``collcomm/native/_shmcore.c`` implements, step for step, the protocol of
:mod:`collcomm.algorithms.shm_direct` (same header words, slots, page offsets, phases,
syncs and order of accumulation), for small and medium messages and the built-in reduce
ops on the numeric dtypes (bool, int8…uint64, float16/32/64, complex64/128, bfloat16).
shm_direct calls it when it is there; the Python code stays the reference and the
fallback (user functions, other dtypes, the shared heap, cross-memory attach, messages
larger than a slot). A rank on the native path and a rank on the Python path work
together in one arena and compute the same bits.

* :data:`core` — the compiled module, or ``None``; :data:`reason` says why not (not built:
  no C compiler at install time; ``COLLCOMM_NATIVE=0`` in the environment).
* :func:`attach` — a rank's native view of an arena (``None`` without the core).
* :func:`code_for` — the kernel code of a combiner on a dtype, or -1. Each (op, dtype)
  pair is checked once per process against the Python combiner on probe data (zeros of
  both signs, infinities, NaNs with payloads, extremes, random values): a pair whose bits
  differ stays on the Python path (:data:`refused` lists them with the reason).
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Any, Callable

import numpy as np

__all__ = ["OPS", "attach", "code_for", "core", "reason", "refused"]

core: Any = None
reason = ""
if os.environ.get("COLLCOMM_NATIVE", "1").strip() == "0":
    reason = "disabled by COLLCOMM_NATIVE=0"
else:
    try:
        core = importlib.import_module(f"{__name__}._shmcore")
    except ImportError as exc:
        reason = (f"not built ({exc}): collcomm was installed without a C compiler; it works "
                  "in pure Python (reinstall where one is available for the native core)")



def _ndarray_probes() -> list[np.ndarray]:
    """Arrays on which the core checks that it reads a numpy array's buffer as numpy's
    getbuffer gives it (native/_ndarray.c): every built-in dtype the calls take, and the
    shapes and flags that must be read right or declined."""
    probes = [np.arange(6).astype(t) for t in ("?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8",
                                               "f2", "f4", "f8", "c8", "c16", np.intc, np.uintc,
                                               np.int_, np.uint, np.longlong, np.ulonglong)]
    frozen = np.arange(5, dtype=np.float32)
    frozen.flags.writeable = False
    probes += [frozen, np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(3, 4)[:, 1],
               np.array(7, np.int64), np.zeros(0, np.float32), np.arange(4, dtype=">f4"),
               np.arange(6, dtype=np.float64)[::2], np.zeros((2, 0, 3), np.int16),
               np.broadcast_to(np.arange(3.0), (2, 3))]
    return probes


if core is not None:
    #: whether the core reads numpy arrays' buffers from their fields (else numpy's getbuffer)
    ndarray_direct = bool(core.set_ndarray(np.ndarray, _ndarray_probes()))

#: op names in the order of the C kernel table (AVG is SUM, then a division in Python)
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR")
#: (kind, itemsize) -> the C dtype code; bfloat16 (uint16 bits) is BF16
_DTYPES = {("b", 1): 0, ("i", 1): 1, ("u", 1): 2, ("i", 2): 3, ("u", 2): 4, ("i", 4): 5,
           ("u", 4): 6, ("i", 8): 7, ("u", 8): 8, ("f", 2): 9, ("f", 4): 10, ("f", 8): 11,
           ("c", 8): 12, ("c", 16): 13}
BF16 = 14

#: (op, kind, dtype) pairs kept on the Python path, with why
refused: dict[tuple[str, str, str], str] = {}

#: waiting: spin this long, then yield this many times, then block on a futex; with more
#: ranks than CPUs hand the CPU over at once (COLLCOMM_SPIN_US, COLLCOMM_YIELDS override).
#: Measured (8-byte all_reduce / broadcast through the API, (barrier; call) medians,
#: settings interleaved in one job, 2-core VM shared with other work, load 5-8): n=2 the
#: same for every spin from 2 µs to 1 ms when the machine is quiet; under load a long spin
#: is a disaster (1 ms: 1-1.8 ms medians, 200 µs: 270-680, 50 µs: 100-280, 2-20 µs:
#: 27-240): the peer may be waiting for the very CPU we spin on, and a yield hands it over.
#: n=4: spin 0 + 3 yields 10-30% faster than 2 µs + 100 yields, no worse than 0-30 yields.
#: Session 17 (quiet 2-vCPU VM, two groups of the same ranks, one per setting, alternated
#: in one job, (barrier; call) medians of the slowest rank): 30 yields beat 3 at n=3 and 4
#: (two barriers back to back 9-12 µs vs 18-28, one barrier 8.6-10.3 vs 10.2-11.5,
#: all_reduce 8 B 9.9-11.4 vs 11.5-12.8), 10-1000 all alike: with 3 a wait fell asleep on
#: the futex in 6-11% of barriers (a wake-up costs tens of µs here), with 30 in none.
#: Whatever the spin, a waiter whose late peer last arrived on the waiter's own CPU
#: (arena_layout.CPU) yields at once: with one other busy process on 2 CPUs the two
#: ranks often share a CPU, and a spin there only delays the peer (bench medians of
#: 8-byte calls at n=2: 21-55 µs spinning first, 5.5-7.5 µs yielding at once).
SPIN_NS, YIELDS = 5_000, 100
SPIN_NS_OVERSUBSCRIBED, YIELDS_OVERSUBSCRIBED = 0, 30


def stage_nt() -> int:
    """COLLCOMM_STAGE_NT=1: the native core writes staged copies of 64 KiB or more with
    streaming (non-temporal) stores (_stage_nt.c, docs/native.md); 0 (default): plain."""
    text = os.environ.get("COLLCOMM_STAGE_NT", "0").strip()
    if text not in ("", "0", "1"):
        warnings.warn(f"collcomm: COLLCOMM_STAGE_NT={text!r} is neither 0 nor 1; using 0",
                      RuntimeWarning, stacklevel=2)
        return 0
    return int(text == "1")


#: a rank's own block is copied into its output with streaming stores from this many bytes
#: (COLLCOMM_COPY_NT_MIN; _stage_nt.c out_copy says why 4 MiB)
COPY_NT_MIN = 4 << 20


def copy_nt_min() -> int:
    """COLLCOMM_COPY_NT_MIN: bytes from which the native core copies a rank's own block into
    its output (all_gather, all_to_all, a gather's or scatter's root) with streaming stores
    (default :data:`COPY_NT_MIN`; 0: never)."""
    text = os.environ.get("COLLCOMM_COPY_NT_MIN", "").strip()
    if not text:
        return COPY_NT_MIN
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        warnings.warn(f"collcomm: COLLCOMM_COPY_NT_MIN={text!r} is not a byte count >= 0; using "
                      f"{COPY_NT_MIN}", RuntimeWarning, stacklevel=2)
        return COPY_NT_MIN
    return min(value, sys.maxsize)     # (more than any buffer: never)


def votes() -> bool:
    """COLLCOMM_VOTE (default 1): a rank 0 on the native core chooses, for every all_to_all
    and all_gather of at least arena_layout.vote_min(n) bytes (CMA_MIN; 512 KiB between
    two ranks), between staging and cross-memory attach from
    what the two have cost it lately, and the group follows (native/_a2a_choice.c); 0:
    the fixed rule alone."""
    text = os.environ.get("COLLCOMM_VOTE", "1").strip()
    if text not in ("0", "1"):
        warnings.warn(f"collcomm: COLLCOMM_VOTE={text!r} is neither 0 nor 1; using 1",
                      RuntimeWarning, stacklevel=2)
        return True
    return text == "1"


def attach(arena: Any) -> Any:
    """A native Core over ``arena`` (a collcomm.transport.arena.Arena), or None."""
    if core is None:
        return None
    from ..transport import arena as arena_mod
    from ..transport.arena_layout import (NATIVE, ONE_SHOT, PIPE_MIN, PIPE_STEPS, vote_min,
                                          REDUCE_ONE_SHOT, REDUCE_PAIR_FROM)
    from ..transport.shm_segments import PAGE

    spin, yields = ((SPIN_NS, YIELDS) if arena.n <= arena.cores
                    else (SPIN_NS_OVERSUBSCRIBED, YIELDS_OVERSUBSCRIBED))
    spin = int(float(os.environ.get("COLLCOMM_SPIN_US", spin / 1000)) * 1000)
    yields = int(os.environ.get("COLLCOMM_YIELDS", yields))
    try:
        return core.Core(arena.mm, arena.n, arena.rank, arena.header, arena.slot, arena.slot + PAGE,
                         PAGE, ONE_SHOT, NATIVE, spin, yields, arena_mod._FUTEX is not None,
                         reduce_one_shot=REDUCE_ONE_SHOT, poll_ns=int(arena.poll * 1e9),
                         stage_nt=stage_nt(), pipe_min=PIPE_MIN, pipe_steps=PIPE_STEPS,
                         a2a_adapt=vote_min(arena.n) if votes() else 0,
                         reduce_pair_from=REDUCE_PAIR_FROM, out_nt_min=copy_nt_min())
    except (ValueError, TypeError, BufferError) as exc:   # e.g. an arena it cannot map: Python
        warnings.warn(f"collcomm: the native core cannot work in this arena ({exc}); the group "
                      "runs on the Python implementation", RuntimeWarning, stacklevel=2)
        return None


_codes: dict[tuple[Any, np.dtype], int] = {}


def code_for(fn: Callable[..., Any], dtype: np.dtype) -> int:
    """The C code (op * 256 + dtype) doing what ``fn`` does on ``dtype`` arrays, or -1."""
    last = getattr(fn, "native_code", None)   # (dtype, code) of the last call: the usual case
    if last is not None and last[0] is dtype:
        return last[1]
    tag = getattr(fn, "native", None)
    if core is None or tag is None:
        code = -1
    else:
        key = (tag, dtype)
        code = _codes.get(key)
        if code is None:
            code = _codes[key] = _verified(fn, tag, dtype)
    try:
        fn.native_code = (dtype, code)  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # a builtin: no attributes
        pass
    return code


def _verified(fn: Callable[..., Any], tag: tuple[str, str], dtype: np.dtype) -> int:
    name, kind = tag
    if name not in OPS or not dtype.isnative:
        return -1
    if kind == "bf16":
        dt = BF16 if dtype == np.uint16 else None
    else:
        dt = _DTYPES.get((dtype.kind, dtype.itemsize)) if dtype.kind == kind else None
    if dt is None:
        return -1
    if name == "PRODUCT" and kind == "c":
        refused[(name, kind, dtype.name)] = (
            "numpy's complex product fuses multiply-adds in its SIMD loop where the CPU can; "
            "the NaN signs it then returns are not reproduced in C")
        return -1
    code = OPS.index(name) * 256 + dt
    with np.errstate(all="ignore"):
        probe = _probe(dtype, kind == "bf16")
    for a, b in probe:
        if name in ("SUM", "PRODUCT"):
            # Which of two different NaNs an addition returns is the hardware's choice, and
            # numpy's SIMD body and scalar tail choose differently: compare with one NaN.
            a, b = one_nan(a, kind == "bf16"), one_nan(b, kind == "bf16")
        want = a.copy()
        got = a.copy()
        try:
            with np.errstate(all="ignore"):   # the probe overflows on purpose
                fn(want, b)
            core.combine(code, got, b)
        except Exception as exc:  # noqa: BLE001 - e.g. no kernel for this pair
            refused[(name, kind, dtype.name)] = f"{type(exc).__name__}: {exc}"
            return -1
        if want.tobytes() != got.tobytes():
            bad = int(np.flatnonzero(want.view(np.uint8) != got.view(np.uint8))[0]) // dtype.itemsize
            refused[(name, kind, dtype.name)] = (
                f"element {bad}: {a[bad]!r} (op) {b[bad]!r} is {want[bad]!r} in numpy, "
                f"{got[bad]!r} in C")
            return -1
    return code


def one_nan(x: np.ndarray, bf16: bool = False) -> np.ndarray:
    """``x`` with every NaN replaced by the default quiet NaN of its dtype (bfloat16 bits:
    0x7FC0); other arrays unchanged."""
    if bf16:
        bits = x.view(np.uint16).copy()
        bits[((bits & 0x7F80) == 0x7F80) & ((bits & 0x007F) != 0)] = 0x7FC0
        return bits.view(x.dtype)
    if x.dtype.kind == "f":
        return np.where(np.isnan(x), x.dtype.type(np.nan), x).astype(x.dtype)
    if x.dtype.kind == "c":
        real = np.dtype(f"f{x.dtype.itemsize // 2}")
        parts = x.view(real)
        return np.where(np.isnan(parts), real.type(np.nan), parts).astype(real).view(x.dtype)
    return x


def _probe(dtype: np.dtype, bf16: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Operand pairs covering the special values of ``dtype`` (259 elements: SIMD bodies
    and tails), plus every special paired with every other."""
    rng = np.random.default_rng(20261123)
    if bf16 or dtype.kind == "f" and dtype.itemsize == 2:
        # every bit pattern class: random 16-bit words, plus the specials
        bits = np.array([0, 0x8000, 0x3F80, 0xBF80, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81,
                         0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x3C00, 0x7C00, 0xFC00, 0x7E00,
                         0x7C01, 0x03FF, 0x7BFF], dtype=np.uint16)
        rand = rng.integers(0, 1 << 16, 259, dtype=np.uint16)
        return [(x.view(dtype), y.view(dtype)) for x, y in _pairs(np.concatenate([bits, rand]), rng)]
    if dtype.kind == "b":
        pool = np.array([0, 1, 2, 255], dtype=np.uint8)
        a = pool[rng.integers(0, 4, 259)]
        b = pool[rng.integers(0, 4, 259)]
        return [(a.view(dtype), b.view(dtype))]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        special = np.array([0, 1, 2, 3, info.max, info.min, info.max // 2, info.min + 1],
                           dtype=dtype)
        rand = rng.integers(info.min, info.max, 259, dtype=dtype, endpoint=True)
        return list(_pairs(np.concatenate([special, rand]), rng))
    real = np.dtype(f"f{dtype.itemsize // 2}") if dtype.kind == "c" else dtype
    ibits = np.dtype(f"u{real.itemsize}")
    nan2 = np.array([np.nan], dtype=real).view(ibits) | ibits.type(1)
    special = np.concatenate([
        np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 0.5, 3.0,
                  np.finfo(real).max, np.finfo(real).tiny, np.finfo(real).smallest_subnormal,
                  -np.finfo(real).max], dtype=real),
        nan2.view(real)])
    rand = (rng.standard_normal(259) * 10.0 ** rng.integers(-3, 4, 259)).astype(real)
    pool = np.concatenate([special, rand])
    if dtype.kind == "c":
        pairs = []
        for x, y in _pairs(pool, rng):
            z = rng.permutation(len(x))
            pairs.append(((x + 1j * x[z]).astype(dtype), (y + 1j * y[z]).astype(dtype)))
        return pairs
    return list(_pairs(pool, rng))


def _pairs(pool: np.ndarray, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    k = min(len(pool), 24)
    head = pool[:k]
    cross = (np.repeat(head, k), np.tile(head, k))     # every special with every other
    shuffled = (pool, pool[rng.permutation(len(pool))])
    return [cross, shuffled]


if core is not None:
    # How numpy breaks min/max ties of equal values (0.0 vs -0.0) on this machine and
    # numpy version; code_for() then checks every pair anyway.
    def _second(ufunc: Any, dtype: Any) -> bool:
        a = np.array([0.0, -0.0] * 40, dtype=dtype)
        b = np.array([-0.0, 0.0] * 40, dtype=dtype)
        return bool(np.array_equal(np.signbit(ufunc(a, b)), np.signbit(b)))

    core.set_ties(_second(np.minimum, np.float16), _second(np.minimum, np.float32),
                  _second(np.minimum, np.float64))
