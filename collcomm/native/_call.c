/* The plumbing every native collective call shares.
 *
 * Included by _shmcore.c. A ``Call`` carries one call's state: the arena's phase
 * (advanced locally, written back by call_end together with the counter), the GIL state,
 * and the caller's buffers (released by call_end). Also the helpers for a peer's staged
 * data (checked against its slot), the split of a count into per-rank slices, and the
 * argument parsing of the METH_FASTCALL entries.
 */

typedef struct {
    Core *c;
    PyObject *arena;
    int phase;             /* the arena's phase, advanced locally, written back at the end */
    Gil gil;
    Py_buffer bufs[2];
    int nbufs;
    Handed handed[2];      /* the fast call's views (taken from the Core by call_begin) */
} Call;

static int call_begin(Call *k, Core *c, PyObject *arena)
{
    k->c = c;
    k->arena = arena;
    k->gil.ts = NULL;
    k->nbufs = 0;
    k->phase = (int)(get(c, c->rank, c->w_phase) & 1);   /* shared with the Python code */
    k->handed[0] = c->handed[0];
    k->handed[1] = c->handed[1];
    c->handed[0].obj = c->handed[1].obj = NULL;
    return 0;
}

static inline int next_phase(Call *k)
{
    k->phase ^= 1;
    return k->phase;
}

/* A C-contiguous buffer of `obj` (writable if asked; the fast call's view of it when it
 * handed one); NULL data for None; -1 (no exception: the caller refuses the call, before
 * any traffic) if there is none. */
static int get_buffer(Call *k, PyObject *obj, int writable, char **data, Py_ssize_t *len)
{
    if (obj == Py_None) {
        *data = NULL;
        *len = 0;
        return 0;
    }
    for (int i = 0; i < 2; i++)
        if (k->handed[i].obj == obj && (k->handed[i].writable || !writable)) {
            *data = k->handed[i].data;        /* held by the fast call until we return */
            *len = k->handed[i].len;
            return 0;
        }
    Py_buffer *view = &k->bufs[k->nbufs];
    if (nd_buffer(obj, view, writable ? (PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
                                               : PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();   /* not contiguous, read-only, ...: the Python code says what is wrong */
        return -1;
    }
    k->nbufs++;
    *data = (char *)view->buf;
    *len = view->len;
    return 0;
}

/* Write back this rank's phase (a header word the Python Arena reads too), release the
 * buffers; `status` < 0 means an exception is pending (kept). */
static PyObject *call_end(Call *k, int status)
{
    put(k->c, k->c->w_phase, (uint64_t)k->phase);
    gil_take(&k->gil);
    for (int i = 0; i < k->nbufs; i++)
        PyBuffer_Release(&k->bufs[i]);
    if (status < 0)
        return NULL;
    if (status == ST_DONE)
        k->c->done++;
    else if (status == ST_PYTHON)
        k->c->finished++;
    return PyLong_FromLong(status);
}

static inline Py_ssize_t page_offset(Core *c, const char *data, Py_ssize_t nbytes)
{
    /* shm_stage._offset: match the buffer's page offset only for large copies */
    return nbytes < c->one_shot ? 0 : (Py_ssize_t)((uintptr_t)data % (uintptr_t)c->page);
}

/* shm_stage.stage: copy `nbytes` of `data` into our slot of `phase` at its page offset
 * and announce the offset (with `mark_staged`, also SHARED = 0: the data is in the slot,
 * not published in place); large copies run without the GIL. Returns our staged copy. */
static char *stage(Call *k, int phase, const char *data, Py_ssize_t nbytes, int mark_staged)
{
    Core *c = k->c;
    Py_ssize_t off = page_offset(c, data, nbytes);
    if (mark_staged)
        put(c, c->w_shared + phase, 0);
    put(c, c->w_offset + phase, (uint64_t)off);
    char *mine = slot_at(c, phase, c->rank) + off;
    if (nbytes > c->one_shot)
        gil_release(&k->gil);
    staged_copy(c, mine, data, nbytes);
    return mine;
}

/* Rank r's staged data of this phase, at the offset it announced; NULL if that offset
 * would not fit the slot (a corrupt header: raise rather than read out of bounds). */
static char *peer(Call *k, int phase, int r, Py_ssize_t nbytes)
{
    Core *c = k->c;
    uint64_t off = get(c, r, c->w_offset + phase);
    if (off >= (uint64_t)c->page || (Py_ssize_t)off + nbytes > c->stride) {
        gil_take(&k->gil);
        PyErr_Format(PyExc_RuntimeError, "collcomm native core: rank %d announced offset %llu "
                     "for %zd bytes, outside its slot", r, (unsigned long long)off, nbytes);
        return NULL;
    }
    return slot_at(c, phase, r) + off;
}

/* How many ranks' data peers_at finds before any of it is read (and how many list views
 * the fast call holds on its stack); -DPEERS=2 tests the chunks. */
#ifndef PEERS
#define PEERS 64
#endif

/* The staged data of this phase of ranks (r0 + j) % n, j < m <= PEERS, into src[j] (ours:
 * `mine` where given): every rank's offset read before any data is touched, so the reads
 * of the peers' header lines overlap. Read one at a time between the copies, a 16-core
 * Xeon's gather root took 2.5 µs over its 15 peers of 8 bytes (list form), 0.6 µs this
 * way. 0, or -1 with an exception (peer). */
static int peers_at(Call *k, int phase, int r0, int m, Py_ssize_t nbytes, const char *mine,
                    const char **src)
{
    for (int j = 0; j < m; j++) {
        int r = (r0 + j) % k->c->n;
        src[j] = r == k->c->rank && mine != NULL ? mine : peer(k, phase, r, nbytes);
        if (src[j] == NULL)
            return -1;
    }
    return 0;
}

static int any_shared(Core *c, int phase)
{
    for (int r = 0; r < c->n; r++)
        if (get(c, r, c->w_shared + phase))
            return 1;
    return 0;
}

static inline void split(Py_ssize_t count, int n, int i, Py_ssize_t *lo, Py_ssize_t *hi)
{
    Py_ssize_t q = count / n, r = count % n;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

static inline int overlaps(const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen)
{
    return alen > 0 && blen > 0 && a < b + blen && b < a + alen;
}

#define PARSE_LONG(var, obj)                                  \
    long var = PyLong_AsLong(obj);                            \
    if (var == -1 && PyErr_Occurred())                        \
        return NULL;

#define PARSE_U64(var, obj)                                   \
    uint64_t var = PyLong_AsUnsignedLongLongMask(obj);        \
    if (var == (uint64_t)-1 && PyErr_Occurred())              \
        return NULL;

static int check_args(Py_ssize_t nargs, Py_ssize_t want, const char *name)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}
