"""The same program under real mpi4py + Open MPI (``mpiexec -n 3``) and under collcomm.MPI
(``collcomm run -n 3``): every rank prints one JSON line of results (collective semantics,
IN_PLACE, vector variants, ops, groups, topologies, statuses, error classes), and the two
runs must agree exactly. Skipped with a reason when mpi4py or Open MPI's mpiexec is absent.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Callable

import pytest

from tests.harness import ROOT

PROG = r'''
import json, sys
import numpy as np
if sys.argv[1] == "mpi4py":
    from mpi4py import MPI
else:
    from collcomm import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
out = {}
def L(a): return np.asarray(a).tolist()
def err(f):
    try:
        f()
        return "no error"
    except MPI.Exception as e:
        return ["MPI.Exception", e.Get_error_class()]
    except Exception as e:
        return type(e).__name__

full = np.full(2 * n, -1.0); full[2 * r:2 * r + 2] = r
comm.Gather(MPI.IN_PLACE if r == 0 else np.full(2, float(r)), full if r == 0 else None, root=0)
out["gather_in_place"] = L(full) if r == 0 else None
mine = np.full(2, -1.0)
comm.Scatter(np.arange(2.0 * n) if r == 1 else None, MPI.IN_PLACE if r == 1 else mine, root=1)
out["scatter_in_place"] = L(mine)
x = np.arange(n, dtype=float) + 10 * r
comm.Alltoall(MPI.IN_PLACE, x); out["alltoall_in_place"] = L(x)
rb = np.full(2 * n + 3, -1.0)
counts = [p % 2 + 1 for p in range(n)]
comm.Gatherv(np.full(counts[r], float(r)), [rb, counts, [2 * p + (p > 0) for p in range(n)], MPI.DOUBLE] if r == 0 else None)
out["gatherv_displs"] = L(rb) if r == 0 else None
rb = np.full(2 * n, -1.0)
comm.Allgatherv(np.full(counts[r], float(r)), [rb, counts]); out["allgatherv"] = L(rb)
rb = np.full(counts[r], -1.0)
comm.Reduce_scatter(np.arange(float(sum(counts))) + r, rb, counts); out["reduce_scatter"] = L(rb)
x = np.arange(2.0 * n) + r
comm.Reduce_scatter_block(MPI.IN_PLACE, x); out["rsb_in_place"] = L(x)
x = np.full(2, r + 1.0); comm.Scan(MPI.IN_PLACE, x); out["scan_in_place"] = L(x)
x = np.full(2, r + 1.0); comm.Exscan(np.full(2, r + 1.0), x, op=MPI.PROD); out["exscan"] = L(x) if r else None
pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)
y = np.zeros(2, dtype=pair)
comm.Allreduce([np.array([(r % 2, r), (-r, r)], dtype=pair), MPI.DOUBLE_INT], [y, MPI.DOUBLE_INT], op=MPI.MAXLOC)
out["maxloc"] = [list(t) for t in y.tolist()]
def concat(a, b, dt):
    a, b = np.frombuffer(a, dtype="d"), np.frombuffer(b, dtype="d")
    b[:] = a * 10.0 ** (np.floor(np.log10(b)) + 1) + b
op = MPI.Op.Create(concat, commute=False)
y = np.zeros(1); comm.Allreduce(np.array([r + 1.0]), y, op=op); out["user_op"] = L(y)
y = np.zeros(1); comm.Scan(np.array([r + 1.0]), y, op=op); out["user_scan"] = L(y)
op.Free()
out["obj"] = [comm.allreduce(str(r), op=lambda a, b: a + b), comm.scan(r + 1), comm.exscan(r + 1),
              comm.reduce([r], root=2), comm.allreduce((r % 2, r), op=MPI.MINLOC), comm.alltoall([r * 10 + j for j in range(n)])]
sub = comm.Split(r % 2, -r)
out["split"] = [sub.rank, sub.size, sub.Get_group().Translate_ranks(None, comm.Get_group()), comm.Compare(sub),
                comm.Compare(comm.Dup()), sub.Get_name()]
g = comm.Get_group()
out["group"] = [MPI.Group.Union(g.Incl([2, 0]), g).Translate_ranks(None, g), g.Excl([0]).rank,
                g.Compare(g.Incl([0, 1, 2])), g.Compare(g.Incl([2, 1, 0])), g.Range_incl([(0, 2, 2)]).size]
cart = comm.Create_cart([n], periods=[True])
out["cart"] = [cart.Shift(0, 1), cart.coords, cart.Get_topo(), MPI.Compute_dims(12, 3), comm.Create_cart([n], [False]).Shift(0, -1)]
st = MPI.Status()
comm.Isend(np.arange(r + 1, dtype="i"), (r + 1) % n, 5)
comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
out["probe"] = [st.source, st.tag, st.Get_count(MPI.INT), st.Get_count(MPI.DOUBLE)]
comm.Recv(np.zeros(n + 1, dtype="i"), st.source, st.tag, st)
out["recv_status"] = [st.source, st.tag, st.Get_count(), st.Get_elements(MPI.INT)]
comm.Recv(np.zeros(1), MPI.PROC_NULL, 3, st)
out["proc_null"] = [st.source, st.tag, st.Get_count()]
comm.Isend(np.arange(3.0), (r + 1) % n, 6)
out["errors"] = [err(lambda: comm.Bcast(np.zeros(1), root=n)), err(lambda: comm.Send(np.zeros(1), n)),
                 err(lambda: comm.Send(np.zeros(1), 0, -2)), err(lambda: comm.Allreduce(np.ones(1), np.ones(1), op=MPI.BAND)),
                 err(lambda: comm.Recv(np.zeros(2), (r - 1) % n, 6)), err(lambda: MPI.Compute_dims(7, [2, 0])),
                 err(lambda: comm.Get_group().Incl([n])), err(lambda: MPI.COMM_NULL.Get_size()),
                 err(lambda: comm.Split(-2)), err(lambda: comm.scatter([1] * (n + 1), root=0) if r == 0 else None)]
# Fortran-ordered buffers (memory order, as mpi4py), the 4-item spec, value-index pair sizes
a = np.arange(6.0).reshape(2, 3) if r == 0 else np.zeros((2, 3))
comm.Bcast(a.T, root=0)
f = np.asfortranarray(np.arange(6.0).reshape(2, 3) * (r + 1)); fo = np.zeros((2, 3), order="F")
comm.Allreduce(f, fo); comm.Allreduce(MPI.IN_PLACE, f)
g = np.zeros((2, n), order="F"); comm.Allgather(np.full(2, r + 1.0), g)
fr = np.zeros((2, 3), dtype="i", order="F")
comm.Sendrecv(np.asfortranarray(np.arange(6, dtype="i").reshape(2, 3) + r), (r + 1) % n, 9, fr, (r - 1) % n, 9)
b4 = np.arange(6, dtype="i") if r == 0 else np.zeros(6, "i")
comm.Bcast([b4, 2, 1, MPI.INT], root=0)
out["layouts"] = [L(a), L(fo), L(f), L(g), L(fr), L(b4)]
pst = MPI.Status()
comm.Sendrecv([np.zeros(2, dtype=pair), MPI.DOUBLE_INT], (r + 1) % n, 10, [np.zeros(3, dtype=pair), MPI.DOUBLE_INT], (r - 1) % n, 10, pst)
ct = MPI.INT.Create_contiguous(3).Commit()
es = MPI.Status(); es.Set_elements(ct, 6)
out["sizes"] = [[(t.Get_size(), t.Get_extent(), t.Create_contiguous(2).Get_size()) for t in
                 (MPI.FLOAT_INT, MPI.DOUBLE_INT, MPI.LONG_INT, MPI.SHORT_INT, MPI.TWOINT)],
                [pst.Get_count(MPI.DOUBLE_INT), pst.Get_elements(MPI.DOUBLE_INT)],
                [es.Get_count(ct), es.Get_elements(ct), es.Get_count()],
                [MPI._typedict[k] == t for k, t in zip("bhilqfdFD", (MPI.SIGNED_CHAR, MPI.SHORT, MPI.INT, MPI.LONG,
                 MPI.LONG_LONG, MPI.FLOAT, MPI.DOUBLE, MPI.C_FLOAT_COMPLEX, MPI.C_DOUBLE_COMPLEX))] + [MPI._typecode(MPI.DOUBLE), MPI._typecode(MPI.DOUBLE_INT)]]
# a serializer of the program's own (mpi4py's MPI.pickle.__init__(dill.dumps, dill.loads) idiom)
MPI.pickle.__init__(lambda o, *a: json.dumps(o).encode(), lambda d: json.loads(bytes(d)))
swapped = [comm.bcast((1, 2), root=1), comm.allgather((r,)), comm.sendrecv((r, "t"), (r + 1) % n, 11, None, (r - 1) % n, 11)]
MPI.pickle.__init__()
out["pickle"] = swapped + [[type(v).__name__ for v in (swapped[0], swapped[1][0], swapped[2])],
                          type(comm.bcast((1, 2), root=1)).__name__, MPI.pickle.PROTOCOL]
out["attrs"] = [comm.Get_attr(MPI.TAG_UB), MPI.IDENT, MPI.CONGRUENT, MPI.SIMILAR, MPI.UNEQUAL, MPI.UNDEFINED,
                MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.PROC_NULL, MPI.ERR_RANK, MPI.ERR_TRUNCATE, MPI.INT.Get_size(),
                MPI.DOUBLE_INT.Get_extent(), MPI.TWOINT.Get_name(), MPI.Get_version()]
comm.Barrier()
print("JSON " + json.dumps(out, sort_keys=True), flush=True)
'''


def _mpiexec() -> str | None:
    exe = shutil.which("mpiexec")
    if exe is None:
        return None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return exe if "Open MPI" in version.stdout + version.stderr else None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLLCOMM_", "OMPI_", "PMI_", "PMIX_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def compare_with_mpi4py(prog: str, order: "Callable[[dict], object]", n: int = 3) -> None:
    """Run ``python prog mpi4py`` under Open MPI's mpiexec and ``prog collcomm`` under
    ``collcomm run``; each rank prints ``JSON {...}``; the rows (sorted by ``order``) must
    be equal key by key."""
    theirs = subprocess.run([_mpiexec(), "--allow-run-as-root", "--oversubscribe", "-n", str(n), sys.executable,
                             prog, "mpi4py"], capture_output=True, text=True, timeout=120, env=_env())
    assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
    ours = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", str(n), "--no-prefix", prog, "collcomm"],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-2000:]

    def rows(out: str) -> list[dict]:
        return sorted((json.loads(line.split("JSON ", 1)[1]) for line in out.splitlines() if "JSON " in line),
                      key=order)
    a, b = rows(theirs.stdout), rows(ours.stdout)
    assert len(a) == len(b) == n
    for rank, (x, y) in enumerate(zip(a, b)):
        diff = {k: (x[k], y.get(k)) for k in x if x[k] != y.get(k)}
        assert not diff, f"rank {rank}: mpi4py vs collcomm.MPI: {diff}"


@pytest.mark.timeout(150)
@pytest.mark.skipif(_mpiexec() is None, reason="mpi4py + Open MPI's mpiexec not installed (pip install '.[bench]')")
def test_same_results_as_mpi4py(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    compare_with_mpi4py(str(prog), lambda d: d["cart"][1])
