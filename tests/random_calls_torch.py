"""tests/random_calls.py through ``torch.distributed`` on the collcomm backend: the same
drawn calls made as a torch program makes them (``async_op=True`` Works waited for in
batches where the rank is asynchronous: those run on the group's worker, the blocking
ones through the fast call), on torch tensors: bfloat16 in place of every other float16
call, ``PREMUL_SUM`` and torch's list forms (``all_gather``, ``reduce_scatter``,
``all_to_all``). The ranks in ``RANDOM_STRIDED_RANKS`` (a comma list) make their single tensors
every-other-element views (copied through a contiguous stand-in and back). Torch has no logical ops and
reduces complex tensors only by SUM, AVG and PREMUL_SUM: those draws become MIN, MAX,
PREMUL_SUM by 2 (floating point) or SUM. Same checks and command line: ``python -m collcomm run -n N tests/random_calls_torch.py SEED CALLS``
(``RANDOM_SHARED`` is not used here)."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_calls import Caller, Drawn, Options, _fold, _operand, drive
from tests.random_jobs import in_torch_job, main

TORCH_CALLS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_list", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_list", "all_to_all", "all_to_all_uneven", "all_to_all_list",
               "sendrecv", "barrier"]


def _op_for_torch(op: str, kind: str) -> tuple[str, float | None]:
    """(the op the fold uses, PREMUL_SUM's factor or None) for a drawn op torch lacks (the
    logical ops) or refuses (on complex tensors only SUM, AVG and PREMUL_SUM)."""
    if kind == "c":
        return ("sum", 2.0) if op == "lxor" else (op if op == "avg" else "sum", None)
    if op in ("land", "lor"):
        return ("min" if op == "land" else "max"), None
    if op == "lxor":
        return ("sum", 2.0) if kind == "f" else ("sum", None)
    return op, None


class TorchCaller(Caller):
    """Caller whose calls go through torch.distributed (backend "collcomm")."""

    def __init__(self, opts: Options) -> None:
        import torch
        import torch.distributed as dist
        super().__init__(opts, dist)
        self.torch, self.td = torch, dist
        self.strided = str(self.rank) in os.environ.get("RANDOM_STRIDED_RANKS", "").split(",")
        self.index = 0

    def tensor(self, values: np.ndarray, bf16: bool, single: bool = True) -> Any:
        """A tensor holding ``values`` (bfloat16 if ``bf16``; a strided view where asked)."""
        torch = self.torch
        src = torch.from_numpy(np.ascontiguousarray(values))
        dtype = torch.bfloat16 if bf16 else src.dtype
        if self.strided and single:
            t = torch.empty(2 * src.numel(), dtype=dtype)[::2]
        else:
            t = torch.empty(src.numel(), dtype=dtype)
        t.copy_(src)
        return t

    def read(self, t: Any) -> np.ndarray:
        return (t.float() if t.dtype == self.torch.bfloat16 else t).contiguous().numpy().reshape(-1)

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return fn(*args, async_op=self.opts.asynchronous, **kw)

    def run(self, c: Drawn, index: int) -> None:
        self.index = index
        super().run(c, index)

    def _one(self, c: Drawn, ranks: list[int], what: str) -> tuple[Any, Callable[[], None]]:
        td, torch = self.td, self.torch
        grp, n, me = self.groups[c.group], len(ranks), ranks.index(self.rank)
        k, root = c.count, c.root % n
        groot = ranks[root]
        bf16 = c.dt == np.float16 and self.index % 2 == 0
        dt = np.dtype(np.float32) if bf16 else c.dt
        op, factor = _op_for_torch(c.op, dt.kind)
        what += " bfloat16" if bf16 else ""
        if factor is not None:
            rop = td._make_nccl_premul_sum(factor)
            what += f" premul_sum({factor})"
        else:
            rop = getattr(td.ReduceOp, {"prod": "PRODUCT"}.get(op, op.upper()))
        data = lambda r, m: _operand(r, m, dt, c.op)   # noqa: E731  (the drawn op's data)
        each = lambda m: [data(r, m) * (factor or 1) for r in range(n)]   # noqa: E731
        fold = lambda parts: _fold([p.astype(dt) for p in parts], op, dt)   # noqa: E731
        t = lambda v, single=True: self.tensor(v, bf16, single)   # noqa: E731
        got: Callable[[], Any] = lambda: None   # noqa: E731
        want: np.ndarray | None = None
        inputs: list[Any] = []       # read-only input tensors, overwritten once the call is done
        w = None
        if c.name == "all_reduce":
            x = t(data(me, k))
            w = self.call(td.all_reduce, x, rop, group=grp)
            got, want = (lambda: self.read(x)), fold(each(k))
            if op == "avg" and dt.kind == "c":   # torch hands the backend view_as_real(x): the
                real = np.dtype(f"f{dt.itemsize // 2}")    # average of each float, not x / n
                want = _fold([p.astype(dt).view(real) for p in each(k)], op, real).view(dt)
        elif c.name == "reduce":
            x = t(data(me, k))
            w = self.call(td.reduce, x, groot, rop, group=grp)
            if me == root:
                got, want = (lambda: self.read(x)), fold(each(k))
            else:
                inputs.append(x)
        elif c.name == "broadcast":
            x = t(data(me, k))
            w = self.call(td.broadcast, x, groot, group=grp)
            got, want = (lambda: self.read(x)), data(root, k)
        elif c.name == "all_gather":
            out = t(np.zeros(k * n, dt), single=not c.in_place)
            if c.in_place:
                src = out[me * k:(me + 1) * k]
                src.copy_(torch.from_numpy(data(me, k)))
            else:
                src = t(data(me, k))
                inputs.append(src)
            w = self.call(td.all_gather_into_tensor, out, src, group=grp)
            got, want = (lambda: self.read(out)), np.concatenate([data(r, k) for r in range(n)])
        elif c.name == "all_gather_list":
            outs = [t(np.zeros(k, dt), single=False) for _ in range(n)]
            src = t(data(me, k))
            inputs.append(src)
            w = self.call(td.all_gather, outs, src, group=grp)
            got = lambda: np.concatenate([self.read(o) for o in outs])   # noqa: E731
            want = np.concatenate([data(r, k) for r in range(n)])
        elif c.name == "gather":
            outs = [t(np.zeros(k, dt), single=False) for _ in range(n)] if me == root else None
            mine = outs[me] if outs is not None and c.in_place else t(data(me, k))
            if mine is not None and outs is not None and c.in_place:
                mine.copy_(torch.from_numpy(data(me, k)))
            else:
                inputs.append(mine)
            w = self.call(td.gather, mine, outs, groot, group=grp)
            if me == root:
                got = lambda: np.concatenate([self.read(o) for o in outs])   # noqa: E731
                want = np.concatenate([data(r, k) for r in range(n)])
        elif c.name == "scatter":
            parts = [t(data(root, k * n)[r * k:(r + 1) * k], single=False) for r in range(n)] \
                if me == root else None
            out = parts[me] if parts is not None and c.in_place else t(np.zeros(k, dt))
            if parts is not None:
                inputs += [p for r, p in enumerate(parts) if p is not out]
            w = self.call(td.scatter, out, parts, groot, group=grp)
            got, want = (lambda: self.read(out)), data(root, k * n)[me * k:(me + 1) * k]
        elif c.name in ("reduce_scatter", "reduce_scatter_list"):
            out = t(np.zeros(k, dt))
            full = data(me, k * n)
            if c.name == "reduce_scatter":
                inputs.append(t(full))
                w = self.call(td.reduce_scatter_tensor, out, inputs[0], rop, group=grp)
            else:
                inputs += [t(full[r * k:(r + 1) * k], single=False) for r in range(n)]
                w = self.call(td.reduce_scatter, out, list(inputs), rop, group=grp)
            got, want = (lambda: self.read(out)), fold(each(k * n))[me * k:(me + 1) * k]
        elif c.name in ("all_to_all", "all_to_all_list"):
            full = data(me, k * n)
            if c.name == "all_to_all":
                out = t(np.zeros(k * n, dt))
                inputs.append(t(full))
                w = self.call(td.all_to_all_single, out, inputs[0], group=grp)
                got = lambda: self.read(out)   # noqa: E731
            else:
                outs = [t(np.zeros(k, dt), single=False) for _ in range(n)]
                inputs += [t(full[r * k:(r + 1) * k], single=False) for r in range(n)]
                w = self.call(td.all_to_all, outs, list(inputs), group=grp)
                got = lambda: np.concatenate([self.read(o) for o in outs])   # noqa: E731
            want = np.concatenate([data(r, k * n)[me * k:(me + 1) * k] for r in range(n)])
        elif c.name == "all_to_all_uneven":
            split = c.split[:n, :n]
            ins, outs_n = [int(v) for v in split[me]], [int(split[r][me]) for r in range(n)]
            out = t(np.zeros(sum(outs_n), dt))
            inputs.append(t(data(me, sum(ins))))
            w = self.call(td.all_to_all_single, out, inputs[0], outs_n, ins, group=grp)
            got = lambda: self.read(out)   # noqa: E731
            want = np.concatenate([data(r, int(split[r].sum()))[int(split[r][:me].sum()):][:outs_n[r]]
                                   for r in range(n)])
        elif c.name == "sendrecv" and n > 1:
            rb = t(np.zeros(k, dt))
            ops = [td.P2POp(td.isend, t(data(me, k)), ranks[(me + 1) % n], grp),
                   td.P2POp(td.irecv, rb, ranks[(me - 1) % n], grp)]
            for p in td.batch_isend_irecv(ops):
                p.wait()
            got, want = (lambda: self.read(rb)), data((me - 1) % n, k)
        elif c.name == "barrier":
            w = self.call(td.barrier, group=grp)
        if want is not None and bf16:
            want = self.read(torch.from_numpy(want.astype(np.float32)).to(torch.bfloat16))
        return w, self.checker(got, want, [_Overwritable(x) for x in inputs], what)


class _Overwritable:
    """An input tensor the check overwrites (``x[...] = 99`` as on a numpy array)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.dtype = tensor, np.dtype(bool) if str(tensor.dtype) == "torch.bool" else np.dtype("f4")

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tensor.fill_(value)


def run(seed: int, count: int) -> list[str]:
    """random_calls.run through torch.distributed (the backend initialised here)."""
    return in_torch_job(lambda td: drive(TorchCaller(Options.from_env(td.get_rank())), TORCH_CALLS, seed,
                                         count))


if __name__ == "__main__":
    main(run, init=False)
