"""collcomm.MPI derived datatypes: vector, hvector, indexed (h-, block), struct, subarray
(C and Fortran order), resized, dup, contiguous, nested; Pack/Unpack; decode and contents.

* Layouts, in process: bounds, extents and sizes against Open MPI's (measured with mpi4py
  4.1 + Open MPI 5, written down here), and packing against a naive type-map walk over
  random nested types (every packing path: one run, strided runs, an index).
* ``datatype_checks``: a section of the shared MPI job (tests/mpi_checks.py), so it runs
  at every world size 1-5: point to point (halo columns with Sendrecv, Isend/Irecv,
  Sendrecv_replace, persistent and matched receives), every collective with derived send
  and receive types (their data where it belongs, the rest untouched), reductions on
  types of one basic type, a user op on a type with gaps, and errors on every rank.
* The same program under mpi4py + Open MPI and under collcomm.MPI (3 ranks): halo
  exchange, block Scatterv/Gatherv through a resized subarray, struct records,
  Alltoallw transposes, Pack/Unpack and external32, decode, statuses, errors.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job
from tests.test_mpi_vs_mpi4py import _mpiexec, compare_with_mpi4py


# ----------------------------------------------------------------------------- in process
def _walk(dt, MPI) -> list[tuple[int, int]]:
    """(byte offset, bytes) of every basic element, in order, from the type's recipe."""
    old, name, p = dt.decode()
    if name == "NAMED":
        return [(0, dt.Get_extent()[1])]
    if name == "STRUCT":
        out = []
        for b, d, t in zip(p["blocklengths"], p["displacements"], p["datatypes"]):
            ext, m = t.Get_extent()[1], _walk(t, MPI)
            out += [(d + i * ext + o, s) for i in range(b) for o, s in m]
        return out
    ext, m = old.Get_extent()[1], _walk(old, MPI)
    if name in ("CONTIGUOUS", "DUP", "RESIZED"):
        count = p.get("count", 1)
        return [(i * ext + o, s) for i in range(count) for o, s in m]
    if name in ("VECTOR", "HVECTOR"):
        step = p["stride"] * (ext if name == "VECTOR" else 1)
        return [(i * step + j * ext + o, s) for i in range(p["count"]) for j in range(p["blocklength"])
                for o, s in m]
    if name in ("INDEXED", "HINDEXED", "INDEXED_BLOCK", "HINDEXED_BLOCK"):
        scale = 1 if name.startswith("H") else ext
        bls = p.get("blocklengths") or [p["blocklength"]] * len(p["displacements"])
        return [(d * scale + j * ext + o, s) for b, d in zip(bls, p["displacements"]) for j in range(b)
                for o, s in m]
    assert name == "SUBARRAY"
    sizes, subs, starts = p["sizes"], p["subsizes"], p["starts"]
    if p["order"] == MPI.ORDER_FORTRAN:
        sizes, subs, starts = sizes[::-1], subs[::-1], starts[::-1]
    strides = [int(np.prod(sizes[k + 1:])) * ext for k in range(len(sizes))]
    out = []
    for idx in np.ndindex(*subs):
        at = sum((i + s) * k for i, s, k in zip(idx, starts, strides))
        out += [(at + o, s) for o, s in m]
    return out


def _random_type(MPI, rng: random.Random, depth: int = 0):
    base = rng.choice([MPI.DOUBLE, MPI.INT, MPI.SHORT, MPI.CHAR])
    if depth >= 2 or rng.random() < 0.3:
        return base
    old = _random_type(MPI, rng, depth + 1)
    ext = old.Get_extent()[1]
    kind = rng.choice(["vector", "hvector", "indexed", "hindexed", "block", "struct", "subarray",
                       "resized", "contiguous"])
    if kind == "vector":
        return old.Create_vector(rng.randint(1, 4), rng.randint(1, 3), rng.randint(3, 5))
    if kind == "hvector":
        return old.Create_hvector(rng.randint(1, 4), rng.randint(1, 2), ext * rng.randint(2, 4) + rng.choice([0, 4]))
    if kind == "indexed":
        k = rng.randint(1, 4)
        return old.Create_indexed([rng.randint(0, 3) for _ in range(k)], rng.sample(range(10), k))
    if kind == "hindexed":
        k = rng.randint(1, 3)
        return old.Create_hindexed([rng.randint(1, 2) for _ in range(k)], [ext * 3 * i + 8 for i in range(k)][::-1])
    if kind == "block":
        return old.Create_indexed_block(rng.randint(1, 2), rng.sample(range(8), rng.randint(1, 3)))
    if kind == "struct":
        other = rng.choice([MPI.DOUBLE, MPI.INT, MPI.CHAR])
        return MPI.Datatype.Create_struct([rng.randint(1, 2), 1], [0, ext * 2 + 8], [old, other])
    if kind == "subarray":
        order = rng.choice([MPI.ORDER_C, MPI.ORDER_FORTRAN])
        return old.Create_subarray([4, 3, 2], [2, rng.randint(1, 3), 1], [1, 0, rng.randint(0, 1)], order=order)
    if kind == "resized":
        return old.Create_resized(0, old.Get_true_extent()[0] + old.Get_true_extent()[1] + rng.choice([0, 8]))
    return old.Create_contiguous(rng.randint(0, 3))


