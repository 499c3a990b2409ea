"""tests/random_calls.py through ``collcomm.MPI``: the same drawn calls, made as an mpi4py
program makes them (upper-case buffer calls; ``I*`` requests waited for in batches where
the rank is asynchronous; ``MPI.IN_PLACE``; the world only). Same checks, same options
(``RANDOM_*``), same command line: ``python -m collcomm run -n N
tests/random_calls_mpi.py SEED CALLS``."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_calls import Caller, Drawn, Options, _fold, _operand, drive
from tests.random_jobs import main

#: the drawn calls the MPI front end makes here (the list form is the functional API's)
MPI_CALLS = ["all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter", "reduce_scatter",
             "all_to_all", "all_to_all_uneven", "sendrecv", "barrier"]


class MPICaller(Caller):
    """Caller whose calls go through collcomm.MPI.COMM_WORLD."""

    def __init__(self, opts: Any, comm: Any = None) -> None:
        """``comm``: the communicator of the calls (COMM_WORLD by default; the same ranks)."""
        opts.groups = False
        super().__init__(opts)
        from collcomm import MPI
        self.MPI, self.comm = MPI, MPI.COMM_WORLD if comm is None else comm

    def req(self, blocking: str, *args: Any) -> Any:
        """Comm.<blocking>(*args), or its I-form's request where this rank is asynchronous."""
        if self.opts.asynchronous:
            return getattr(self.comm, "I" + blocking[0].lower() + blocking[1:])(*args)
        getattr(self.comm, blocking)(*args)
        return None

    def _one(self, c: Drawn, ranks: list[int], what: str) -> tuple[Any, Callable[[], None]]:
        MPI, comm = self.MPI, self.comm
        n, me = comm.Get_size(), comm.Get_rank()
        dt, op, k, root = c.dt, c.op, c.count, c.root % n
        if op == "avg":          # (MPI has no AVG: every rank leaves the call out)
            return None, lambda: None
        mop = getattr(MPI, op.upper())
        data = lambda r, m: _operand(r, m, dt, op)   # noqa: E731
        each = lambda m: [data(r, m) for r in range(n)]   # noqa: E731
        got: Callable[[], Any] = lambda: None   # noqa: E731
        want: np.ndarray | None = None
        r = None
        ip = c.in_place
        if c.name == "all_reduce":
            x, out = data(me, k), np.empty(k, dt)
            r = self.req("Allreduce", MPI.IN_PLACE, x, mop) if ip else self.req("Allreduce", x, out, mop)
            got, want = (lambda: x if ip else out), _fold(each(k), op, dt)
        elif c.name == "reduce":
            x, out = data(me, k), np.empty(k, dt)
            if ip and me == root:
                r = self.req("Reduce", MPI.IN_PLACE, x, mop, root)
            else:
                r = self.req("Reduce", x, out if me == root else None, mop, root)
            if me == root:
                got, want = (lambda: x if ip else out), _fold(each(k), op, dt)
        elif c.name == "broadcast":
            x = data(me, k)
            r = self.req("Bcast", x, root)
            got, want = (lambda: x), data(root, k)
        elif c.name == "all_gather":
            out = np.empty(k * n, dt)
            if ip:
                out[me * k:(me + 1) * k] = data(me, k)
                r = self.req("Allgather", MPI.IN_PLACE, out)
            else:
                r = self.req("Allgather", data(me, k), out)
            got, want = (lambda: out), np.concatenate(each(k))
        elif c.name == "gather":
            out = np.empty(k * n, dt) if me == root else None
            if ip and me == root:
                out[me * k:(me + 1) * k] = data(me, k)
                r = self.req("Gather", MPI.IN_PLACE, out, root)
            else:
                r = self.req("Gather", data(me, k), out, root)
            if me == root:
                got, want = (lambda: out), np.concatenate(each(k))
        elif c.name == "scatter":
            full = data(root, k * n) if me == root else None
            out = np.empty(k, dt)
            if ip and me == root:
                r = self.req("Scatter", full, MPI.IN_PLACE, root)
                got = lambda: full[me * k:(me + 1) * k]   # noqa: E731
            else:
                r = self.req("Scatter", full, out, root)
                got = lambda: out   # noqa: E731
            want = data(root, k * n)[me * k:(me + 1) * k]
        elif c.name == "reduce_scatter":
            out = np.empty(k, dt)
            r = self.req("Reduce_scatter_block", data(me, k * n), out, mop)
            got, want = (lambda: out), _fold(each(k * n), op, dt)[me * k:(me + 1) * k]
        elif c.name == "all_to_all":
            out = np.empty(k * n, dt)
            r = self.req("Alltoall", data(me, k * n), out)
            got = lambda: out   # noqa: E731
            want = np.concatenate([data(q, k * n)[me * k:(me + 1) * k] for q in range(n)])
        elif c.name == "all_to_all_uneven":
            split = c.split[:n, :n]
            ins, outs = [int(v) for v in split[me]], [int(split[q][me]) for q in range(n)]
            out = np.empty(sum(outs), dt)
            r = self.req("Alltoallv", [data(me, sum(ins)), ins], [out, outs])
            got = lambda: out   # noqa: E731
            want = np.concatenate([data(q, int(split[q].sum()))[int(split[q][:me].sum()):][:outs[q]]
                                   for q in range(n)])
        elif c.name == "sendrecv" and n > 1:
            rb = np.empty(k, dt)
            comm.Sendrecv(data(me, k), (me + 1) % n, 5, rb, (me - 1) % n, 5)
            got, want = (lambda: rb), data((me - 1) % n, k)
        elif c.name == "barrier":
            r = self.req("Barrier")

        return (_Waiter(r) if r is not None else None), self.checker(got, want, [], what)


class _Waiter:
    """An MPI request with the functional API's ``wait()``."""

    def __init__(self, req: Any) -> None:
        self.req = req

    def wait(self) -> None:
        self.req.Wait()


def run(seed: int, count: int) -> list[str]:
    """random_calls.run through collcomm.MPI."""
    import collcomm as dist
    return drive(MPICaller(Options.from_env(dist.get_rank())), MPI_CALLS, seed, count)


if __name__ == "__main__":
    main(run)
