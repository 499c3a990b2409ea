"""collcomm.MPI has every public name mpi4py's MPI module and classes have (mpi4py imported
without initializing MPI: ``mpi4py.rc.initialize = False``; skipped without mpi4py), and
the names added for that do what mpi4py's do, in one process (a world of one)."""
from __future__ import annotations

import pytest

from collcomm import MPI

CLASSES = ["Comm", "Intracomm", "Cartcomm", "Graphcomm", "Distgraphcomm", "Topocomm", "Datatype", "Op",
           "Group", "Info", "Request", "Prequest", "Status", "Message", "Errhandler", "Exception", "Pickle",
           "buffer"]     # (Win, File, Session, Intercomm, Grequest: names only, every call unsupported)


pytestmark = pytest.mark.usefixtures("world_of_one_left_closed")

def test_every_name_of_mpi4py() -> None:
    mpi4py = pytest.importorskip("mpi4py")
    mpi4py.rc.initialize = False
    from mpi4py import MPI as M
    missing = [n for n in dir(M) if not n.startswith("_") and not hasattr(MPI, n)]
    for cls in CLASSES:
        if hasattr(M, cls):
            missing += [f"{cls}.{n}" for n in dir(getattr(M, cls))
                        if not n.startswith("_") and not hasattr(getattr(MPI, cls), n)]
    assert not missing


def test_integer_handles_round_trip() -> None:
    assert (MPI.COMM_WORLD.py2f(), MPI.COMM_SELF.py2f(), MPI.COMM_NULL.py2f()) == (0, 1, 2)
    assert MPI.Comm.f2py(0) == MPI.COMM_WORLD and isinstance(MPI.Intracomm.fromint(1), MPI.Intracomm)
    pair = MPI.INT.Create_contiguous(2)
    for handle in (MPI.COMM_WORLD, pair, MPI.DOUBLE, MPI.SUM, MPI.GROUP_EMPTY, MPI.INFO_ENV,
                   MPI.ERRORS_RETURN, MPI.DATATYPE_NULL, MPI.OP_NULL, MPI.INFO_NULL, MPI.GROUP_NULL,
                   MPI.MESSAGE_NULL, MPI.MESSAGE_NO_PROC):
        cls = type(handle)
        assert cls.f2py(handle.py2f()) == handle and cls.fromhandle(handle.handle) == handle
        assert handle.toint() == handle.py2f() and isinstance(handle.py2f(), int)
    assert pair.py2f() == MPI.Datatype(pair).py2f() != MPI.INT.py2f()
    with pytest.raises(MPI.Exception):
        MPI.Datatype.f2py(10 ** 9)
    dup = MPI.COMM_SELF.Dup()
    dup.Free()
    assert dup.py2f() == MPI.COMM_NULL.py2f() == 2        # (a freed communicator is COMM_NULL)
    p = MPI.COMM_SELF.Recv_init(bytearray(1), 0, 1)
    copy = MPI.Prequest.f2py(p.py2f())
    assert p.py2f() != MPI.REQUEST_NULL.py2f() and type(copy) is MPI.Prequest and bool(copy)
    p.Free()
    assert p.py2f() == 0
    st = MPI.Status()
    st.source, st.tag, st.count = 3, 4, (1 << 33) + 5
    back = MPI.Status.f2py(st.py2f())
    assert len(st.py2f()) == MPI.F_STATUS_SIZE and (back.source, back.tag, back.count) == (3, 4, (1 << 33) + 5)


def test_get_status_leaves_requests_active() -> None:
    comm = MPI.COMM_SELF
    got = bytearray(3)
    r = comm.Irecv(got, 0, 7)
    assert MPI.Request.Get_status_all([r]) is False and MPI.Request.get_status_any([r]) == (MPI.UNDEFINED, False)
    assert MPI.Request.Get_status_some([r]) == []
    comm.Send(b"abc", 0, 7)
    statuses = [MPI.Status()]
    while not MPI.Request.Get_status_all([r, MPI.REQUEST_NULL], statuses + [MPI.Status()]):
        pass
    assert bool(r) and statuses[0].Get_tag() == 7 and statuses[0].Get_count(MPI.BYTE) == 3
    st = MPI.Status()
    assert MPI.Request.get_status_any([MPI.REQUEST_NULL, r], st) == (1, True) and st.Get_source() == 0
    assert MPI.Request.get_status_some([r]) == [0] and bool(r)     # (still active)
    assert r.Wait() and not r and bytes(got) == b"abc"
    assert MPI.Request.Get_status_any([r]) == (MPI.UNDEFINED, True)
    assert MPI.Request.Get_status_some([r]) is None


