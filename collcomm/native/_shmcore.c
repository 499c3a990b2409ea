/* collcomm's native shared-memory core: the arena barrier and the one-host collectives of
 * collcomm/algorithms/shm_direct.py, in C.
 *
 * This file implements *the same protocol* as the Python code, step for step: the same
 * header words (passed in by the caller, from the one layout module), the same slots and
 * page offsets, the same number of syncs, the same phases, and the same order of
 * accumulation. A rank running this code and a rank running the Python code therefore
 * work together in one arena, and give bit-identical results.
 *
 * Everything that ends in an exception stays in Python: a wait that lasts longer than
 * 100 ms calls back ``arena._check(late, target, waited)`` (which raises PeerLostError or
 * CommTimeoutError with its usual text), and a signature mismatch, a split-size mismatch
 * or a case the C code does not cover is returned as a status code that shm_direct turns
 * into the Python behaviour.
 *
 * CPython C API only (no numpy headers): buffers come in through the buffer protocol.
 *
 * One translation unit: the parts below are #included in order (each file says what it
 * holds), then this file defines the Core type and the module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

/* ------------------------------------------------------------------ status codes */
#define ST_DONE 0      /* the call is complete */
#define ST_MISMATCH 1  /* signature words differ (after the first sync): raise MismatchError */
#define ST_PYTHON 2    /* past the first sync, some rank published in place / by address:
                          the Python code finishes the call */
#define ST_PAIRS 3     /* all_to_all: the split sizes do not match (after the first sync) */
#define ST_REFUSE 4    /* nothing done (before any traffic): run the Python path instead */
#define ST_STARTED 5   /* split call, first half: staged and arrived; the second half finishes it */

/* Ready the type `t` and add it to module `m` as `name`: 0, or -1 with an exception (every
 * part's module init adds its types this way). */