@pytest.mark.parametrize("path", ["native", "numpy"])
def test_packing_matches_a_type_map_walk(path, monkeypatch):
    from collcomm import MPI
    from collcomm.MPI import _typemap

    if path == "numpy":
        monkeypatch.setattr(_typemap, "_NATIVE", None)
    elif _typemap._NATIVE is None:
        pytest.skip("the native core is not built (or COLLCOMM_NATIVE=0)")
    rng = random.Random(5)
    kinds = set()
    for case in range(300):
        dt = _random_type(MPI, rng).Commit()
        lb, ext = dt.Get_extent()
        tm = _walk(dt, MPI)
        count = rng.randint(0, 3)
        if ext <= 0 or any(o + i * ext < 0 for o, _ in tm for i in range(count)):
            continue
        size = max([o + s + i * ext for o, s in tm for i in range(count)], default=0) + rng.randint(0, 9)
        mem = np.frombuffer(np.random.default_rng(case).bytes(size), dtype=np.uint8).copy()
        want = b"".join(mem[o + i * ext:o + i * ext + s].tobytes() for i in range(count) for o, s in tm)
        t = dt._t
        assert dt.Get_size() * count == len(want), (case, dt.decode()[1:])
        got = _typemap.pack(mem, t.layout, count, 0)
        assert got.tobytes() == want, (case, dt.decode()[1:])
        if count and t.layout.packed and path == "numpy":
            kinds.add(_typemap._plan(t.layout, count)[0])
        fresh = np.zeros_like(mem)
        _typemap.unpack(fresh, t.layout, count, 0, got)
        written = np.zeros(size, dtype=bool)
        for i in range(count):
            for o, s in tm:
                written[o + i * ext:o + i * ext + s] = True
        assert (fresh[written] == mem[written]).all() and not fresh[~written].any(), case
    if path == "numpy":
        assert kinds == {"one", "strided", "columns", "index"}, kinds     # every numpy plan ran


# (Open MPI 5 + mpi4py 4.1: Get_extent, Get_true_extent, Get_size)
OPEN_MPI = [
    ("D.Create_vector(4, 1, 4)", (0, 104), (0, 104), 32),
    ("D.Create_subarray([4, 4], [2, 2], [1, 1])", (0, 128), (40, 48), 32),
    ("D.Create_subarray([4, 3], [2, 2], [1, 1], order=MPI.ORDER_F)", (0, 96), (40, 48), 32),
    ("MPI.INT.Create_indexed([2, 1], [3, 0])", (0, 20), (0, 20), 12),
    ("MPI.Datatype.Create_struct([1, 1], [0, 8], [D, MPI.CHAR])", (0, 16), (0, 9), 9),
    ("MPI.Datatype.Create_struct([1, 1], [0, 4], [MPI.INT, D])", (0, 16), (0, 12), 12),
    ("MPI.Datatype.Create_struct([1, 1], [0, 4], [MPI.INT, MPI.CHAR])", (0, 8), (0, 5), 5),
    ("MPI.Datatype.Create_struct([1, 1], [8, 40], [MPI.INT.Create_resized(-4, 16), MPI.CHAR])", (4, 16), (8, 33), 5),
    ("MPI.Datatype.Create_struct([1, 1], [0, 16], [MPI.DOUBLE_INT, MPI.CHAR])", (0, 24), None, 13),
    ("D.Create_hindexed([1], [4])", (4, 8), (4, 8), 8),
    ("D.Create_hvector(2, 1, 12)", (0, 24), (0, 20), 16),
    ("D.Create_vector(2, 2, -3)", (-24, 40), (-24, 40), 32),
    ("D.Create_vector(2, 3, 2)", (0, 40), (0, 40), 48),
    ("D.Create_indexed_block(2, [5, 1])", (8, 48), (8, 48), 32),
    ("D.Create_vector(4, 1, 4).Create_resized(0, 8)", (0, 8), (0, 104), 32),
    ("MPI.Datatype.Create_struct([2], [0], [D.Create_vector(4, 1, 4)])", (0, 208), (0, 208), 64),
    ("D.Create_contiguous(4).Create_resized(0, 8)", (0, 8), (0, 32), 32),
    ("MPI.INT.Create_resized(-4, 12)", (-4, 12), (0, 4), 4),
    ("D.Create_vector(0, 1, 4)", (0, 0), (0, 0), 0),
    ("MPI.Datatype.Create_struct([1, 1], [0, 100], [MPI.INT, D.Create_contiguous(0)])", (0, 100), (0, 4), 4),
    ("MPI.Datatype.Create_struct([1, 1], [0, 40], [MPI.CHAR, MPI.INT.Create_indexed_block(0, [5, 9])])",
     (0, 40), None, 1),
    ("MPI.DOUBLE_INT.Create_resized(0, 12)", (0, 12), (0, 12), 12),
    ("D.Create_contiguous(0).Create_hindexed([1, 1], [8, 40])", (0, 0), (0, 0), 0),
    ("D.Create_contiguous(0).Create_resized(0, 8).Create_contiguous(3)", (0, 0), (0, 0), 0),
]


