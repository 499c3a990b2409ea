"""Derived datatypes under mpi4py + Open MPI and under collcomm.MPI (tests/test_mpi_datatypes.py
runs it both ways on 3 ranks and compares the JSON lines): ``python prog.py mpi4py|collcomm``.
Reductions on derived types are left out: Open MPI refuses predefined ops on them."""
import json
import sys

import numpy as np

if sys.argv[1] == "mpi4py":
    from mpi4py import MPI
else:
    from collcomm import MPI

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
D = MPI.DOUBLE
out = {"rank": r}


def L(a):
    return np.asarray(a).tolist()


def err(f):
    try:
        f()
        return "no error"
    except MPI.Exception as e:
        return ["MPI.Exception", e.Get_error_class()]
    except Exception as e:  # noqa: BLE001
        return type(e).__name__


# one rank, through COMM_SELF: layouts, packing, statuses, recipes
me = MPI.COMM_SELF
a = np.arange(16.0)
col = D.Create_vector(4, 1, 4).Commit()
sub = D.Create_subarray([4, 4], [2, 2], [1, 1]).Commit()
subf = D.Create_subarray([4, 3], [2, 2], [1, 1], order=MPI.ORDER_F).Commit()
idx = MPI.INT.Create_indexed([2, 1], [3, 0]).Commit()
st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, D]).Commit()
o = np.zeros(4); me.Sendrecv([a, 1, col], 0, 0, o, 0, 0); out["col"] = L(o)
o = np.zeros(16); me.Sendrecv(np.arange(4.0) + 100, 0, 0, [o, 1, sub], 0, 0); out["sub_recv"] = L(o)
o = np.zeros(4); me.Sendrecv([np.arange(12.0), 1, subf], 0, 0, o, 0, 0); out["subf"] = L(o)
o = np.zeros(6, "i"); me.Sendrecv([np.arange(12, dtype="i"), 2, idx], 0, 0, o, 0, 0); out["idx"] = L(o)
rec = np.dtype({"names": ["i", "d"], "formats": ["i4", "f8"], "offsets": [0, 8], "itemsize": 16})
src, dst = np.zeros(3, dtype=rec), np.zeros(3, dtype=rec)
src["i"], src["d"] = [1, 2, 3], [0.5, 1.5, 2.5]
me.Sendrecv([src, st], 0, 0, [dst, st], 0, 0); out["struct"] = [dst["i"].tolist(), dst["d"].tolist()]
types = (col, sub, subf, idx, st)
out["bounds"] = [[t.Get_extent(), t.Get_true_extent(), t.Get_size()] for t in types]
rz = col.Create_resized(0, 8).Commit()
o = np.zeros(16); me.Sendrecv([np.arange(8.0), 2, D], 0, 0, [o, 2, rz], 0, 0); out["resized_recv"] = L(o)
s = MPI.Status(); me.Isend([a, 1, col], 0, 3); me.Probe(0, 3, s)
out["counts"] = [s.Get_count(col), s.Get_count(D), s.Get_elements(col), s.Get_count(sub)]
me.Recv(np.zeros(4), 0, 3)
buf = bytearray(100); p = col.Pack(a[:13], buf, 0, me); out["pack"] = [p, L(np.frombuffer(bytes(buf[:p])))]
o = np.zeros(13); q = col.Unpack(buf, 0, o, me); out["unpack"] = [q, L(o)]
out["pack_size"] = [col.Pack_size(3, me), st.Pack_size(2, me)]
b2 = bytearray(64); p = MPI.INT.Pack_external("external32", np.arange(3, dtype="i"), b2, 0)
out["external32"] = [p, list(b2[:p]), MPI.INT.Pack_external_size("external32", 3)]
o = np.zeros(3, "i"); MPI.INT.Unpack_external("external32", bytes(b2[:p]), 0, o); out["unpack_external"] = L(o)
pair = np.dtype([("v", "f8"), ("i", "i4")], align=True)
bp = bytearray(64)
p = MPI.DOUBLE_INT.Pack(np.array([(1.5, 7), (-2.0, 9)], dtype=pair), bp, 0, me)
out["pack_pairs"] = [p, list(bp[:p]), MPI.DOUBLE_INT.Pack_size(2, me), MPI.SHORT_INT.Pack_size(3, me)]
src2 = np.zeros(2, dtype=rec); src2["i"], src2["d"] = [1, -2], [0.25, 3.0]
p = st.Pack_external("external32", src2, bp, 0); out["external32_struct"] = [p, list(bp[:p])]
rev = D.Create_vector(4, 1, -1).Commit()
o = np.zeros(4); me.Sendrecv([np.arange(8.0)[3:], 1, rev], 0, 0, o, 0, 0); out["reversed_on_view"] = L(o)
stwo = MPI.Datatype.Create_struct([1, 2], [0, 8], [MPI.INT, D]).Commit()
s = MPI.Status(); me.Sendrecv([src, 1, st], 0, 0, [np.zeros(4), 1, stwo], 0, 0, s)
out["partial_struct"] = [s.Get_elements(stwo), s.Get_count(stwo), s.Get_count()]
out["typecodes"] = [col.typechar, col.typestr, D.Create_contiguous(2).typechar]
out["decode"] = [col.decode()[1:], sub.decode()[1:], rz.decode()[1:], col.Get_envelope(), sub.Get_contents()[0],
                 col.combiner, MPI.COMBINER_VECTOR, MPI.COMBINER_STRUCT, MPI.COMBINER_RESIZED]