static int add_type(PyObject *m, const char *name, PyTypeObject *t)
{
    if (PyType_Ready(t) < 0)
        return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the parts, in order */
#include "_dtypes.c"            /* dtype and op codes; float16/bfloat16 <-> float32 */
#include "_ndarray.c"           /* a numpy array's buffer read from its fields */
#include "_nd_view.c"           /* ... and a 1-D array over memory made by numpy's C table */
#include "_kernels.c"           /* acc (op)= other, per dtype x op; KERNELS; kernel_for */
#include "_arena_core.c"        /* Core; header words; the GIL */
#include "_arena_sync.c"        /* the counter barrier: arrive, wait_all, enter, settle */
#include "_copy_near.c"         /* copies just past their source mod 4 KiB: near_copy */
#include "_stage_nt.c"          /* large staged copies: streamed stores when asked */
#include "_cma_move.c"          /* cross-memory transfers: cma_move (a bounce buffer where slow) */
#include "_call.c"              /* one call's state, buffers, peers' data, argument parsing */
#include "_collectives_reduce.c" /* all_reduce, reduce, reduce_scatter */
#include "_cma.c"               /* cross-memory attach helpers; rooted calls split by CMA */
#include "_a2a_choice.c"        /* all_to_all / all_gather staged or by CMA: rank 0's vote */
#include "_all_gather_voted.c"  /* all_gather from ag_vote_min bytes, as rank 0 votes */
#include "_collectives_move.c"  /* broadcast, gather, barrier, settle, sync */
#include "_collectives_a2a.c"   /* all_to_all: agree on the blocks, then rounds of pieces */
#include "_scatter.c"           /* scatter: staged in steps, or split by CMA */
#include "_core_init.c"         /* Core_init, Core_dealloc, Core_members */

/* ------------------------------------------------------------------ the type */
#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))Core_##name, METH_FASTCALL, doc}
static PyMethodDef Core_methods[] = {
    FAST(all_reduce, "all_reduce(arena, buf, code, sig) -> status"),
    FAST(reduce, "reduce(arena, send, recv, code, root, sig) -> status"),
    FAST(broadcast, "broadcast(arena, buf, root, sig[, step[, cma_key, pids]]) -> status"),
    FAST(gather, "gather(arena, send, recv, root, sig[, itemsize, cma_key, pids]) -> status "
                 "(root -1: all_gather)"),
    FAST(reduce_scatter, "reduce_scatter(arena, send, recv, code, sig) -> status"),
    FAST(scatter, "scatter(arena, send, recv, root, sig[, step | itemsize, cma_key, pids]) -> "
                  "status"),
    FAST(all_to_all, "all_to_all(arena, send, send_counts, recv, recv_counts, itemsize, sig, "
                     "cma_limit) -> status"),
    FAST(barrier, "barrier(arena, sig) -> status"),
    FAST(sync, "sync(arena) -> 0: the arena's counter barrier"),
    FAST(settle, "settle(arena, block) -> None, or the signature of a call left early that "
                 "some rank made differently (see enter in _arena_sync.c)"),
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One rank's native view of a group's arena (see collcomm/native/__init__.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
};

/* ------------------------------------------------------------------ the fast call */
#include "_cmethod.c"           /* a built-in object's C method called straight */
#include "_pack_runs.c"         /* a derived datatype's message packed: pack_runs */
#include "_rec_clock.c"         /* the flight recorder's clock: rec_now */
#include "_record_rec.c"        /* the flight recorder's records made in C: Record */
#include "_record_ring.c"       /* ... the ring that holds them: Ring */
#include "_record.c"            /* ... written from C: the writer, collectives' records */
#include "_record_p2p.c"        /* ... point-to-point records */
#include "_mpi_plain_types.c"   /* the registered MPI datatypes (mpi_plain_types) */
#include "_thread_locks.c"     /* threading.Lock / RLock taken without their methods */
#include "_fastcall.c"
#include "_gil_lock.c"          /* GilLock: send_lock / poll_lock of the shm channels */
#include "_p2p.c"               /* native point-to-point: Pipe, P2P; locks, helpers */
#include "_p2p_ring.c"          /* the rings from C: pipe_record, pipe_append, pipe_recv */
#include "_p2p_calls.c"         /* P2P.send, P2P.recv, P2P.note */
#include "_p2p_type.c"          /* the two types: init, gc, methods, module init */
#include "_mpi_request.c"       /* collcomm.MPI's requests of I-forms made in C: mpi_started */
#include "_mpi_prequest.c"      /* ... and a persistent request's Start: mpi_prequest_start */
#include "_mpi_pstart.c"        /* ... persistent sends' and receives' starts, Startall */
#include "_mpi_wait_collective.c" /* ... a collective's request among them (mw_workop) */
#include "_mpi_wait.c"          /* collcomm.MPI's Waitall of native receives and sends in C */
#include "_mpi_request_wait.c"  /* ... Request.Wait, wait, Test and the class methods in C */
#include "_mpi_plain.c"         /* collcomm.MPI's buffer specs that stand for their array */

/* ------------------------------------------------------------------ module functions */
/* combine(code, acc, other): acc ⊕= other elementwise (the kernels, for tests) */
static PyObject *mod_combine(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "combine") < 0)
        return NULL;
    PARSE_LONG(code, args[0]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    if (fn == NULL) {
        PyErr_Format(PyExc_ValueError, "no native kernel for code %ld", code);
        return NULL;
    }
    Py_buffer a, b;
    if (PyObject_GetBuffer(args[1], &a, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &b, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    if (a.len != b.len || a.len % isz) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "combine: buffers of different sizes");
        return NULL;
    }
    fn(a.buf, b.buf, a.len / isz);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* set_ties(f16, f32, f64): how numpy breaks min/max ties (1: the second operand) */
static PyObject *mod_set_ties(PyObject *m, PyObject *args)
{
    int a, b, c;
    if (!PyArg_ParseTuple(args, "ppp", &a, &b, &c))
        return NULL;
    tie_second[0] = a;
    tie_second[1] = b;
    tie_second[2] = c;
    Py_RETURN_NONE;
}

/* swap_word(buffer, offset, expected, new): compare-and-swap of the aligned 8-byte word
 * at `offset` of a writable buffer (shared memory): it becomes `new` if it held `expected`.
 * Returns the word it held (== expected: swapped). Both sides of a LENT record's handover
 * (transport/shm_lent.py) use it: a Python-only rank neither lends nor takes lent records. */
static PyObject *mod_swap_word(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "swap_word") < 0)
        return NULL;
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[2]);
    if (expected == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    unsigned long long desired = PyLong_AsUnsignedLongLong(args[3]);
    if (desired == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_WRITABLE) < 0)
        return NULL;
    if (off < 0 || off > b.len - 8 || ((uintptr_t)b.buf + (uintptr_t)off) % 8) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "swap_word: offset %zd is not an aligned word of the "
                     "%zd-byte buffer", off, b.len);
        return NULL;
    }
    uint64_t held = expected;
    __atomic_compare_exchange_n((uint64_t *)((char *)b.buf + off), &held, (uint64_t)desired, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(held);
}