@pytest.mark.parametrize("expr,extent,true_extent,size", OPEN_MPI)
def test_bounds_as_open_mpi(expr, extent, true_extent, size):
    from collcomm import MPI

    dt = eval(expr, {"MPI": MPI, "D": MPI.DOUBLE})
    assert dt.Get_extent() == extent
    assert dt.Get_size() == size
    if true_extent is not None:
        assert dt.Get_true_extent() == true_extent
    assert (dt.lb, dt.ub, dt.extent) == (extent[0], sum(extent), extent[1])


def test_recipes_and_contents():
    from collcomm import MPI

    D = MPI.DOUBLE
    v = D.Create_vector(2, 1, 3)
    assert v.decode()[1:] == ("VECTOR", {"count": 2, "blocklength": 1, "stride": 3}) and v.decode()[0] == D
    assert (v.Get_envelope(), v.Get_contents()[0], v.combiner) == ((3, 0, 0, 1, 3), [2, 1, 3], MPI.COMBINER_VECTOR)
    h = D.Create_hindexed([1, 2], [0, 24])
    assert (h.Get_envelope(), h.Get_contents()[:2]) == ((3, 2, 0, 1, 8), ([2, 1, 2], [0, 24]))
    s = D.Create_subarray([4, 3], [2, 2], [1, 1])
    assert s.Get_contents()[0] == [2, 4, 3, 2, 2, 1, 1, 0]
    st = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, D])
    assert (st.Get_envelope(), st.decode()[1]) == ((3, 2, 0, 2, 11), "STRUCT")
    assert [t == w for t, w in zip(st.Get_contents()[3], [MPI.INT, D])] == [True, True]
    assert D.Create_resized(-8, 16).Get_contents()[:2] == ([], [-8, 16])
    assert (D.combiner, D.decode()[1], D.Dup().name, v.name, v.is_named) == (0, "NAMED", "Dup MPI_DOUBLE", "", False)
    with pytest.raises(MPI.Exception):
        D.Get_contents()
    assert [MPI.Datatype.Get_value_index(v, MPI.INT) == p for v, p in
            ((D, MPI.DOUBLE_INT), (MPI.INT, MPI.TWOINT), (MPI.FLOAT, MPI.FLOAT_INT), (MPI.CHAR, MPI.DATATYPE_NULL),
             (MPI.SHORT, MPI.SHORT_INT))] == [True] * 5
    assert MPI.Datatype.Get_value_index(D, MPI.LONG) == MPI.DATATYPE_NULL
    for bad, cls in ((lambda: D.Create_vector(-1, 1, 1), MPI.ERR_COUNT),      # (Open MPI's classes)
                     (lambda: D.Create_vector(2, -1, 1), MPI.ERR_ARG),
                     (lambda: D.Create_subarray([4], [5], [0]), MPI.ERR_ARG),
                     (lambda: D.Create_subarray([4, 4], [0, 2], [0, 0]), MPI.ERR_ARG)):
        with pytest.raises(MPI.Exception) as info:
            bad()
        assert info.value.Get_error_class() == cls
    for bad, kind in ((lambda: D.Create_indexed([1, 2], [0]), ValueError),    # (mpi4py's own checks)
                      (lambda: MPI.Datatype.Create_struct([1], [0, 8], [D]), ValueError),
                      (lambda: D.Create_indexed([1.0, 2.0], [0, 4]), TypeError)):
        with pytest.raises(kind):
            bad()
    assert (v.typechar, v.typestr, D.Create_contiguous(2).typestr, D.Dup().typestr, D.Dup().Dup().name) == \
        ("V", "V32", "V16", "f8", "Dup Dup MPI_DOUBLE")
    with pytest.raises(NotImplementedError, match="Create_darray"):
        D.Create_darray(4, 0, 1, [4], [MPI.DISTRIBUTE_BLOCK], [MPI.DISTRIBUTE_DFLT_DARG], [4])


def test_pack_counts_whole_elements():
    """A plain buffer packs as many whole elements as fit (its bytes over the extent), as mpi4py."""
    from collcomm import MPI

    vec = MPI.INT.Create_vector(3, 2, 4).Commit()
    out = bytearray(64)
    assert vec.Pack(np.arange(12, dtype="i4"), out, 0, MPI.COMM_SELF) == 24
    assert np.frombuffer(bytes(out[:24]), dtype="i4").tolist() == [0, 1, 4, 5, 8, 9]
    back = np.full(12, -1, dtype="i4")
    assert vec.Unpack(out, 0, back, MPI.COMM_SELF) == 24
    assert back.tolist() == [0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1]
    with pytest.raises(MPI.Exception) as info:
        vec.Pack(np.arange(12, dtype="i4"), bytearray(8), 0, MPI.COMM_SELF)
    assert info.value.Get_error_class() == MPI.ERR_TRUNCATE


