"""The torch backend's per-call shortcuts (collcomm/torch/tensors.py, work.py), in-process.

``call_array`` (a blocking fast call's numpy view of a tensor, kept by address, element
count and dtype instead of a ``tensor.numpy()`` per call) must always view exactly the
tensor it is given, refuse what ``fast_array`` refuses, and never keep a tensor alive;
``fast_op`` reads a ``ReduceOp`` by its hash; ``done`` is the blocking calls' completed
``Work``. No process is started: these are the pieces, test_torch_fast.py the calls.
"""
from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from collcomm.ops import ReduceOp  # noqa: E402
from collcomm.torch import tensors  # noqa: E402
from collcomm.torch.tensors import call_array, fast_array, fast_op  # noqa: E402
from collcomm.torch.work import DoneWork, done  # noqa: E402


def _views(t: Any, arr: np.ndarray) -> bool:
    """``arr`` is exactly ``t``'s memory, as numpy()'s dtype, flat or in t's shape."""
    return (arr.ctypes.data == t.data_ptr() and arr.size == t.numel()
            and arr.dtype == t.numpy().dtype and arr.flags.writeable)


def _kept(t: Any) -> np.ndarray:
    """call_array(t) once the table keeps t's key (its second sighting keeps it)."""
    call_array(t)
    call_array(t)
    arr = call_array(t)
    assert arr is not None and arr.base is not None and not isinstance(arr.base, torch.Tensor)
    return arr


def test_call_array_views_exactly_the_tensor_given() -> None:
    t = torch.arange(6, dtype=torch.float32)
    arr = _kept(t)
    assert _views(t, arr)
    arr[2] = 40.0                                   # writes land in the tensor
    assert t[2].item() == 40.0
    assert call_array(t) is arr                     # kept: no numpy() per call
    # the same address under another dtype or size is another key
    as_int = t.view(torch.int32)
    assert _views(as_int, call_array(as_int)) and call_array(as_int).dtype == np.int32
    head = t[:3]
    assert _views(head, call_array(head)) and call_array(head).size == 3
    # the tensor's memory changes under it (numpy() made its storage unresizable): its new
    # address is a new key
    t.set_(torch.zeros(6))
    assert _views(t, call_array(t))
    t.data = torch.zeros(9, dtype=torch.float64)
    assert _views(t, call_array(t)) and call_array(t).dtype == np.float64


def test_call_array_refuses_what_fast_array_refuses_at_a_kept_address() -> None:
    c = torch.arange(6, dtype=torch.float32).to(torch.complex64)
    _kept(c)
    assert call_array(c.conj()) is None             # same address, lazy conj bit
    assert fast_array(c.conj()) is None
    f = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    _kept(f)
    assert call_array(f.t()) is None                # same address and size, not contiguous
    assert call_array(torch._neg_view(f)) is None
    g = torch.ones(4, requires_grad=True)
    assert call_array(g) is None and fast_array(g) is None
    _kept(g.detach())
    assert call_array(g) is None                    # its detached twin is kept: still refused
    b = torch.ones(4, dtype=torch.bfloat16)
    assert call_array(b) is None and call_array(b) is None
    assert call_array(torch.nn.Parameter(torch.ones(3))) is None   # a subclass
    assert call_array(torch.ones(3, device="meta")) is None
    assert call_array([1.0]) is None
    e = torch.ones(0)
    assert call_array(e) is not None and call_array(e).size == 0


def test_call_array_keeps_no_tensor_alive_and_no_numpy_per_call(monkeypatch: Any) -> None:
    t = torch.ones(5)
    _kept(t)
    calls = []
    real = torch.Tensor.numpy

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "numpy", counting)
    arrs = [call_array(t) for _ in range(20)]
    assert not calls and all(a is arrs[0] for a in arrs)
    monkeypatch.undo()
    assert _views(t, arrs[0])
    del arrs
    gone = weakref.ref(t)
    del t
    gc.collect()
    assert gone() is None


def test_call_array_tables_stay_bounded() -> None:
    keep = [torch.ones(3) for _ in range(tensors.CALL_ARRAYS_MAX + 10)]
    for t in keep:
        call_array(t)
        call_array(t)
    assert len(tensors._CALL_ARRAYS) <= tensors.CALL_ARRAYS_MAX
    assert len(tensors._SEEN) <= tensors.SEEN_MAX
    for t in keep[-5:]:
        assert _views(t, call_array(t))


def test_fast_op_reads_every_reduce_op() -> None:
    R = dist.ReduceOp.RedOpType
    want = {R.SUM: ReduceOp.SUM, R.AVG: None, R.PRODUCT: ReduceOp.PRODUCT, R.MIN: ReduceOp.MIN,
            R.MAX: ReduceOp.MAX, R.BAND: ReduceOp.BAND, R.BOR: ReduceOp.BOR, R.BXOR: ReduceOp.BXOR}
    assert tensors._HASH_IS_KIND
    for kind, op in want.items():
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(kind)
        assert fast_op(opts.reduceOp) is op, kind
        assert fast_op(kind) is op, kind            # a RedOpType as it is
    assert fast_op(dist._make_nccl_premul_sum(2.0)) is None
    assert fast_op("SUM") is None


def test_done_work_is_a_completed_work_with_its_outputs() -> None:
    out = [torch.ones(2)]
    w = done("all_reduce", out)
    assert isinstance(w, DoneWork) and isinstance(w, dist.Work)
    assert w.wait() and w.is_completed() and w.is_success() and w.exception() is None
    assert w.result() is out
    fut = w.get_future()
    assert fut.done() and fut.value() is out and w.get_future() is fut
    assert "all_reduce done" in repr(w)
    with pytest.raises(RuntimeError, match="source rank"):
        w.source_rank()