static PyMethodDef module_methods[] = {
    {"nd_views", (PyCFunction)(void (*)(void))mod_nd_views, METH_FASTCALL,
     "nd_views(on=None) -> bool: 1-D views made by numpy's C table (_nd_view.c); on False: as before"},
    {"swap_word", (PyCFunction)(void (*)(void))mod_swap_word, METH_FASTCALL,
     "swap_word(buffer, offset, expected, new) -> the word held (compare-and-swap)"},
    {"combine", (PyCFunction)(void (*)(void))mod_combine, METH_FASTCALL,
     "combine(code, acc, other): acc = acc (op) other, elementwise, in place"},
    {"set_ndarray", mod_set_ndarray, METH_VARARGS,
     "set_ndarray(ndarray, probes): read arrays' buffers from their fields if the probes agree"},
    {"timeout_scope", mod_timeout_scope, METH_O,
     "timeout_scope(delta): call_timeout scopes opened/closed; returns how many are open"},
    {"vote_sim", mod_vote_sim, METH_VARARGS,
     "vote_sim(bytes, staged_us, cma_us) -> rank 0's way per call on those samples (tests)"},
    {"near_copies", mod_near_copies, METH_NOARGS,
     "near_copies() -> copies just past their source taken by a vector loop (_copy_near.c)"},
    {"cma_bounces", mod_cma_bounces, METH_NOARGS,
     "cma_bounces() -> cross-memory transfers copied through a bounce buffer (_cma.c)"},
    {"record_clock", mod_record_clock, METH_NOARGS,
     "record_clock() -> (reads the TSC, seconds a tick, anchors, now): the recorder's clock"},
    {"pack_runs", (PyCFunction)(void (*)(void))mod_pack_runs, METH_FASTCALL,
     "pack_runs(memory, runs, count, extent, first, packed, to_packed): a derived type's message"},
    {"set_ties", mod_set_ties, METH_VARARGS,
     "set_ties(f16, f32, f64): min/max of equal values keeps the second operand"},
    {"obj_wait", (PyCFunction)(void (*)(void))mod_obj_wait, METH_FASTCALL,
     "obj_wait(op, native, spare) -> True (collcomm.MPI's object irecv complete) | None "
     "(the Python code goes on); see _p2p_obj_irecv.c"},
    {"mpi_request_types", (PyCFunction)(void (*)(void))mod_mpi_request_types, METH_FASTCALL,
     "mpi_request_types(workop, request, error, reraise) -> whether mpi_request and "
     "mpi_started can make them; see _mpi_request.c"},
    {"mpi_request", (PyCFunction)(void (*)(void))mod_mpi_request, METH_FASTCALL,
     "mpi_request(work, finish=None) -> Request(WorkOp(work, finish))"},
    {"mpi_started", (PyCFunction)(void (*)(void))mod_mpi_started, METH_FASTCALL,
     "mpi_started(entry, *args) -> the Request of entry(*args)'s Work, or None (declined)"},
    {"mpi_wait_native", (PyCFunction)(void (*)(void))mod_mpi_wait_native, METH_FASTCALL,
     "mpi_wait_native(requests, done, tag_bits[, native, spare]) -> how many requests it "
     "completed in order (native receives, sends done, object irecvs), or for one Request "
     "whether it did; see _mpi_wait.c"},
    {"mpi_wait_types", (PyCFunction)mod_mpi_wait_types, METH_O,
     "mpi_wait_types(prequest) -> whether mpi_wait_native / mpi_test_native complete its "
     "requests too; see _mpi_wait.c"},
    {"mpi_test_native", (PyCFunction)(void (*)(void))mod_mpi_test_native, METH_FASTCALL,
     "mpi_test_native(requests, done, tag_bits[, how]) -> True (all complete, left null) | "
     "False (one not yet) | None (the Python code decides); how 1 (any): (i, op) | False | "
     "None; how 2 (some): ([(i, op)...], all C's); see _mpi_wait.c"},
    {"lock_take", (PyCFunction)mod_lock_take, METH_O,
     "lock_take(lock) -> taken: a threading.Lock/RLock's acquire(False) the core's direct way (tests)"},
    {"lock_give", (PyCFunction)mod_lock_give, METH_O, "lock_give(lock): its release, the same way (tests)"},
    {"quick_dumps", (PyCFunction)(void (*)(void))mod_quick_dumps, METH_FASTCALL,
     "quick_dumps(obj, protocol) -> pickle.dumps(obj, protocol) for a scalar, else None; see _obj_quick.c"},
    {"quick_loads", (PyCFunction)mod_quick_loads, METH_O,
     "quick_loads(data) -> (obj,) for a pickle quick_dumps writes, else None"},
    {"mpi_plain_types", (PyCFunction)(void (*)(void))mod_mpi_plain_types, METH_FASTCALL,
     "mpi_plain_types(datatype_class, [(type, dtype), ...]) -> whether mpi_plain knows them"},
    {"mpi_plain", (PyCFunction)(void (*)(void))mod_mpi_plain, METH_FASTCALL,
     "mpi_plain(spec, per, writable) -> the array a buffer spec stands for as it is, else "
     "the spec; see _mpi_plain.c"},
    {"mpi_quick_setup", (PyCFunction)(void (*)(void))mod_mpi_quick_setup, METH_FASTCALL,
     "mpi_quick_setup(py_send, py_recv, orphans, sent, ndarray, deferred, native_recv, request); "
     "see _mpi_pstart.c"},
    {"mpi_quick_send", (PyCFunction)(void (*)(void))mod_mpi_quick_send, METH_FASTCALL,
     "mpi_quick_send(h, g0, buf, dest, tag) -> a persistent send's start: its op, or None"},
    {"mpi_quick_recv", (PyCFunction)(void (*)(void))mod_mpi_quick_recv, METH_FASTCALL,
     "mpi_quick_recv(h, g0, buf, source, tag, mask) -> a persistent receive's start: its op, or None"},
    {"mpi_prequest_startall", (PyCFunction)(void (*)(void))mod_mpi_prequest_startall, METH_FASTCALL | METH_KEYWORDS,
     "mpi_prequest_startall(cls, requests): each request's Start, in order"},
    {"mpi_plain2", (PyCFunction)(void (*)(void))mod_mpi_plain2, METH_FASTCALL,
     "mpi_plain2(sendbuf, recvbuf, send_per, recv_per) -> both buffers through mpi_plain "
     "(the receive buffer as written)"},
    {"mpi_workop_started", (PyCFunction)(void (*)(void))mod_mpi_workop_started, METH_FASTCALL,
     "mpi_workop_started(entry, *args) -> the WorkOp of entry(*args)'s Work, or None"},
    {"mpi_request_waits", (PyCFunction)(void (*)(void))mod_mpi_request_waits, METH_FASTCALL,
     "mpi_request_waits(request, python_methods, done, tag_bits, pickle, spare, orphans, reap, "
     "error, waitsome_rest) -> (Wait, wait, Test, Waitall, Testall, Waitany, Waitsome) in C, or None"},
    {"mpi_prequest_start", (PyCFunction)(void (*)(void))mod_mpi_prequest_start, METH_FASTCALL,
     "mpi_prequest_start(prequest, persistent, start) -> Prequest.Start in C (a method "
     "descriptor of prequest), or None; see _mpi_prequest.c"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_shmcore",
    "collcomm's native shared-memory core (see collcomm/native/__init__.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__shmcore(void)
{
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    s_check = PyUnicode_InternFromString("_check");
    s_timeout = PyUnicode_InternFromString("timeout");
    if (s_check == NULL || s_timeout == NULL || thread_locks_init() < 0 ||
        PyModule_AddIntConstant(m, "RLOCK_DIRECT", rlock_type != NULL) < 0 ||
        PyModule_AddIntConstant(m, "SEM_DIRECT", sem_direct) < 0 || fast_module_init(m) < 0 ||
        p2p_module_init(m) < 0 || gil_lock_module_init(m) < 0 || mpi_waits_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddIntConstant(m, "DONE", ST_DONE) < 0 ||
        PyModule_AddIntConstant(m, "MISMATCH", ST_MISMATCH) < 0 ||
        PyModule_AddIntConstant(m, "PYTHON", ST_PYTHON) < 0 ||
        PyModule_AddIntConstant(m, "PAIRS", ST_PAIRS) < 0 ||
        PyModule_AddIntConstant(m, "REFUSE", ST_REFUSE) < 0 ||
        PyModule_AddIntConstant(m, "NT_MIN", (long)NT_MIN) < 0 ||
        PyModule_AddIntConstant(m, "CMA_KEY", CMA_KEY) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