def test_pack_pairs_and_external32_as_open_mpi():
    """Pairs pack without their padding and external32 reverses every basic element's bytes
    (Open MPI's sizes and bytes), structs of mixed types included."""
    from collcomm import MPI

    pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)
    src = np.array([(1.5, 7), (-2.0, 9)], dtype=pair)
    me = MPI.COMM_SELF
    assert (MPI.DOUBLE_INT.Pack_size(2, me), MPI.SHORT_INT.Pack_size(2, me),
            MPI.INT.Pack_external_size("external32", 3)) == (24, 12, 12)
    out = bytearray(64)
    assert MPI.DOUBLE_INT.Pack([src, MPI.DOUBLE_INT], out, 0, MPI.COMM_SELF) == 24
    assert bytes(out[:24]) == b"".join(np.float64(v).tobytes() + np.int32(i).tobytes() for v, i in src.tolist())
    back = np.zeros(2, dtype=pair)
    assert MPI.DOUBLE_INT.Unpack(out, 0, [back, MPI.DOUBLE_INT], MPI.COMM_SELF) == 24 and back.tolist() == src.tolist()
    st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, MPI.DOUBLE]).Commit()
    rec = np.zeros(2, dtype=np.dtype({"names": ["i", "d"], "formats": ["i4", "f8"], "offsets": [0, 8], "itemsize": 16}))
    rec["i"], rec["d"] = [1, -2], [0.25, 3.0]
    assert st.Pack_external("external32", rec, out, 0) == 24
    assert bytes(out[:24]) == b"".join(np.int32(i).byteswap().tobytes() + np.float64(d).byteswap().tobytes()
                                       for i, d in rec.tolist())
    again = np.zeros_like(rec)
    assert st.Unpack_external("external32", out, 0, again) == 24 and again.tolist() == rec.tolist()


def test_big_struct_and_columns_pack_without_index_arrays(monkeypatch):
    """On the numpy path (the native one keeps nothing), a struct of unequal fields and a
    resized column pack by strided copies: nothing the size of the message is kept."""
    from collcomm import MPI
    from collcomm.MPI import _typemap

    monkeypatch.setattr(_typemap, "_NATIVE", None)

    st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.CHAR, MPI.DOUBLE]).Commit()
    rec = np.zeros(200_000, dtype=np.dtype({"names": ["c", "d"], "formats": ["u1", "f8"], "offsets": [0, 8],
                                            "itemsize": 16}))
    rec["c"], rec["d"] = np.arange(rec.size) % 251, np.arange(rec.size) / 3
    out = bytearray(st.Pack_size(rec.size, MPI.COMM_SELF))
    st.Pack(rec, out, 0, MPI.COMM_SELF)
    packed = np.frombuffer(bytes(out), dtype=np.dtype([("c", "u1"), ("d", "<f8")]))
    assert (packed["c"] == rec["c"]).all() and (packed["d"] == rec["d"]).all()
    col = MPI.DOUBLE.Create_vector(300, 1, 300).Create_resized(0, 8).Commit()
    a = np.random.default_rng(1).random((300, 300))
    out = bytearray(a.nbytes)
    col.Pack([a, 300, col], out, 0, MPI.COMM_SELF)
    assert (np.frombuffer(bytes(out)) == a.T.reshape(-1)).all()
    for t in (st, col):
        held = [x for plan in t._t.layout._plans.values() for x in plan if isinstance(x, (np.ndarray, dict))]
        assert not any(isinstance(x, np.ndarray) or x for x in held), "an index array was kept"


def test_native_pack_refuses_what_lies_outside():
    from collcomm import native

    if native.core is None:
        pytest.skip("the native core is not built (or COLLCOMM_NATIVE=0)")
    mem, runs = np.zeros(64, np.uint8), np.array([[0, 8], [16, 8]], np.int64)
    out = np.zeros(32, np.uint8)
    native.core.pack_runs(mem, runs, 2, 24, 0, out, True)            # [0, 48): inside
    for count, extent, first, packed in ((2, 24, 24, out), (2, -24, 0, out), (2, 24, 0, out[:16]),
                                         (2 ** 62, 0, 0, out[:0]), (2, 2 ** 62, 0, out)):
        with pytest.raises(ValueError):
            native.core.pack_runs(mem, runs, count, extent, first, packed, True)
    with pytest.raises((BufferError, ValueError)):      # (numpy: "not C-contiguous")
        native.core.pack_runs(np.zeros(64, np.uint8)[::2], runs, 1, 24, 0, out[:16], True)