def test_error_classes_the_program_adds() -> None:
    cls = MPI.Add_error_class()
    code = MPI.Add_error_code(cls)
    MPI.Add_error_string(code, "the cache is cold")
    assert cls > MPI.ERR_LASTCODE and code > cls and MPI.Get_error_class(code) == cls
    assert MPI.Get_error_string(code) == "the cache is cold"
    assert MPI.COMM_WORLD.Get_attr(MPI.LASTUSEDCODE) >= code
    err = MPI.Exception(code)
    assert err.Get_error_class() == cls and "the cache is cold" in str(err)
    with pytest.raises(MPI.Exception):
        MPI.Add_error_string(MPI.ERR_RANK, "no")
    with pytest.raises(MPI.Exception):
        MPI.Remove_error_class(cls)              # (it still has a code)
    MPI.Remove_error_string(code)
    MPI.Remove_error_code(code)
    MPI.Remove_error_class(cls)
    with pytest.raises(MPI.Exception):
        MPI.Get_error_class(code)


def test_datatype_extras() -> None:
    assert MPI.Datatype.Match_size(MPI.TYPECLASS_REAL, 8).Get_name() == "MPI_REAL8"
    assert MPI.Datatype.Match_size(MPI.TYPECLASS_INTEGER, 4).Get_name() == "MPI_INTEGER"
    assert MPI.Datatype.Match_size(MPI.TYPECLASS_COMPLEX, 16).Get_name() == "MPI_COMPLEX16"
    with pytest.raises(MPI.Exception):
        MPI.Datatype.Match_size(MPI.TYPECLASS_REAL, 2)
    real = MPI.Datatype.Create_f90_real(15, 300)
    assert real.Get_size() == 8 and real.envelope == (2, 0, 0, 0, MPI.COMBINER_F90_REAL)
    assert MPI.Datatype.Create_f90_integer(9).Get_size() == 4 and MPI.Datatype.Create_f90_complex(6, 30).Get_size() == 8
    assert MPI.INT.envelope == (0, 0, 0, 0, MPI.COMBINER_NAMED)
    vec = MPI.DOUBLE.Create_vector(2, 1, 3)
    assert vec.contents == ([2, 1, 3], [], [], [MPI.DOUBLE])
    key = MPI.Datatype.Create_keyval()
    dup = MPI.INT.Dup()
    dup.Set_attr(key, "mine")
    assert MPI.Datatype(dup).Get_attr(key) == "mine" and MPI.INT.Get_attr(key) is None
    dup.Delete_attr(key)
    assert dup.Get_attr(key) is None
    MPI.Datatype.Free_keyval(key)


def test_small_names() -> None:
    info = MPI.Info.Create({"a": "1", "b": "2"})
    assert info.popitem() == ("b", "2") and info.Get_nkeys() == 1
    assert isinstance(MPI.IN_PLACE, MPI.InPlaceType) and isinstance(MPI.BOTTOM, MPI.BottomType)
    assert not isinstance(MPI.BOTTOM, MPI.InPlaceType) and isinstance(MPI.BUFFER_AUTOMATIC, MPI.BufferAutomaticType)
    assert MPI.COMM_WORLD.Iflush_buffer().Test() and MPI.DISP_CUR == MPI.DISPLACEMENT_CURRENT
    assert MPI.REAL16 == MPI.DATATYPE_NULL and MPI.INTEGER16 == MPI.DATATYPE_NULL
    mem = MPI.Alloc_mem(8)
    assert mem.tobytes() == bytes(8) and mem.toreadonly().readonly and mem.cast("i").tolist() == [0, 0]
    assert MPI.MESSAGE_NULL.free() is None
    for call in (lambda: MPI.COMM_WORLD.Agree(1), lambda: MPI.COMM_WORLD.Psend_init(b"", 1, 0, 0),
                 lambda: MPI.Get_abi_version(), lambda: MPI.Status().tomemory(),
                 lambda: MPI.buffer.fromaddress(0, 8)):
        with pytest.raises(NotImplementedError):
            call()
