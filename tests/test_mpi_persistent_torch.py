"""A persistent collective or receive on torch tensors reads the tensor anew at each
``Start`` (collcomm.MPI binds numpy buffers once, at ``…_init``, but not tensors: their
storage may be freed and remade between ``Start``s, as FSDP does, and a lazily conjugated
one holds other values at each ``Start``), in one process (``COMM_SELF``)."""
from __future__ import annotations

import pytest

from collcomm import MPI

torch = pytest.importorskip("torch")


pytestmark = pytest.mark.usefixtures("world_of_one_left_closed")

def test_storage_remade_between_starts() -> None:
    send, recv = torch.ones(4), torch.zeros(4)
    p = MPI.COMM_SELF.Allreduce_init(send, recv)
    p.Start()
    p.Wait()
    assert recv.tolist() == [1.0] * 4
    storage = recv.untyped_storage()
    size = storage.nbytes()
    storage.resize_(0)                   # (FSDP frees a parameter's storage, then remakes it)
    storage.resize_(size)
    recv.zero_()
    send.fill_(3.0)
    p.Start()
    p.Wait()
    assert recv.tolist() == [3.0] * 4
    p.Free()


def test_lazy_conjugate_read_at_each_start() -> None:
    src = torch.tensor([1 + 1j, 2 - 1j])
    out = torch.zeros(2, dtype=torch.complex64)
    p = MPI.COMM_SELF.Allreduce_init(src.conj(), out)
    for k in (1, 2, 3):
        src.mul_(k)
        p.Start()
        p.Wait()
        assert out.tolist() == src.conj().tolist()
    p.Free()


def test_persistent_receive_into_a_tensor_remade() -> None:
    got = torch.zeros(2)
    r = MPI.COMM_SELF.Recv_init(got, 0, 5)
    s = MPI.COMM_SELF.Send_init(torch.full((2,), 7.0), 0, 5)
    storage = got.untyped_storage()
    size = storage.nbytes()
    storage.resize_(0)
    storage.resize_(size)
    got.zero_()
    MPI.Prequest.Startall([r, s])
    MPI.Request.Waitall([r, s])
    assert got.tolist() == [7.0, 7.0]
    r.Free()
    s.Free()
