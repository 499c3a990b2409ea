"""collcomm bench places every library's buffers alike (tools/bench/placement.py):
``--offset`` bytes past a 4 KiB page plus ``--skew`` for each rank number, or np.empty's own
place with ``--offset any``; bad values are refused before anything runs."""
from __future__ import annotations

import numpy as np
import pytest

from collcomm.tools.bench import options as O
from collcomm.tools.bench.placement import placed_empty, rank_offset
from tests.harness import run_ranks
from tests.test_bench import _bench, _data_lines


@pytest.mark.timeout(10)
@pytest.mark.parametrize("offset", [0, 16, 48, 4080])
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64", "complex128"])
def test_placed_where_asked(offset: int, dtype: str) -> None:
    a = placed_empty(1001, dtype, offset)
    assert a.ctypes.data % 4096 == offset and a.shape == (1001,) and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    a[:] = 3
    assert placed_empty(0, dtype, offset).size == 0
    assert placed_empty(5, dtype, None).shape == (5,)


@pytest.mark.timeout(10)
def test_rank_offsets() -> None:
    assert [rank_offset(16, 0, r) for r in range(3)] == [16, 16, 16]
    assert [rank_offset(0, 16, r) for r in range(3)] == [0, 16, 32]
    assert rank_offset(4080, 32, 1) == 16 and rank_offset(None, 0, 5) is None


def _options(*argv: str) -> O.Options:
    from collcomm.tools.cli import build_parser

    return O.options_from_args(build_parser().parse_args(["bench", *argv]))


@pytest.mark.timeout(10)
def test_options() -> None:
    opts = _options()
    assert opts.offset == 0 and opts.skew == 0
    opts = _options("--offset", "16", "--skew", "32")
    assert opts.offset == 16 and opts.skew == 32 and O.Options.from_json(opts.to_json()) == opts
    opts = _options("--offset", "any")
    assert opts.offset is None and O.Options.from_json(opts.to_json()) == opts
    for argv, message in ([("--offset", "8"), "multiple of 16"], [("--offset", "4096"), "below 4096"],
                          [("--skew", "-16"), "multiple of 16"], [("--offset", "x"), "number of bytes"],
                          [("--offset", "any", "--skew", "16"), "no meaning"]):
        with pytest.raises(ValueError, match=message):
            _options(*argv)


def _allocs(offset: int, skew: int) -> list[int]:
    """Where the collcomm backends' (functional API, collcomm.MPI) buffers start past a page."""
    from collcomm.tools.bench.peers import MPIBackend
    from collcomm.tools.bench.worker import CollcommBackend

    places = []
    for backend in (CollcommBackend("numpy"), MPIBackend("collcomm")):
        backend.offset = rank_offset(offset, skew, backend.rank)
        places += [backend.alloc(1000, "float32").ctypes.data % 4096,
                   backend.alloc(3, "float64").ctypes.data % 4096]
    return places


@pytest.mark.timeout(60)
def test_backends_place_their_buffers() -> None:
    res = run_ranks(_allocs, 2, 32, 16, transport="shm", timeout=50)
    assert res == [[32] * 4, [48] * 4]


@pytest.mark.timeout(120)
def test_smoke_placed_and_checked() -> None:
    pytest.importorskip("mpi4py")        # (--compare mpi: the last column checks both libraries)
    p = _bench("-n", "2", "--op", "all_gather,sendrecv", "-b", "4K", "-e", "4K", "--iters", "2",
               "--warmup", "1", "--rounds", "1", "--compare", "mpi", "--offset", "16", "--skew",
               "16", "--check", timeout=110)
    assert p.returncode == 0, p.stderr
    assert "offset=16 skew=16" in p.stdout, p.stdout
    here = [ln for ln in p.stdout.splitlines() if ln.startswith("# collcomm here: ")]
    assert len(here) == 1 and ("native core" in here[0] or "pure Python" in here[0]), p.stdout
    rows = _data_lines(p.stdout)
    assert len(rows) == 2 and all(r[-1] in ("0/0", "0") for r in rows), p.stdout
    p = _bench("-n", "2", "--op", "sendrecv", "-b", "4K", "-e", "4K", "--offset", "12")
    assert p.returncode == 2 and "--offset must be below 4096 bytes and a multiple of 16" in p.stderr, p.stderr