out["errors"] = [err(lambda: D.Create_vector(-1, 1, 1)), err(lambda: D.Create_subarray([4], [5], [0])),
                 err(lambda: me.Send([a, 1, D.Create_vector(2, 1, 2)], 0, 9)),
                 err(lambda: me.Sendrecv([a, col], 0, 0, o, 0, 0))]

# 3 ranks: halo exchange on a periodic ring
cart = comm.Create_cart([n], periods=[True])
left, right = cart.Shift(0, 1)
rows, cols = 4, 5
grid = np.full((rows, cols + 2), -1.0); grid[:, 1:-1] = r * 100 + np.arange(rows * cols).reshape(rows, cols)
def colat(j): return D.Create_subarray([rows, cols + 2], [rows, 1], [0, j]).Commit()
gcol = D.Create_vector(rows, 1, cols + 2).Commit()
cart.Sendrecv([grid, 1, colat(cols)], right, 0, [grid, 1, colat(0)], left, 0)
MPI.Request.Waitall([cart.Irecv([grid, 1, colat(cols + 1)], right, 1), cart.Isend([grid.reshape(-1)[1:], 1, gcol], left, 1)])
out["halo"] = L(grid)
# Scatterv / Gatherv of column blocks through a resized subarray
N = 2 * n
glob = np.arange(N * 2.0 * n).reshape(N, 2 * n) if r == 0 else None
blk = D.Create_subarray([N, 2 * n], [N, 2], [0, 0]).Create_resized(0, 8).Commit()
mine = np.zeros((N, 2))
comm.Scatterv([glob, [1] * n, [2 * i for i in range(n)], blk] if r == 0 else None, mine, root=0)
out["scatterv_blocks"] = L(mine)
back = np.zeros((N, 2 * n)) if r == 0 else None
comm.Gatherv(mine * 10, [back, [1] * n, [2 * i for i in range(n)], blk] if r == 0 else None, root=0)
out["gatherv_blocks"] = L(back) if r == 0 else None
# struct records: Bcast, Allgather, Gather
rec3 = np.dtype({"names": ["id", "x", "tag"], "formats": ["i4", "f8", "S3"], "offsets": [0, 8, 16], "itemsize": 24})
st3 = MPI.Datatype.Create_struct([1, 1, 3], [0, 8, 16], [MPI.INT, D, MPI.CHAR]).Commit()
recs = np.zeros(2, dtype=rec3)
if r == 1:
    recs["id"], recs["x"], recs["tag"] = [7, 8], [0.5, 1.5], [b"abc", b"xyz"]
