"""collcomm.MPI communicators and the environment, in the style of mpi4py's test_comm /
test_environ / test_datatype / test_op: sizes, ranks, names, Dup/Clone/Idup (a private
context), Split/Split_type/Create/Create_group, Compare, Free, COMM_NULL and COMM_SELF,
attributes, pickling, what is out of scope (NotImplementedError by name), datatypes and
ops attributes, Wtime/versions/Alloc_mem; sizes 1–5.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def comm_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    c.eq((comm.Get_rank(), comm.Get_size(), comm.rank, comm.size), (r, n, r, n), "rank and size")
    c.eq((comm.Get_name(), MPI.COMM_SELF.Get_name()), ("MPI_COMM_WORLD", "MPI_COMM_SELF"), "predefined names")
    c.eq((MPI.COMM_SELF.size, MPI.COMM_SELF.rank), (1, 0), "COMM_SELF")
    # Dup: same members, its own context (a message on the dup never reaches the parent)
    dup = comm.Dup()
    c.eq((dup.rank, dup.size, comm.Compare(dup), dup.Compare(dup), dup.Get_name()), (r, n, MPI.CONGRUENT, MPI.IDENT, ""),
         "Dup")
    dup.Set_name("mine")
    c.eq(dup.name, "mine", "Set_name")
    dup.Isend(np.ones(1), (r + 1) % n, 5)
    comm.Barrier()
    c.true(not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG), "a Dup's messages do not reach the parent")
    c.true(dup.Iprobe(MPI.ANY_SOURCE, 5), "they reach the Dup")
    dup.Recv(np.zeros(1), MPI.ANY_SOURCE, 5)
    out = np.zeros(1)
    dup.Allreduce(np.array([r + 1.0]), out)
    c.eq(out, [n * (n + 1) / 2], "Allreduce on a Dup")
    clone, (idup, req) = comm.Clone(), comm.Idup()
    req.Wait()
    c.eq((comm.Compare(clone), comm.Compare(idup), type(clone).__name__), (MPI.CONGRUENT, MPI.CONGRUENT, "Intracomm"),
         "Clone / Idup")
    # Split by parity, ordered by descending rank
    sub = comm.Split(r % 2, -r)
    members = sorted((p for p in range(n) if p % 2 == r % 2), reverse=True)
    c.eq((sub.size, sub.rank), (len(members), members.index(r)), "Split size/rank")
    c.eq(sub.Get_group().Translate_ranks(None, comm.Get_group()), members, "Split members in key order")
    out = np.zeros(1)
    sub.Allreduce(np.array([float(r)]), out, op=MPI.SUM)
    c.eq(out, [float(sum(members))], "Allreduce on a Split")
    c.eq(comm.Compare(sub), MPI.UNEQUAL if n > 1 else MPI.SIMILAR if len(members) > 1 else MPI.CONGRUENT,
         "Compare with a Split")
    none = comm.Split(MPI.UNDEFINED if r == 0 else 0, r)
    c.true((none == MPI.COMM_NULL) == (r == 0), "Split with UNDEFINED gives COMM_NULL")
    c.eq(comm.Split_type(MPI.COMM_TYPE_SHARED).size, n, "Split_type(COMM_TYPE_SHARED): one host")
    c.raises(lambda: comm.Split(-5), MPI.Exception, "negative color", MPI.ERR_ARG)
    # Create (everyone calls) and Create_group (members only)
    ends = comm.Get_group().Incl(sorted({0, n - 1}))
    made = comm.Create(ends)
    c.true((made == MPI.COMM_NULL) == (r not in (0, n - 1)), "Create gives COMM_NULL to non-members")
    if made != MPI.COMM_NULL:
        c.eq(made.allgather(r), sorted({0, n - 1}), "allgather on a Create'd communicator")
        c.eq(comm.Create_group(ends, tag=3).allreduce(1), len({0, n - 1}), "Create_group")
        made.Free()
        c.true(made == MPI.COMM_NULL, "Free gives COMM_NULL")
    c.raises(lambda: MPI.COMM_WORLD.Free(), MPI.Exception, "Free of COMM_WORLD", MPI.ERR_COMM)
    c.raises(lambda: MPI.COMM_NULL.Get_size(), MPI.Exception, "COMM_NULL.Get_size", MPI.ERR_COMM)
    c.true(MPI.Intracomm(MPI.COMM_NULL) == MPI.COMM_NULL and not MPI.COMM_NULL, "Intracomm(COMM_NULL)")
    c.true(MPI.Comm(comm) == comm and MPI.Comm(comm) is not comm, "Comm(comm) is the same handle")
    c.eq((comm.Is_inter(), comm.Is_intra(), comm.Get_topology()), (False, True, MPI.UNDEFINED), "kinds")
    c.eq(comm.Compare(MPI.COMM_SELF), MPI.CONGRUENT if n == 1 else MPI.UNEQUAL, "Compare with COMM_SELF")
    # pickling, attributes
    c.true(pickle.loads(pickle.dumps(MPI.COMM_WORLD)) is MPI.COMM_WORLD, "COMM_WORLD pickles to itself")
    c.true(pickle.loads(pickle.dumps(MPI.COMM_NULL)) == MPI.COMM_NULL, "COMM_NULL pickles")
    c.raises(lambda: pickle.dumps(dup), ValueError, "a Dup does not pickle")
    c.eq((comm.Get_attr(MPI.TAG_UB), comm.Get_attr(MPI.UNIVERSE_SIZE)), (2**31 - 1, n), "Get_attr")
    key = MPI.Comm.Create_keyval(copy_fn=lambda comm_, k, v: v + 1)
    comm.Set_attr(key, 41)
    c.eq((comm.Get_attr(key), comm.Dup().Get_attr(key)), (41, 42), "user attribute copied by Dup")
    comm.Delete_attr(key)
    c.eq(comm.Get_attr(key), None, "Delete_attr")
    # out of scope, by name
    for what, fn in (("Win", lambda: MPI.Win.Create(np.zeros(1), comm=comm)),
                     ("File", lambda: MPI.File.Open(comm, "/tmp/x")),
                     ("Spawn", lambda: comm.Spawn("python")),
                     ("Create_intercomm", lambda: comm.Create_intercomm(0, comm, 0))):
        try:
            fn()
            c.true(False, f"{what} did not raise")
        except NotImplementedError as exc:
            c.true(what.split("_")[0] in str(exc), f"{what}: NotImplementedError names it: {exc}")
    c.true(MPI.Comm.Get_parent() == MPI.COMM_NULL, "Get_parent is COMM_NULL")
    environment_checks(c, MPI, comm)


def environment_checks(c: Checker, MPI, comm) -> None:
    t0 = MPI.Wtime()
    c.true(isinstance(t0, float) and 0 < MPI.Wtick() < 1e-3 and MPI.Wtime() >= t0, "Wtime/Wtick")
    c.true(MPI.Is_initialized() and not MPI.Is_finalized(), "initialized")
    c.eq((MPI.Get_version(), MPI.Query_thread(), MPI.Init_thread()), ((3, 1), MPI.THREAD_MULTIPLE, MPI.THREAD_MULTIPLE),
         "versions and threads")
    c.true(MPI.get_vendor()[0] == "collcomm" and "collcomm" in MPI.Get_library_version(), "vendor")
    c.true(isinstance(MPI.Get_processor_name(), str) and MPI.Get_processor_name(), "processor name")
    mem = MPI.Alloc_mem(64)
    c.true(mem.nbytes == 64 and mem.address != 0 and np.frombuffer(mem, dtype="u1").size == 64, "Alloc_mem")
    MPI.Free_mem(mem)
    # datatypes and ops
    c.eq([(t.Get_size(), t.Get_extent(), t.Get_name()) for t in (MPI.INT, MPI.DOUBLE, MPI.FLOAT_INT, MPI.DOUBLE_INT, MPI.TWOINT)],
         [(4, (0, 4), "MPI_INT"), (8, (0, 8), "MPI_DOUBLE"), (8, (0, 8), "MPI_FLOAT_INT"), (12, (0, 16), "MPI_DOUBLE_INT"),
          (8, (0, 8), "MPI_2INT")], "datatype sizes and names")
    c.true(getattr(MPI, "2INT") == MPI.TWOINT and MPI.INT_INT == MPI.TWOINT, "2INT aliases")
    c.eq([MPI.DOUBLE_INT.Get_true_extent(), MPI.DOUBLE_INT.Create_contiguous(2).Get_true_extent(),
          MPI.DOUBLE.Get_true_extent(), MPI.DOUBLE_INT.true_ub], [(0, 12), (0, 28), (0, 8), 12], "true extents")
    c.true(MPI._typedict["d"] == MPI.DOUBLE and MPI._typedict["M"] == MPI.INT64_T
           and MPI._typedict_f["i4"] == MPI.INTEGER4 and MPI._typecode(MPI.INT32_T) == "i4"
           and MPI._typecode(MPI.FLOAT_INT) is None, "mpi4py's typecode tables")
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    comm.Allreduce(MPI.IN_PLACE, f)
    c.eq(f, np.arange(6.0).reshape(2, 3) * comm.size, "a Fortran-ordered buffer, in place")
    b4 = np.arange(6, dtype="i")
    comm.Allreduce(MPI.IN_PLACE, [b4, 2, 1, MPI.INT])
    c.eq(b4, np.array([0, comm.size, 2 * comm.size, 3, 4, 5]), "[buf, count, displ, datatype]")
    c.raises(lambda: comm.Allreduce(MPI.IN_PLACE, [b4, 2, 1, np.dtype("i")]), TypeError,
             "a last item that is no datatype")
    c.eq((MPI.Datatype.fromcode("d").name, MPI.DOUBLE.typechar, MPI.INT.typestr), ("MPI_DOUBLE", "d", "i4"), "typecodes")
    three = MPI.INT.Create_contiguous(3).Commit()
    out = np.zeros(6, dtype="i")
    comm.Allreduce([np.arange(6, dtype="i"), 2, three], [out, 2, three])
    c.eq(out, np.arange(6) * comm.size, "Allreduce with a contiguous datatype")
    three.Free()
    c.raises(lambda: MPI.INT.Free(), MPI.Exception, "Free a predefined datatype", MPI.ERR_TYPE)
    c.raises(lambda: MPI.INT.Create_darray(1, 0, 1, [2], [MPI.DISTRIBUTE_BLOCK], [MPI.DISTRIBUTE_DFLT_DARG], [1]),
             NotImplementedError, "Create_darray")
    c.true(pickle.loads(pickle.dumps(MPI.INT)) == MPI.INT and pickle.loads(pickle.dumps(MPI.SUM)) == MPI.SUM, "pickling")
    c.eq((MPI.SUM.Is_commutative(), MPI.SUM.is_predefined, MPI.SUM(2, 3), MPI.MAX(2, 3), MPI.MAXLOC((1, 5), (1, 3))),
         (True, True, 5, 3, (1, 3)), "op attributes and calls")
    inout = np.ones(3)
    MPI.PROD.Reduce_local(np.full(3, 4.0), inout)
    c.eq(inout, np.full(3, 4.0), "Reduce_local")
    c.raises(lambda: MPI.SUM.Free(), MPI.Exception, "Free a predefined op", MPI.ERR_OP)
    e = MPI.Exception(MPI.ERR_RANK)
    c.eq((int(e), e.Get_error_class(), e.Get_error_string(), e == MPI.ERR_RANK, MPI.Get_error_string(MPI.ERR_TAG)),
         (MPI.ERR_RANK, MPI.ERR_RANK, "MPI_ERR_RANK: invalid rank", True, "MPI_ERR_TAG: invalid tag"), "MPI.Exception")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_comm(n):
    check(job(n), "comm")


def test_import_is_cheap_and_torch_free():
    """``from collcomm import MPI`` joins nothing and imports no torch."""
    import subprocess
    import sys

    code = ("import sys, collcomm; from collcomm import MPI; import collcomm.core.runtime as rt; "
            "assert 'torch' not in sys.modules; assert not rt.is_initialized(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert out.stdout.strip() == "ok", out.stderr


def bench_rows():
    from collcomm.MPI import bench

    return bench.run(ops=("allreduce", "bcast", "alltoall", "barrier"), sizes=(8, 4096), iters=5, rounds=2)


@pytest.mark.timeout(90)
def test_bench_compares_both_front_ends():
    from tests.harness import run_ranks

    rows = run_ranks(bench_rows, 2, timeout=80)
    assert rows[0] == rows[1]          # every rank reports the slowest rank's times
    assert [(r["op"], r["bytes"]) for r in rows[0]] == [("allreduce", 8), ("allreduce", 4096), ("bcast", 8),
                                                       ("bcast", 4096), ("alltoall", 8), ("alltoall", 4096),
                                                       ("barrier", 0)]
    assert all(r["api_us"] > 0 and r["mpi_us"] > 0 and abs(r["extra_us"] - (r["mpi_us"] - r["api_us"])) < 0.02
               for r in rows[0])
