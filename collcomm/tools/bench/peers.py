"""The peer libraries, measured by the same :func:`collcomm.tools.bench.worker.sweep`.

    mpiexec --allow-run-as-root --oversubscribe -n N python -m collcomm.tools.bench.peers mpi OPTS.json OUT.json
    (N processes with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) python -m collcomm.tools.bench.peers gloo OPTS.json OUT.json

``cc-mpi`` and ``cc-torch`` run the same two sweeps on collcomm's own front ends
(``collcomm.MPI``; torch.distributed with backend "collcomm"), launched by ``collcomm run``.

``mpi``: mpi4py on Open MPI, numpy buffers, the buffer-protocol (upper-case) calls,
``MPI.IN_PLACE`` for in-place. ``gloo``: torch.distributed with backend "gloo" on CPU
tensors that share memory with numpy arrays (``torch.from_numpy``); its API is in place
for all_reduce / broadcast / reduce like collcomm's.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from .options import Options
from .placement import placed_empty
from .worker import Case, Unsupported, sweep


class MPIBackend:
    name = "mpi"

    def __init__(self, library: str = "mpi4py") -> None:
        if library == "collcomm":        # the same sweep through collcomm's mpi4py front end
            from collcomm import MPI
        else:
            from mpi4py import MPI       # type: ignore[no-redef]

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def bcast_int(self, value: int) -> int:
        return int(self.comm.bcast(int(value), root=0))

    def allgather_floats(self, values: list[float]) -> np.ndarray:
        return np.asarray(self.comm.allgather([float(v) for v in values]), dtype=np.float64)

    offset: int | None = 0     # where its buffers start past a page (sweep sets it)

    def alloc(self, count: int, dtype: str) -> np.ndarray:
        arr = placed_empty(count, dtype, self.offset)
        arr.fill(0)
        return arr

    def _op(self, redop: str) -> Any:
        M = self.MPI
        if redop == "avg":
            raise Unsupported("MPI has no avg reduction")
        return {"sum": M.SUM, "prod": M.PROD, "max": M.MAX, "min": M.MIN}[redop]

    def make(self, op: str, mode: str, count: int, per: int, dtype: str, redop: str,
             root: int) -> Case:
        c, n, r, ip, A, IP = self.comm, self.size, self.rank, mode == "ip", self.alloc, self.MPI.IN_PLACE
        if op == "all_reduce":
            rop = self._op(redop)
            if ip:
                buf = A(count, dtype)
                return Case(lambda: c.Allreduce(IP, buf, rop), buf, buf)
            s, d = A(count, dtype), A(count, dtype)
            return Case(lambda: c.Allreduce(s, d, rop), s, d)
        if op == "broadcast":
            buf = A(count, dtype)
            return Case(lambda: c.Bcast(buf, root), buf, buf)
        if op == "reduce":
            rop = self._op(redop)
            if r != root:
                s = A(count, dtype)
                return Case(lambda: c.Reduce(s, None, rop, root), s, None)
            if ip:
                buf = A(count, dtype)
                return Case(lambda: c.Reduce(IP, buf, rop, root), buf, buf)
            s, d = A(count, dtype), A(count, dtype)
            return Case(lambda: c.Reduce(s, d, rop, root), s, d)
        if op == "all_gather":
            out = A(n * per, dtype)
            if ip:
                return Case(lambda: c.Allgather(IP, out), out[r * per:(r + 1) * per], out)
            inp = A(per, dtype)
            return Case(lambda: c.Allgather(inp, out), inp, out)
        if op == "reduce_scatter":
            rop = self._op(redop)
            inp = A(n * per, dtype)
            if ip:  # MPI in place: input from the whole buffer, result in its first chunk
                return Case(lambda: c.Reduce_scatter_block(IP, inp, rop), inp, inp[:per])
            out = A(per, dtype)
            return Case(lambda: c.Reduce_scatter_block(inp, out, rop), inp, out)
        if op == "gather":
            if r != root:
                inp = A(per, dtype)
                return Case(lambda: c.Gather(inp, None, root), inp, None)
            out = A(n * per, dtype)
            if ip:
                return Case(lambda: c.Gather(IP, out, root), out[r * per:(r + 1) * per], out)
            inp = A(per, dtype)
            return Case(lambda: c.Gather(inp, out, root), inp, out)
        if op == "scatter":
            if r != root:
                out = A(per, dtype)
                return Case(lambda: c.Scatter(None, out, root), None, out)
            inp = A(n * per, dtype)
            if ip:
                return Case(lambda: c.Scatter(inp, IP, root), inp, inp[r * per:(r + 1) * per])
            out = A(per, dtype)
            return Case(lambda: c.Scatter(inp, out, root), inp, out)
        if op == "all_to_all":
            out = A(n * per, dtype)
            if ip:
                return Case(lambda: c.Alltoall(IP, out), out, out)
            inp = A(n * per, dtype)
            return Case(lambda: c.Alltoall(inp, out), inp, out)
        if op == "barrier":
            return Case(c.Barrier, None, None)
        if op == "sendrecv":
            if ip:
                raise Unsupported("sendrecv has no in-place form")
            s, d = A(count, dtype), A(count, dtype)
            dst, src = (r + 1) % n, (r - 1) % n
            return Case(lambda: c.Sendrecv(s, dst, 0, d, src, 0), s, d)
        raise Unsupported(f"unknown op {op}")

    def close(self) -> None:
        pass


class GlooBackend:
    name = "gloo"

    def __init__(self, backend: str = "gloo") -> None:
        import torch
        import torch.distributed as tdist

        if backend == "collcomm":         # the same sweep on collcomm's torch backend
            import collcomm.torch  # noqa: F401 - registers the backend
        self.torch, self.dist = torch, tdist
        tdist.init_process_group(backend=backend, init_method="env://")
        self.rank, self.size = tdist.get_rank(), tdist.get_world_size()
        self._i64 = torch.zeros(1, dtype=torch.int64)

    def barrier(self) -> None:
        self.dist.barrier()

    def bcast_int(self, value: int) -> int:
        self._i64[0] = int(value)
        self.dist.broadcast(self._i64, src=0)
        return int(self._i64[0])

    def allgather_floats(self, values: list[float]) -> np.ndarray:
        t = self.torch
        mine = t.tensor([float(v) for v in values], dtype=t.float64)
        out = [t.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(out, mine)
        return np.stack([o.numpy() for o in out])

    offset: int | None = 0     # where its buffers start past a page (sweep sets it)

    def alloc(self, count: int, dtype: str) -> tuple[np.ndarray, Any]:
        arr = placed_empty(count, dtype, self.offset)
        arr.fill(0)
        return arr, self.torch.from_numpy(arr)

    def _op(self, redop: str) -> Any:
        R = self.dist.ReduceOp
        return {"sum": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN, "avg": R.AVG}[redop]

    def make(self, op: str, mode: str, count: int, per: int, dtype: str, redop: str,
             root: int) -> Case:
        d, n, r, ip, A = self.dist, self.size, self.rank, mode == "ip", self.alloc
        if op == "all_reduce":
            a, t = A(count, dtype)
            rop = self._op(redop)
            return Case(lambda: d.all_reduce(t, op=rop), a, a)
        if op == "broadcast":
            a, t = A(count, dtype)
            return Case(lambda: d.broadcast(t, src=root), a, a)
        if op == "reduce":
            a, t = A(count, dtype)
            rop = self._op(redop)
            return Case(lambda: d.reduce(t, dst=root, op=rop), a, a if r == root else None)
        if op == "all_gather":
            out, tout = A(n * per, dtype)
            ina, tin = (out[r * per:(r + 1) * per], tout[r * per:(r + 1) * per]) if ip else A(per, dtype)
            return Case(lambda: d.all_gather_into_tensor(tout, tin), ina, out)
        if op == "reduce_scatter":
            ina, tin = A(n * per, dtype)
            rop = self._op(redop)
            out, tout = (ina[r * per:(r + 1) * per], tin[r * per:(r + 1) * per]) if ip else A(per, dtype)
            return Case(lambda: d.reduce_scatter_tensor(tout, tin, op=rop), ina, out)
        if op == "gather":
            if r != root:
                ina, tin = A(per, dtype)
                return Case(lambda: d.gather(tin, None, dst=root), ina, None)
            big, tbig = A(n * per, dtype)
            views = [tbig[i * per:(i + 1) * per] for i in range(n)]
            ina, tin = (big[r * per:(r + 1) * per], views[r]) if ip else A(per, dtype)
            return Case(lambda: d.gather(tin, views, dst=root), ina, big)
        if op == "scatter":
            if r != root:
                out, tout = A(per, dtype)
                return Case(lambda: d.scatter(tout, None, src=root), None, out)
            big, tbig = A(n * per, dtype)
            views = [tbig[i * per:(i + 1) * per] for i in range(n)]
            out, tout = (big[r * per:(r + 1) * per], views[r]) if ip else A(per, dtype)
            return Case(lambda: d.scatter(tout, views, src=root), big, out)
        if op == "all_to_all":
            out, tout = A(n * per, dtype)
            ina, tin = (out, tout) if ip else A(n * per, dtype)
            return Case(lambda: d.all_to_all_single(tout, tin), ina, out)
        if op == "barrier":
            return Case(d.barrier, None, None)
        if op == "sendrecv":
            if ip:
                raise Unsupported("sendrecv has no in-place form")
            s, ts = A(count, dtype)
            dd, td = A(count, dtype)
            dst, src = (r + 1) % n, (r - 1) % n

            def call() -> None:
                works = [d.isend(ts, dst), d.irecv(td, src)]
                for w in works:
                    w.wait()
            return Case(call, s, dd)
        raise Unsupported(f"unknown op {op}")

    def close(self) -> None:
        self.dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    lib, opts_path = argv[0], argv[1]
    out_path = argv[2] if len(argv) > 2 else None
    with open(opts_path) as fh:
        opts = Options.from_json(fh.read())
    backends = {"mpi": lambda: MPIBackend(), "gloo": lambda: GlooBackend(),
                "cc-mpi": lambda: MPIBackend("collcomm"), "cc-torch": lambda: GlooBackend("collcomm")}
    backend: Any = backends[lib]()
    try:
        rows = sweep(backend, opts, lib)
    finally:
        backend.close()
    if backend.rank == 0 and out_path:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
