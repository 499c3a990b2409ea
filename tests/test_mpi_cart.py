"""collcomm.MPI Cartesian topologies, in the style of mpi4py's test_cco_nb_cart/test_topo:
Compute_dims (against a table, and against mpi4py when it is installed), Create_cart,
Get_topo/coords/Get_cart_rank/Shift (periodic and not), Sub, ranks beyond the grid, a
halo exchange along Shift, the TP/CP/PP/DP grid of seed 002; sizes 1–5.
"""
from __future__ import annotations

import pytest

from tests.mpi_checks import SIZES, Checker, check, job

DIMS = {(24, 3): [4, 3, 2], (30, 3): [5, 3, 2], (16, 4): [2, 2, 2, 2], (12, 2): [4, 3], (7, 2): [7, 1],
        (6, 3): [3, 2, 1], (1, 0): [], (4, 1): [4]}


def cart_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    for (nodes, nd), want in DIMS.items():
        c.eq(MPI.Compute_dims(nodes, nd), want, f"Compute_dims({nodes}, {nd})")
    c.eq(MPI.Compute_dims(24, [0, 3, 0]), [4, 3, 2], "Compute_dims with a fixed dimension")
    c.raises(lambda: MPI.Compute_dims(7, [2, 0]), MPI.Exception, "Compute_dims that cannot fit", MPI.ERR_DIMS)
    dims = MPI.Compute_dims(n, 2)
    cart = comm.Create_cart(dims, periods=[True, False])
    c.true(isinstance(cart, MPI.Cartcomm) and cart.topology == MPI.CART, "Create_cart gives a Cartcomm")
    row, col = r // dims[1], r % dims[1]
    c.eq(cart.Get_topo(), ([dims[0], dims[1]], [1, 0], [row, col]), "Get_topo")
    c.eq((cart.coords, cart.dims, cart.ndim), ([row, col], dims, 2), "properties")
    c.eq(cart.Get_cart_rank([row + dims[0], col]), r, "Get_cart_rank wraps a periodic dimension")
    c.eq([cart.Get_coords(p) for p in range(n)], [[p // dims[1], p % dims[1]] for p in range(n)], "Get_coords")
    up, down = cart.Shift(0, 1)
    c.eq((up, down), (((row - 1) % dims[0]) * dims[1] + col, ((row + 1) % dims[0]) * dims[1] + col), "periodic Shift")
    left, right = cart.Shift(1, 1)
    c.eq((left, right), (r - 1 if col > 0 else MPI.PROC_NULL, r + 1 if col < dims[1] - 1 else MPI.PROC_NULL),
         "non-periodic Shift")
    halo = cart.sendrecv(r, dest=down, source=up)
    c.eq(halo, up, "halo exchange along a periodic Shift")
    c.eq(cart.sendrecv(r, dest=right, source=left), left if left != MPI.PROC_NULL else None, "exchange with PROC_NULL ends")
    rows = cart.Sub([False, True])
    c.eq((rows.size, rows.rank, rows.dims), (dims[1], col, [dims[1]]), "Sub keeping dimension 1")
    c.eq(rows.allgather(r), [row * dims[1] + k for k in range(dims[1])], "allgather along a Sub")
    c.true(cart.Dup().Get_topology() == MPI.CART, "Dup keeps the topology")
    c.raises(lambda: MPI.Cartcomm(comm), TypeError, "Cartcomm of a plain communicator")
    if n > 1:
        short = comm.Create_cart([n - 1])
        c.true((short == MPI.COMM_NULL) == (r == n - 1), "ranks beyond the grid get COMM_NULL")
    # seed 002: the [dp, pp, cp, tp] grid; each rank's TP group holds the ranks of its row
    grid = MPI.Compute_dims(n, [0, 1, 1, 0])
    g4 = comm.Create_cart(grid)
    tp = g4.Sub([False, False, False, True])
    dp = g4.Sub([True, False, False, False])
    c.eq(tp.allgather(r), [r - r % grid[3] + k for k in range(grid[3])], "TP group")
    c.eq(dp.allgather(r), [r % grid[3] + k * grid[3] for k in range(grid[0])], "DP group")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_cart(n):
    check(job(n), "cart")


def test_compute_dims_matches_mpi4py():
    """Against the real thing, in a child process (importing mpi4py initializes MPI)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install '.[bench]')")
    code = ("import json; from mpi4py import MPI; "
            "print(json.dumps([MPI.Compute_dims(a, b) for a in range(1, 65) for b in range(1, 5)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"mpi4py does not start here: {out.stderr[-300:]}")
    from collcomm import MPI

    ours = [MPI.Compute_dims(a, b) for a in range(1, 65) for b in range(1, 5)]
    assert ours == json.loads(out.stdout.strip().splitlines()[-1])
