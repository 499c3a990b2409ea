"""Reduction ops: every op × dtype class against numpy, validation messages, bfloat16."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from collcomm.errors import InvalidArgumentError
from collcomm.ops import (
    MPI_NAMES,
    ReduceOp,
    bf16_to_f32,
    f32_to_bf16,
    finish_avg,
    is_avg,
    resolve,
)

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"]


def valid(op: str, kind: str) -> bool:
    if op in ("BAND", "BOR", "BXOR"):
        return kind in "biu"
    if op in ("MIN", "MAX"):
        return kind != "c"
    if op == "AVG":
        return kind in "fc"
    return True


def operands(dtype):
    a = np.array([0, 1, 2, 3, 5, 1, 0], dtype=np.int64)
    b = np.array([1, 1, 3, 0, 6, 2, 0], dtype=np.int64)
    return a.astype(dtype), b.astype(dtype)


def expected(op: str, a, b):
    kind = a.dtype.kind
    if op in ("SUM", "AVG"):
        return a | b if kind == "b" else a + b
    if op == "PRODUCT":
        return a & b if kind == "b" else a * b
    ufunc = {"MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
             "BOR": np.bitwise_or, "BXOR": np.bitwise_xor, "LAND": np.logical_and,
             "LOR": np.logical_or, "LXOR": np.logical_xor}[op]
    return ufunc(a, b).astype(a.dtype)


CASES = [(op, dt) for op in OPS for dt in DTYPES]


@pytest.mark.parametrize("op,dtype", [c for c in CASES if valid(c[0], np.dtype(c[1]).kind)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_valid_op_matches_numpy(op, dtype):
    a, b = operands(dtype)
    b_before = b.copy()
    fn = resolve(getattr(ReduceOp, op), np.dtype(dtype), "all_reduce", 0)
    acc = a.copy()
    fn(acc, b)
    assert acc.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(acc, expected(op, a, b))
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("op,dtype", [c for c in CASES if not valid(c[0], np.dtype(c[1]).kind)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_invalid_op_names_collective_rank_op_dtype(op, dtype):
    with pytest.raises(InvalidArgumentError) as info:
        resolve(op.lower(), dtype, "reduce_scatter", 3)
    msg = str(info.value)
    assert "reduce_scatter" in msg and "rank 3" in msg
    assert f"ReduceOp.{op}" in msg and np.dtype(dtype).name in msg
    assert "allows" in msg


def test_invalid_dtype_and_unknown_op():
    with pytest.raises(InvalidArgumentError, match="object"):
        resolve("sum", np.dtype(object), "all_reduce", 1)
    with pytest.raises(InvalidArgumentError) as info:
        resolve("median", np.float32, "reduce", 2)
    msg = str(info.value)
    assert "reduce" in msg and "rank 2" in msg and "median" in msg and "float32" in msg
    assert "SUM" in msg  # says what is allowed


def test_bool_sum_is_or_product_is_and():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    acc = a.copy()
    resolve(ReduceOp.SUM, np.bool_)(acc, b)
    assert acc.tolist() == [True, True, True, False]
    acc = a.copy()
    resolve(ReduceOp.PRODUCT, np.bool_)(acc, b)
    assert acc.tolist() == [True, False, False, False]


def test_members_print_and_aliases():
    assert str(ReduceOp.SUM) == "ReduceOp.SUM" and repr(ReduceOp.MAX) == "ReduceOp.MAX"
    assert ReduceOp.PROD is ReduceOp.PRODUCT
    assert pickle.loads(pickle.dumps(ReduceOp.MIN)) is ReduceOp.MIN
    assert MPI_NAMES["MPI_SUM"] is ReduceOp.SUM and MPI_NAMES["MPI_PROD"] is ReduceOp.PRODUCT
    assert len({ReduceOp.SUM, ReduceOp.SUM, ReduceOp.MAX}) == 2


@pytest.mark.parametrize("given,member", [
    (ReduceOp.SUM, ReduceOp.SUM), ("sum", ReduceOp.SUM), ("SUM", ReduceOp.SUM),
    ("mean", ReduceOp.AVG), ("avg", ReduceOp.AVG), ("prod", ReduceOp.PRODUCT),
    ("product", ReduceOp.PRODUCT), ("max", ReduceOp.MAX), ("MPI_MIN", ReduceOp.MIN),
    ("ReduceOp.BXOR", ReduceOp.BXOR), ("land", ReduceOp.LAND),
    (np.add, ReduceOp.SUM), (np.multiply, ReduceOp.PRODUCT), (np.maximum, ReduceOp.MAX),
    (np.minimum, ReduceOp.MIN), (np.bitwise_and, ReduceOp.BAND), (np.logical_or, ReduceOp.LOR),
])
def test_from_any(given, member):
    assert ReduceOp.from_any(given) is member


def test_from_any_rejects_junk():
    for junk in ["nope", 3, None, np.negative]:
        with pytest.raises(InvalidArgumentError):
            ReduceOp.from_any(junk)


def test_user_callables_and_other_ufuncs():
    def weighted(a, b):
        return a + 2 * b

    op = ReduceOp.from_any(weighted)
    assert not op.is_builtin and "weighted" in repr(op)
    acc, other = np.arange(4.0), np.ones(4)
    resolve(weighted, np.float64, "all_reduce", 0)(acc, other)
    np.testing.assert_array_equal(acc, np.arange(4.0) + 2)
    np.testing.assert_array_equal(other, np.ones(4))
    acc = np.array([3.0, 0.0])
    resolve(np.hypot, np.float64)(acc, np.array([4.0, 1.0]))  # a ufunc with no built-in
    np.testing.assert_array_equal(acc, [5.0, 1.0])
    acc = np.array([1, 5], dtype=np.int16)
    resolve(lambda a, b: np.maximum(a, b, out=a), np.int16)(acc, np.array([2, 2], np.int16))
    assert acc.tolist() == [2, 5] and acc.dtype == np.int16


def test_user_callable_wrong_shape_is_clear():
    fn = resolve(lambda a, b: np.sum(a + b), np.float32, "all_reduce", 2)
    with pytest.raises(InvalidArgumentError) as info:
        fn(np.ones(3, np.float32), np.ones(3, np.float32))
    msg = str(info.value)
    assert "all_reduce" in msg and "rank 2" in msg and "shape" in msg and "float32" in msg


# ---------------------------------------------------------------------- bfloat16


def test_bf16_round_trip_and_rounding():
    exact = np.array([0.0, -0.0, 1.0, -2.5, 0.15625, 3.0e38, np.inf, -np.inf], np.float32)
    exact = bf16_to_f32(f32_to_bf16(exact))  # snap to bf16 grid, then must be stable
    bits = f32_to_bf16(exact)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bf16_to_f32(bits), exact)
    # halfway cases round to even: 1 + 2^-8 -> 1.0; 1 + 3·2^-8 -> 1 + 2^-6
    halfway = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -12], np.float32)
    np.testing.assert_array_equal(bf16_to_f32(f32_to_bf16(halfway)),
                                  np.array([1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7], np.float32))
    assert f32_to_bf16(np.array([1.0], np.float32))[0] == 0x3F80
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_bf16_sum_max_avg():
    a = f32_to_bf16(np.array([1.0, -3.0, 256.0, 0.5], np.float32))
    b = f32_to_bf16(np.array([2.0, 1.0, 1.0, 0.25], np.float32))
    acc = a.copy()
    resolve(ReduceOp.SUM, "bfloat16", "all_reduce", 0)(acc, b)
    # 256 + 1 = 257 is not representable in bf16 (8 bits of mantissa): rounds to even, 256
    np.testing.assert_array_equal(bf16_to_f32(acc), [3.0, -2.0, 256.0, 0.75])
    acc = a.copy()
    resolve("max", "bfloat16")(acc, b)
    np.testing.assert_array_equal(bf16_to_f32(acc), [2.0, 1.0, 256.0, 0.5])
    acc = a.copy()
    fn = resolve(ReduceOp.AVG, "bfloat16")
    fn(acc, b)
    finish_avg(acc, 2)
    np.testing.assert_array_equal(bf16_to_f32(acc), [1.5, -1.0, 128.0, 0.375])
    acc = f32_to_bf16(np.array([3.0], np.float32))
    finish_avg(acc, 3, dtype="bfloat16")
    assert bf16_to_f32(acc)[0] == 1.0
    with pytest.raises(InvalidArgumentError, match="bfloat16"):
        resolve(ReduceOp.BAND, "bfloat16", "all_reduce", 1)
    acc = a.copy()
    resolve(lambda x, y: x - y, "bfloat16")(acc, b)  # user ops see float32 values
    np.testing.assert_array_equal(bf16_to_f32(acc), [-1.0, -4.0, 255.0, 0.25])


def test_avg_helpers():
    assert is_avg("mean") and is_avg(ReduceOp.AVG) and not is_avg("sum") and not is_avg("junk")
    x = np.array([2.0, 5.0])
    finish_avg(x, 2)
    np.testing.assert_array_equal(x, [1.0, 2.5])
    z = np.array([2 + 4j], np.complex64)
    finish_avg(z, 2)
    assert z[0] == 1 + 2j
    with pytest.raises(InvalidArgumentError):
        finish_avg(np.array([2, 4], np.int32), 2)
