"""native/_mpi_plain.c ``mpi_plain``: which buffer specs stand for their array as it is
(collcomm.MPI then gives the fast calls the array itself), in one process."""
from __future__ import annotations

import array
from typing import Iterator

import numpy as np
import pytest

from collcomm import MPI
from collcomm.MPI._types import PLAIN

pytestmark = [pytest.mark.skipif(PLAIN is None, reason="the native core is not built"),
              pytest.mark.usefixtures("world_of_one_left_closed")]


@pytest.fixture(params=["numpy's C table", "numpy's calls"], autouse=True)
def view_way(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test with the views of parts and of other buffers made by numpy's C table
    (native/_nd_view.c) and as before it (slices, numpy.frombuffer)."""
    from collcomm import native
    table = request.param == "numpy's C table"
    if table and not native.core.nd_views(True):
        pytest.skip("numpy's C table is not usable here")
    if not table:
        native.core.nd_views(False)
    try:
        yield
    finally:
        native.core.nd_views(True)


def test_numpy_table_in_use() -> None:
    """numpy 1.x and 2.x export the table at the indices _nd_view.c reads: the quick way
    is on wherever the core is built against such a numpy."""
    from collcomm import native
    assert int(np.__version__.split(".")[0]) not in (1, 2) or native.core.nd_views(True)


def test_both_ways_make_the_same_views() -> None:
    from collcomm import native
    x = np.arange(12.0)
    ro = np.arange(4.0)
    ro.flags.writeable = False
    specs = [([x, 5, MPI.DOUBLE], True), ([x, (2, 3), MPI.DOUBLE], True), ([x, MPI.INT64_T], False),
             ([x.reshape(3, 4), (2, 1), MPI.DOUBLE], True), ([ro, 2, MPI.DOUBLE], False),
             ([bytearray(range(16)), MPI.DOUBLE], True), ([bytearray(range(16)), 1, 1, MPI.DOUBLE], False),
             ([array.array("i", range(6)), (2, 3), MPI.INT], True), ([bytes(range(16)), MPI.INT], False),
             ([memoryview(bytearray(range(8)))[2:6], MPI.BYTE], True)]
    for spec, writable in specs:
        made = []
        for on in (True, False):
            native.core.nd_views(on)
            v = PLAIN(spec, 1, writable)
            assert isinstance(v, np.ndarray), spec
            made.append((v.dtype, v.shape, v.tobytes(), v.flags.writeable, v.flags.c_contiguous,
                         np.shares_memory(v, np.asarray(spec[0])),
                         isinstance(spec[0], np.ndarray) and v.base is spec[0]))
        assert made[0] == made[1], spec


def test_specs_that_are_their_array() -> None:
    x = np.arange(6.0)
    for spec in ([x, MPI.DOUBLE], (x, MPI.DOUBLE), [x, 6, MPI.DOUBLE], [x, None, MPI.DOUBLE],
                 [x, (6, 0), MPI.DOUBLE], [x, (6, None), MPI.DOUBLE], [x, 6, 0, MPI.DOUBLE],
                 [x, MPI.DOUBLE_PRECISION], [x, MPI.Datatype(MPI.DOUBLE)]):
        assert PLAIN(spec, 1, True) is x, spec
    grid = np.zeros((2, 3), dtype=np.int32)
    assert PLAIN([grid, MPI.INT], 1, False) is grid          # (any C-contiguous shape)
    assert PLAIN([x, 2, MPI.DOUBLE], 3, True) is x           # (2 a rank, 3 ranks: 6)
    assert PLAIN([x, MPI.DOUBLE], 3, True) is x


def test_specs_that_are_not() -> None:
    x = np.arange(6.0)
    ro = np.arange(6.0)
    ro.flags.writeable = False
    for spec, per, writable in (([x, (6, 1), MPI.DOUBLE], 1, False), ([x, 6, 1, MPI.DOUBLE], 1, False),
                                ([x, 3, MPI.DOUBLE], 3, False), ([x, MPI.DOUBLE], 4, False),
                                ([ro, MPI.DOUBLE], 1, True), ([x, (2, -1), MPI.DOUBLE], 1, False),
                                ([x[::2], MPI.DOUBLE], 1, False), ([x, 6.0, MPI.DOUBLE], 1, False),
                                ([x, MPI.DOUBLE_INT], 1, False), ([x, MPI.DATATYPE_NULL], 1, False),
                                ([x, "d"], 1, False),
                                ([x], 1, False), ([x, 6, 0, 0, MPI.DOUBLE], 1, False), (x, 1, False)):
        assert PLAIN(spec, per, writable) is spec, spec
    assert PLAIN([ro, MPI.DOUBLE], 1, False) is ro           # (read only: fine for a send)
    vec = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    assert PLAIN([x, 1, vec], 1, False)[0] is x              # (a derived type: the spec)
    vec.Free()


def test_parts_of_arrays_are_views() -> None:
    x = np.arange(6.0)
    part = PLAIN([x, 5, MPI.DOUBLE], 1, True)
    assert part.size == 5 and np.shares_memory(part, x)
    mid = PLAIN([x, (2, 3), MPI.DOUBLE], 1, True)
    mid[:] = -1
    assert x.tolist() == [0.0, 1.0, 2.0, -1.0, -1.0, 5.0]
    assert PLAIN([x, 1, 5, MPI.DOUBLE], 1, False).tolist() == [5.0]
    assert PLAIN([x, (2, 3), MPI.DOUBLE], 1, True).base is x      # (1-D, its own dtype: a slice)
    grid = np.arange(6.0).reshape(2, 3)                            # (2-D: numpy.frombuffer's view)
    corner = PLAIN([grid, (2, 1), MPI.DOUBLE], 1, True)
    assert corner.tolist() == [1.0, 2.0] and np.shares_memory(corner, grid)
    ro = np.arange(4.0)
    ro.flags.writeable = False
    assert PLAIN([ro, 2, MPI.DOUBLE], 1, False).tolist() == [0.0, 1.0]
    spec = [ro, 2, MPI.DOUBLE]
    assert PLAIN(spec, 1, True) is spec                            # (read only, written: refused)
    bits = PLAIN([x, MPI.INT64_T], 1, False)
    assert bits.dtype == np.int64 and bits.tobytes() == x.tobytes()
    assert PLAIN([x, MPI.FLOAT], 1, False).size == 12
    assert PLAIN([x, 1, MPI.DOUBLE], 3, True).size == 3          # (one a rank, 3 ranks)
    assert PLAIN([x, MPI.DOUBLE], 3, True).size == 6
    raw = bytearray(16)
    for spec, per in (([raw, (1, 2 ** 62), MPI.INT], 1), ([x, (1, 2 ** 61), MPI.DOUBLE], 1),
                      ([raw, 2 ** 62 + 1, MPI.BYTE], 4), ([x, 2 ** 61 + 1, MPI.DOUBLE], 4),
                      ([raw, None, 2 ** 62, MPI.INT], 1), ([x, MPI.INT], 2 ** 62)):
        assert PLAIN(spec, per, True) is spec, spec        # (no product wraps into a small view)


def test_buffers_that_are_no_arrays() -> None:
    raw = bytearray(range(16))
    a = PLAIN(raw, 1, True)
    assert a.dtype == np.uint8 and a.size == 16
    a[0] = 99
    assert raw[0] == 99                                       # (the same memory: no copy)
    doubles = array.array("d", [1.0, 2.0, 3.0])
    view = PLAIN([doubles, (1, 1), MPI.DOUBLE], 1, True)
    view[0] = 7.0
    assert doubles.tolist() == [1.0, 7.0, 3.0]
    mem = MPI.Alloc_mem(64)
    assert PLAIN([mem, 8, MPI.BYTE], 1, False).size == 8
    assert PLAIN([mem, 4, MPI.INT], 4, True).size == 16       # (4 a rank, 4 ranks)
    assert PLAIN([memoryview(raw)[2:6], MPI.BYTE], 1, True).tolist() == [2, 3, 4, 5]
    for spec, writable in (([raw, 3, MPI.DOUBLE], False), ([raw, 2, 1, MPI.DOUBLE], False),
                           ([bytes(16), MPI.DOUBLE], True), ([raw, MPI.DOUBLE_INT], False),
                           ([raw, (1, -1), MPI.DOUBLE], False), ([bytearray(7), MPI.DOUBLE], False)):
        assert PLAIN(spec, 1, writable) is spec, spec
    assert PLAIN([bytes(16), MPI.DOUBLE], 1, False).size == 2            # (read only: a send)
    scalar = np.float64(3.0)                 # (numpy.asarray would copy it: not taken)
    assert PLAIN(scalar, 1, True) is scalar and PLAIN(scalar, 1, False) is scalar
    assert PLAIN(bytes(4), 1, True) == bytes(4)                          # (read only: refused)


def test_views_keep_their_buffer_pinned() -> None:
    """A view over a bytearray, an array.array or a memoryview keeps the memory exported
    while it lives (numpy.frombuffer's memoryview; the numpy.ndarray constructor would
    not: a pending Irecv's view would then write into memory freed by a resize)."""
    for spec in ([bytearray(64), MPI.DOUBLE], [bytearray(64), 2, MPI.DOUBLE], [bytearray(64), (2, 1), MPI.DOUBLE],
                 bytearray(64)):
        ba = spec[0] if isinstance(spec, list) else spec
        view = PLAIN(spec, 1, True)
        assert isinstance(view, np.ndarray), spec
        with pytest.raises(BufferError):
            ba.extend(bytes(1 << 20))
        del view
        ba.extend(b"\0")                # (released with the view)
    arr = array.array("d", [0.0] * 8)
    view = PLAIN([arr, 4, MPI.DOUBLE], 1, True)
    with pytest.raises(BufferError):
        arr.extend([1.0] * 100000)
    under = bytearray(64)
    mv = memoryview(under)
    view = PLAIN([mv, MPI.DOUBLE], 1, True)
    mv.release()                        # (the view holds a memoryview of its own over `under`)
    with pytest.raises(BufferError):
        under.extend(bytes(1 << 20))
    view[:] = 1.0                       # (still the bytearray's memory)
    assert bytes(under) == np.ones(8).tobytes()