comm.Bcast([recs, st3], root=1)
out["bcast_struct"] = [recs["id"].tolist(), recs["x"].tolist(), [t.decode() for t in recs["tag"]]]
one = np.zeros(1, dtype=rec3); one["id"] = r; one["x"] = r / 2; one["tag"] = b"r%d" % r
allr = np.zeros(n, dtype=rec3)
comm.Allgather([one, st3], [allr, st3])
out["allgather_struct"] = [allr["id"].tolist(), allr["x"].tolist()]
g = np.zeros(n, dtype=rec3) if r == 2 else None
comm.Gather([one, st3], [g, st3] if r == 2 else None, root=2)
out["gather_struct"] = g["id"].tolist() if r == 2 else None
# Alltoallw transpose with subarray types
m = 2
A = (np.arange(m * m * n, dtype="f8") + 1000 * r).reshape(m, m * n)
B = np.zeros((m * n, m))
stypes = [D.Create_subarray([m, m * n], [m, m], [0, m * j]).Commit() for j in range(n)]
rtypes = [D.Create_subarray([m * n, m], [m, m], [m * j, 0]).Commit() for j in range(n)]
comm.Alltoallw([A, [1] * n, [0] * n, stypes], [B, [1] * n, [0] * n, rtypes])
out["alltoallw_sub"] = L(B)
# Alltoall into a resized vector, Scatter from one, Allgatherv into columns
v = D.Create_vector(2, 1, n).Create_resized(0, 8).Commit()
y = np.zeros(2 * n)
comm.Alltoall([np.arange(2.0 * n) + 10 * r, 2, D], [y, 1, v])
out["alltoall_vec"] = L(y)
z = np.zeros(2)
comm.Scatter([np.arange(2.0 * n), 1, v] if r == 0 else None, z, root=0)
out["scatter_vec"] = L(z)
gv = np.zeros((2, n + 1))
cv = D.Create_vector(2, 1, n + 1).Create_resized(0, 8).Commit()
comm.Allgatherv(np.array([r, -r], dtype=float), [gv, [1] * n, list(range(n)), cv])
out["allgatherv_col"] = L(gv)
# Sendrecv_replace of a column, probe counts, Recv, Mprobe into an indexed type, Recv_init
w = np.arange(12.0).reshape(4, 3) + 100 * r
col3 = D.Create_vector(4, 1, 3).Commit()
comm.Sendrecv_replace([w.reshape(-1)[1:], 1, col3], (r + 1) % n, 5, (r - 1) % n, 5)
out["sendrecv_replace"] = L(w)
st2 = MPI.Status()
comm.Isend([w, 1, col3], (r + 1) % n, 6)
comm.Probe((r - 1) % n, 6, st2)
out["probe_counts"] = [st2.Get_count(col3), st2.Get_elements(col3), st2.Get_count(D)]
rv = np.zeros((4, 3))
comm.Recv([rv, 1, col3], (r - 1) % n, 6, st2)
out["recv_col"] = [L(rv), st2.Get_count(col3)]
ix = MPI.INT.Create_indexed([1, 2], [4, 0]).Commit()
comm.Send([np.arange(6, dtype="i") + 10 * r, 1, ix], (r + 1) % n, 7)
msg = comm.Mprobe((r - 1) % n, 7)
ri = np.full(6, -1, dtype="i")
msg.Recv([ri, 1, ix])
out["mrecv_idx"] = L(ri)
pr = comm.Recv_init([rv, 1, col3], (r - 1) % n, 8)
for k in range(2):
    pr.Start(); comm.Send(np.full(4, float(k * 10 + r)), (r + 1) % n, 8); pr.Wait()
out["persistent_col"] = L(rv)
for t in (rev, stwo, col, sub, subf, idx, st, rz, gcol, blk, st3, v, cv, col3, ix, *stypes, *rtypes):
    t.Free()
print("JSON " + json.dumps(out, sort_keys=True), flush=True)