# ----------------------------------------------------------------------------- the MPI job's section
def datatype_checks(c: Checker, MPI, comm) -> None:
    """Derived types in every call, at the job's world size (see the module docstring)."""
    r, n = comm.rank, comm.size
    right, left = (r + 1) % n, (r - 1) % n
    D = MPI.DOUBLE
    rows, cols = 3, 4
    # point to point: a column of a rows x (cols+2) grid, through three spellings
    grid = np.full((rows, cols + 2), -1.0)
    grid[:, 1:-1] = r * 100 + np.arange(rows * cols).reshape(rows, cols)
    col = D.Create_vector(rows, 1, cols + 2).Commit()
    at = [D.Create_subarray([rows, cols + 2], [rows, 1], [0, j]).Commit() for j in range(cols + 2)]
    comm.Sendrecv([grid, 1, at[cols]], right, 0, [grid, 1, at[0]], left, 0)
    reqs = [comm.Irecv([grid.reshape(-1)[cols + 1:], 1, col], right, 1),
            comm.Isend([grid.reshape(-1)[1:], 1, col], left, 1)]
    MPI.Request.Waitall(reqs)
    want = np.full((rows, cols + 2), -1.0)
    interior = np.arange(rows * cols).reshape(rows, cols)
    want[:, 1:-1] = r * 100 + interior
    want[:, 0] = left * 100 + interior[:, -1]
    want[:, -1] = right * 100 + interior[:, 0]
    c.eq(grid, want, "halo columns: Sendrecv with subarrays, Isend/Irecv with a vector")
    w = np.arange(12.0).reshape(4, 3) + 100 * r
    col3 = D.Create_vector(4, 1, 3).Commit()
    comm.Sendrecv_replace([w.reshape(-1)[1:], 1, col3], right, 2, left, 2)
    want = np.arange(12.0).reshape(4, 3) + 100 * r
    want[:, 1] = np.arange(12.0).reshape(4, 3)[:, 1] + 100 * left
    c.eq(w, want, "Sendrecv_replace of a column")
    st = MPI.Status()
    comm.Isend([w, 1, col3], right, 3)
    comm.Probe(left, 3, st)
    c.eq([st.Get_count(col3), st.Get_elements(col3), st.Get_count(D)], [1, 4, 4], "probed counts in a vector type")
    got = np.zeros((4, 3))
    msg = comm.Mprobe(left, 3)
    msg.Recv([got, 1, col3])
    c.eq(got[:, 0], np.arange(12.0).reshape(4, 3)[:, 0] + 100 * left, "matched receive into a column")
    c.eq(got[:, 1:], np.zeros((4, 2)), "matched receive leaves the rest")
    pr = comm.Recv_init([got, 1, col3], left, 4)
    for k in range(2):
        pr.Start()
        comm.Send(np.full(4, float(10 * k + r)), right, 4)
        pr.Wait()
    c.eq(got[:, 0], np.full(4, 10.0 + left), "persistent receive into a column")
    pr.Free()
    # collectives: struct records, vectors as receive types, block distribution
    rec = np.dtype({"names": ["id", "x", "tag"], "formats": ["i4", "f8", "S3"], "offsets": [0, 8, 16], "itemsize": 24})
    sdt = MPI.Datatype.Create_struct([1, 1, 3], [0, 8, 16], [MPI.INT, D, MPI.CHAR]).Commit()
    a = np.zeros(3, dtype=rec)
    root = n - 1
    if r == root:
        a["id"], a["x"], a["tag"] = [7, 8, 9], [0.5, 1.5, 2.5], [b"abc", b"de", b"f"]
    comm.Bcast([a, sdt], root=root)
    c.eq([a["id"].tolist(), a["x"].tolist(), a["tag"].tolist()], [[7, 8, 9], [0.5, 1.5, 2.5], [b"abc", b"de", b"f"]],
         "Bcast of struct records")
    one = np.zeros(1, dtype=rec)
    one["id"], one["x"] = r, r / 2
    everyone = np.zeros(n, dtype=rec)
    comm.Allgather([one, sdt], [everyone, sdt])
    c.eq([everyone["id"].tolist(), everyone["x"].tolist()], [list(range(n)), [q / 2 for q in range(n)]],
         "Allgather of struct records")
    every = D.Create_vector(2, 1, n).Create_resized(0, 8).Commit()
    x = np.arange(2.0 * n) + 10 * r
    y = np.full(2 * n, -1.0)
    comm.Alltoall([x, 2, D], [y, 1, every])
    c.eq(y, [10 * (i % n) + 2 * r + i // n for i in range(2 * n)], "Alltoall into a resized vector")
    y = np.full(2 * n, -1.0)
    comm.Gather([np.array([r, -r], dtype=float), 2, D], [y, 1, every] if r == 0 else None, root=0)
    if r == 0:
        c.eq(y, [float(i) for i in range(n)] + [-float(i) for i in range(n)], "Gather into a resized vector")
    z = np.zeros(2)
    comm.Scatter([np.arange(2.0 * n), 1, every] if r == root else None, z, root=root)
    c.eq(z, [r, r + n], "Scatter from a resized vector")
    N = 3
    glob = np.arange(N * 2.0 * n).reshape(N, 2 * n)
    blk = D.Create_subarray([N, 2 * n], [N, 2], [0, 0]).Create_resized(0, 8).Commit()
    mine = np.zeros((N, 2))
    comm.Scatterv([glob, [1] * n, [2 * i for i in range(n)], blk] if r == 0 else None, mine, root=0)
    c.eq(mine, glob[:, 2 * r:2 * r + 2], "Scatterv of column blocks")
    back = np.full((N, 2 * n), -1.0)
    comm.Allgatherv(mine * 10, [back, [1] * n, [2 * i for i in range(n)], blk])
    c.eq(back, glob * 10, "Allgatherv of column blocks")
    back = np.full((N, 2 * n), -1.0)
    comm.Gatherv(mine, [back, [1] * n, [2 * i for i in range(n)], blk] if r == root else None, root=root)
    if r == root:
        c.eq(back, glob, "Gatherv of column blocks")
    m = 2
    A = (np.arange(m * m * n, dtype="f8") + 1000 * r).reshape(m, m * n)
    B = np.zeros((m * n, m))
    stypes = [D.Create_subarray([m, m * n], [m, m], [0, m * j]).Commit() for j in range(n)]
    rtypes = [D.Create_subarray([m * n, m], [m, m], [m * j, 0]).Commit() for j in range(n)]
    comm.Alltoallw([A, [1] * n, [0] * n, stypes], [B, [1] * n, [0] * n, rtypes])
    c.eq(B, np.vstack([(np.arange(m * m * n, dtype="f8") + 1000 * q).reshape(m, m * n)[:, m * r:m * r + m]
                       for q in range(n)]), "Alltoallw transpose with subarrays")
    ialltoallw = comm.Ialltoallw([A, [1] * n, [0] * n, stypes], [B * 0, [1] * n, [0] * n, rtypes])
    ialltoallw.Wait()
    # reductions on types of one basic type (Open MPI refuses predefined ops on derived
    # types; collcomm reduces their basic elements, as MPICH does)
    every2 = D.Create_vector(3, 1, 2).Commit()
    s = np.full(6, -1.0)
    comm.Allreduce([np.arange(6.0) * (r + 1), 1, every2], [s, 1, every2], op=MPI.SUM)
    c.eq(s, [0, -1, 2 * n * (n + 1) / 2, -1, 4 * n * (n + 1) / 2, -1], "Allreduce SUM of a vector")
    s = np.arange(6.0) * (r + 1)
    comm.Allreduce(MPI.IN_PLACE, [s, 1, every2], op=MPI.SUM)       # (the general way: IN_PLACE)
    c.eq(s[1::2], (np.arange(6.0) * (r + 1))[1::2], "Allreduce IN_PLACE on a vector: the gaps untouched")
    c.eq(s[0::2], np.arange(0.0, 6, 2) * n * (n + 1) / 2, "Allreduce IN_PLACE on a vector")
    s = np.full(6, -1.0)
    req = comm.Iallreduce([np.arange(6.0) + r, 1, every2], [s, 1, every2], op=MPI.MAX)
    req.Wait()
    c.eq(s, [n - 1, -1, n + 1, -1, n + 3, -1], "Iallreduce MAX into a vector")
    s = np.full(6, -1.0)
    comm.Reduce([np.full(3, r + 1.0), 3, D], [s, 1, every2] if r == 0 else None, op=MPI.PROD, root=0)
    if r == 0:
        c.eq(s, [np.prod(np.arange(1.0, n + 1)), -1] * 3, "Reduce PROD into a vector")
    s = np.full(2 * n, -1.0)
    comm.Reduce_scatter_block(np.arange(2.0 * n) + r, [s, 1, D.Create_vector(2, 1, n).Commit()], op=MPI.SUM)
    want = np.full(2 * n, -1.0)
    want[0], want[n] = n * 2 * r + n * (n - 1) / 2, n * (2 * r + 1) + n * (n - 1) / 2
    c.eq(s, want, "Reduce_scatter_block into a vector")
    s = np.full(4, -1.0)
    comm.Scan([np.full(8, r + 1.0), 1, D.Create_vector(4, 1, 2).Commit()], s)
    c.eq(s, np.full(4, (r + 1) * (r + 2) / 2), "Scan of a vector")

    def tagged_max(inbuf, inout, dt):
        a_ = np.frombuffer(inbuf, dtype="f8")
        b_ = np.frombuffer(inout, dtype="f8")
        b_[0::2] = np.maximum(a_[0::2], b_[0::2])      # the gaps (odd slots) are not the type's
    op = MPI.Op.Create(tagged_max, commute=True)
    s = np.full(6, -1.0)
    comm.Allreduce([np.arange(6.0) + r, 1, every2], [s, 1, every2], op=op)
    c.eq(s, [n - 1, -1, n + 1, -1, n + 3, -1], "a user op on a vector (laid out with its gaps)")
    op.Free()
    # a user op on a type with gaps over a message the core would cut into pieces
    big = D.Create_vector(1, 2, 3).Create_resized(0, 24).Commit()

    def mul_add(inbuf, inout, dt):
        x, y = np.frombuffer(inbuf, "f8").reshape(-1, 3), np.frombuffer(inout, "f8").reshape(-1, 3)
        y[:, 0] *= x[:, 0]
        y[:, 1] += x[:, 1]
    op = MPI.Op.Create(mul_add, commute=True)
    N = 30001
    src = np.ones((N, 3))
    src[:, 1], src[:, 2] = r + 1, 99
    out = np.full((N, 3), -5.0)
    comm.Allreduce([src, N, big], [out, N, big], op)
    c.eq(out[[0, N // 2, N - 1]], [[1.0, n * (n + 1) / 2, -5.0]] * 3, "a user op on 30001 elements with gaps")
    neg = D.Create_hindexed([1, 1], [-8, 0]).Commit()     # data at -8 (outside the fn's view) and 0

    def add_first(inbuf, inout, dt):
        np.frombuffer(inout, "f8")[0] += np.frombuffer(inbuf, "f8")[0]
    op2 = MPI.Op.Create(add_first, commute=True)
    got = np.full(4, -1.0)
    comm.Allreduce([np.arange(4.0) + r, 1, 1, neg], [got, 1, 1, neg], op2)
    c.eq(got[[0, 2, 3]], [-1.0, sum(2.0 + q for q in range(n)), -1.0], "a user op on a type with data before its origin")
    # persistent: the type and the op freed by the program before Start
    pt = D.Create_vector(2, 1, 2).Commit()
    pop = MPI.Op.Create(mul_add, commute=True)
    comm.Allreduce([np.ones(4), 1, pt], [np.zeros(4), 1, pt], MPI.SUM)
    src4, out4 = np.full(6, 2.0), np.full(6, -1.0)
    preq = comm.Allreduce_init([src4, 1, pt], [out4, 1, pt], MPI.SUM)
    pt.Free()
    preq.Start()
    preq.Wait()
    c.eq(out4, [2.0 * n, -1, 2.0 * n, -1, -1, -1], "Allreduce_init after its type was freed")
    preq.Free()
    pt2 = D.Create_vector(1, 2, 3).Create_resized(0, 24).Commit()
    src3, out3 = np.ones((2, 3)), np.full((2, 3), -5.0)
    src3[:, 1] = r + 1
    comm.Allreduce([src3, 2, pt2], [out3, 2, pt2], pop)
    preq = comm.Allreduce_init([src3, 2, pt2], [out3, 2, pt2], pop)
    pt2.Free()
    pop.Free()
    preq.Start()
    preq.Wait()
    c.eq(out3[:, :2], [[1.0, n * (n + 1) / 2]] * 2, "a persistent user op after its type and op were freed")
    preq.Free()
    op.Free()
    op2.Free()
    # value-index pairs inside derived types: their padding is never written
    rec3 = np.dtype([("v", "f8"), ("idx", "i4"), ("tag", "i4")])
    recs = np.zeros(4, rec3)
    recs["v"], recs["idx"], recs["tag"] = np.arange(4) + 10 * r, r, 1000 + r
    every_other = MPI.DOUBLE_INT.Create_vector(2, 1, 2).Commit()
    comm.Sendrecv([recs.view(np.uint8), 1, every_other], right, 11, [recs.view(np.uint8), 1, every_other], left, 11)
    c.eq([recs["v"].tolist(), recs["idx"].tolist(), recs["tag"].tolist()],
         [[10 * left, 1 + 10 * r, 2 + 10 * left, 3 + 10 * r], [left, r, left, r], [1000 + r] * 4],
         "pairs in a vector: the records' other fields untouched")
    best = np.zeros(4, rec3)
    comm.Allreduce([np.array([(float(r % 3), r, 0)] * 4, rec3).view(np.uint8), 1, every_other],
                   [best.view(np.uint8), 1, every_other], op=MPI.MAXLOC)
    top = max(q % 3 for q in range(n))
    c.eq([best["v"].tolist(), best["idx"].tolist()],
         [[top, 0, top, 0], [min(q for q in range(n) if q % 3 == top), 0] * 2], "MAXLOC over pairs in a vector")
    packed = np.zeros(3 * 12 + 8, np.uint8)
    view12 = packed[:36].view(np.dtype([("v", "f8"), ("idx", "i4")]))
    view12["v"], view12["idx"], packed[36:] = np.arange(3) + 10 * r, r, 200
    t12 = MPI.DOUBLE_INT.Create_resized(0, 12).Commit()
    comm.Sendrecv([packed[:36].copy(), 3, t12], right, 12, [packed, 3, t12], left, 12)
    c.eq([view12["v"].tolist(), view12["idx"].tolist(), packed[36:].tolist()],
         [[10.0 * left, 10.0 * left + 1, 10.0 * left + 2], [left] * 3, [200] * 8], "packed 12-byte pairs")
    # a receive freed while active is still unpacked once its message is in
    if n > 1:
        target = np.full(12, -1, dtype="i4")
        pick = MPI.INT.Create_vector(3, 2, 4).Commit()
        freed = comm.Irecv([target, 1, pick], left, 13)
        freed.Free()
        comm.Send([np.arange(12, dtype="i4") + r, 1, pick], right, 13)
        comm.Send(np.zeros(1), right, 14)
        comm.Recv(np.zeros(1), left, 14)
        c.eq(target, [left, left + 1, -1, -1, left + 4, left + 5, -1, -1, left + 8, left + 9, -1, -1],
             "a freed receive into a vector")
        for how in ("Isendrecv", "Recv_init", "Irecv"):      # freed in other forms; known done by a token
            target[:] = -1
            data = [np.arange(12, dtype="i4") + r, 1, pick]
            if how == "Isendrecv":
                comm.Isendrecv(data, right, 19, [target, 1, pick], left, 19).Free()
            else:
                if how == "Recv_init":
                    pr2 = comm.Recv_init([target, 1, pick], left, 19)
                    pr2.Start()
                    pr2.Free()
                else:
                    comm.Irecv([target, 1, pick], left, 19).Free()
                comm.Send(data, right, 19)
            token = comm.Irecv(np.zeros(1), left, 20)
            comm.Send(np.zeros(1), right, 20)
            while not token.Test():
                pass
            c.eq(target[[0, 1, 2]], [left, left + 1, -1], f"a freed {how} into a vector, known done by a Test")
        comm.Barrier()
        pick.Free()
    for t in (big, neg, every_other, t12):
        t.Free()
    # a negative lower bound reads the array a view belongs to (MPI reads by address)
    base = np.arange(8.0) + 10 * r
    rev = D.Create_vector(4, 1, -1).Commit()
    got = np.zeros(4)
    comm.Sendrecv([base[3:], 1, rev], right, 15, got, left, 15)
    c.eq(got, [10.0 * left + 3, 10.0 * left + 2, 10.0 * left + 1, 10.0 * left], "a reversed vector on a[3:]")
    c.raises(lambda: comm.Send([base, 1, rev], right, 16), ValueError, "data before the array's memory")
    # a persistent request keeps its datatype when the program frees its handle
    pc = D.Create_vector(4, 1, 3).Commit()
    got = np.full(12, -1.0)
    preq = [comm.Recv_init([got, 1, pc], left, 17), comm.Send_init([np.arange(12.0) + r, 1, pc], right, 17)]
    pc.Free()
    for _ in range(2):
        MPI.Prequest.Startall(preq)
        MPI.Request.Waitall(preq)
    c.eq(got[::3], np.arange(0.0, 12, 3) + left, "persistent requests after their type was freed")
    for q in preq:
        q.Free()
    # a partial receive of a struct counts its basic elements
    pst = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, D]).Commit()
    one_st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, D]).Commit()
    st3 = MPI.Status()
    comm.Sendrecv([np.zeros(3), 1, one_st], right, 18, [np.zeros(4), 1, pst], left, 18, st3)
    c.eq([st3.Get_elements(pst), st3.Get_count(pst)], [2, MPI.UNDEFINED], "Get_elements of a partial struct")
    for t in (rev, pst, one_st):
        t.Free()
    # errors, on every rank, before any traffic
    raw = D.Create_vector(2, 1, 2)
    c.raises(lambda: comm.Send([np.zeros(4), 1, raw], right, 9), MPI.Exception, "an uncommitted type",
             MPI.ERR_TYPE)
    c.raises(lambda: comm.Allreduce([a, sdt], [a.copy(), sdt], op=MPI.SUM), MPI.Exception,
             "SUM of a struct of mixed types", MPI.ERR_OP)
    c.raises(lambda: comm.Bcast([np.zeros(16), col3], root=0), ValueError, "a count the buffer cannot give")
    c.raises(lambda: comm.Bcast([np.zeros(8), 1, col3], root=0), ValueError, "a type longer than the buffer")
    comm.Barrier()
    for t in [col, col3, sdt, every, blk, every2, *at, *stypes, *rtypes]:
        t.Free()


@pytest.mark.parametrize("n", SIZES)
def test_datatypes(n):
    check(job(n), "datatypes")


# ----------------------------------------------------------------------------- against mpi4py
PROG = (__import__("pathlib").Path(__file__).with_name("mpi_datatypes_prog.py"))


@pytest.mark.timeout(150)
@pytest.mark.skipif(_mpiexec() is None, reason="mpi4py + Open MPI's mpiexec not installed (pip install '.[bench]')")
def test_same_results_as_mpi4py():
    compare_with_mpi4py(str(PROG), lambda d: d["rank"])
