/* Making and freeing a ``Core`` (the type object itself is in _shmcore.c).
 *
 * Included by _shmcore.c. Core_init takes the arena mapping and its geometry and refuses a
 * geometry that does not fit the mapping; the members are read-only counters for tests.
 */

static int Core_init(Core *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"mapping", "n", "rank", "header", "slot", "stride", "page",
                             "one_shot", "layout", "spin_ns", "yields", "futex",
                             "reduce_one_shot", "poll_ns", "stage_nt", "pipe_min", "pipe_steps",
                             "a2a_adapt", "reduce_pair_from", "out_nt_min", NULL};
    PyObject *mapping, *layout;
    long long spin_ns;
    int futex;
    self->reduce_one_shot = 0;     /* (not given: every reduce in two steps) */
    self->poll_ns = 0;             /* (not given: `yields` yields, then the futex) */
    self->stage_nt = 0;            /* (not given: plain stores) */
    self->pipe_min = 0;            /* (not given: a reduce between two ranks is two-shot) */
    self->pipe_steps = 1;
    self->a2a_adapt = 0;           /* (not given: all_to_all by the fixed rule alone) */
    self->reduce_pair_from = 0;    /* (not given: a reduce is pipelined past a slot only;
                                    * native.attach always gives arena_layout.REDUCE_PAIR_FROM,
                                    * which the Python ranks' rule uses: they must agree) */
    self->out_nt_min = 0;          /* (not given: own blocks copied with plain stores) */
    self->reduce_cma_min = self->reduce_cma_max = 0;   /* (until Arena.build says: never) */
    self->pids = NULL;
    for (int i = 0; i < A2A_CLASSES; i++) {
        self->a2a_choice[i] = (A2aChoice){{0, 0}, {0, 0}, -1, 0, -1, 0, -1};
        self->ag_choice[i] = self->a2a_choice[i];
    }
    self->all_reduce_extra = (Py_ssize_t)1 << 40;   /* one step up to one_shot, until the
                                                       group agrees (Arena.check_settings) */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OiinnnnnOLip|nLininnn", kwlist, &mapping, &self->n,
                                     &self->rank, &self->header, &self->slot, &self->stride,
                                     &self->page, &self->one_shot, &layout, &spin_ns,
                                     &self->yields, &futex, &self->reduce_one_shot,
                                     &self->poll_ns, &self->stage_nt, &self->pipe_min,
                                     &self->pipe_steps, &self->a2a_adapt, &self->reduce_pair_from,
                                     &self->out_nt_min))
        return -1;
    if (self->pipe_min < 0 || self->pipe_steps < 1 || self->a2a_adapt < 0 || self->reduce_pair_from < 0 ||
        self->out_nt_min < 0) {
        PyErr_SetString(PyExc_ValueError, "pipe_min, a2a_adapt, reduce_pair_from and out_nt_min must "
                        "be >= 0 and pipe_steps >= 1");
        return -1;
    }
    cma_nt_min = self->out_nt_min;     /* (the process's setting: _cma_move.c streams by it too) */
    self->spin_ns = spin_ns;
    if (self->stage_nt != 0 && self->stage_nt != 1) {
        PyErr_SetString(PyExc_ValueError, "stage_nt must be 0 or 1");
        return -1;
    }
    self->use_futex = futex;
    self->part = PART_WHOLE;
    self->eager_wait = EAGER_NO;
    self->only = -1;
    self->skip = -1;
    self->w_cpu = -1;   /* (a layout without the CPU word: always spin first) */
    if (!PyArg_ParseTuple(layout, "iiiiiiii|i;layout: (words, counter, offset, size, shared, "
                          "signature, sleepers, phase[, cpu])", &self->words, &self->w_counter,
                          &self->w_offset, &self->w_size, &self->w_shared, &self->w_signature,
                          &self->w_sleepers, &self->w_phase, &self->w_cpu))
        return -1;
    if (self->base != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(mapping, &self->mapping, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->base = (char *)self->mapping.buf;
    self->size = self->mapping.len;
    int top = self->w_signature > self->w_offset ? self->w_signature : self->w_offset;
    if (self->n < 2 || self->rank < 0 || self->rank >= self->n || self->words < 1 ||
        self->page <= 0 || self->slot <= 0 || self->stride < self->slot ||
        self->header < (Py_ssize_t)self->n * self->words * 8 ||
        top + 1 >= self->words || self->w_size + 1 >= self->words ||
        self->w_shared + 1 >= self->words || self->w_sleepers >= self->words ||
        self->w_phase < 0 || self->w_phase >= self->words || self->w_cpu >= self->words ||
        self->header + 2 * (Py_ssize_t)self->n * self->stride > self->size ||
        ((uintptr_t)self->base & 7)) {
        PyBuffer_Release(&self->mapping);
        self->base = NULL;
        PyErr_SetString(PyExc_ValueError, "collcomm native core: the arena geometry does not fit "
                        "its mapping");
        return -1;
    }
    return 0;
}

static void Core_dealloc(Core *self)
{
    if (self->base != NULL)
        PyBuffer_Release(&self->mapping);
    Py_CLEAR(self->pids);
    Py_CLEAR(self->progress);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Core_members[] = {
    {"done", T_ULONGLONG, offsetof(Core, done), READONLY,
     "calls completed by the native core (collectives, and the syncs of Arena.sync)"},
    {"finished", T_ULONGLONG, offsetof(Core, finished), READONLY,
     "calls the Python code finished (some buffer read in place)"},
    {"all_reduce_extra", T_PYSSIZET, offsetof(Core, all_reduce_extra), 0,
     "an all_reduce is one step while (n-1)(n-2)/n x its bytes <= this (Arena.check_settings "
     "sets the group's agreed value)"},
    {"eager", T_INT, offsetof(Core, eager), 0,
     "1: a rank that needs nobody's data leaves a one-step rooted call before the others "
     "arrive (Arena.check_settings sets it; see enter in _arena_sync.c)"},
    {"lag_target", T_ULONGLONG, offsetof(Core, lag_target), READONLY,
     "nonzero: a call left early is not settled yet (Core.settle)"},
    {"lag_phase", T_INT, offsetof(Core, lag_phase), READONLY,
     "the phase of the call left early (its words, for the mismatch's text)"},
    {"stage_nt", T_INT, offsetof(Core, stage_nt), READONLY,
     "1: staged copies of 64 KiB or more are written with streaming stores (_stage_nt.c)"},
    {"streamed", T_ULONGLONG, offsetof(Core, streamed), READONLY,
     "staged copies written with streaming stores"},
    {"out_nt_min", T_PYSSIZET, offsetof(Core, out_nt_min), READONLY,
     "a rank's own block is copied into its output with streaming stores from this many "
     "bytes (0: never; _stage_nt.c out_copy)"},
    {"out_streamed", T_ULONGLONG, offsetof(Core, out_streamed), READONLY,
     "own blocks copied into the output with streaming stores"},
    {"a2a_staged", T_ULONGLONG, offsetof(Core, a2a_by), READONLY,
     "all_to_alls this rank (rank 0) voted to stage (_a2a_choice.c)"},
    {"a2a_cma", T_ULONGLONG, offsetof(Core, a2a_by) + sizeof(unsigned long long), READONLY,
     "all_to_alls this rank (rank 0) voted to read by cross-memory attach"},
    {"ag_vote_min", T_PYSSIZET, offsetof(Core, ag_vote_min), 0,
     "all_gathers of at least this many bytes take the voted way (_all_gather_voted.c; 0: "
     "none; the same on every rank: Arena.build sets it)"},
    {"reduce_cma_min", T_PYSSIZET, offsetof(Core, reduce_cma_min), 0,
     "a reduce between two ranks of reduce_cma_min..reduce_cma_max bytes goes by cross-memory "
     "attach (0: never; Arena.build sets them: shm_reduce.reduce_by_cma)"},
    {"reduce_cma_max", T_PYSSIZET, offsetof(Core, reduce_cma_max), 0, "see reduce_cma_min"},
    {"reduce_pair_from", T_PYSSIZET, offsetof(Core, reduce_pair_from), READONLY,
     "a reduce between two ranks of more bytes than this or than a slot is pipelined "
     "(reduce_pair; 0: past a slot only; shm_reduce.reduce_in_pair)"},
    {"pids", T_OBJECT, offsetof(Core, pids), 0, "every rank's pid (reduce's CMA step)"},
    {"progress", T_OBJECT, offsetof(Core, progress), 0,
     "called every millisecond of a wait that sleeps: the rank's point-to-point progress "
     "(Arena.progress; None: none)"},
    {"ag_staged", T_ULONGLONG, offsetof(Core, ag_by), READONLY,
     "all_gathers this rank (rank 0) voted to stage"},
    {"ag_cma", T_ULONGLONG, offsetof(Core, ag_by) + sizeof(unsigned long long), READONLY,
     "all_gathers this rank (rank 0) voted to read by cross-memory attach"},
    {"a2a_read", T_ULONGLONG, offsetof(Core, a2a_read), READONLY,
     "all_to_alls this rank's core read by cross-memory attach (rank 0's vote or the fixed "
     "rule; not those it handed to the Python code)"},
    {"ag_read", T_ULONGLONG, offsetof(Core, ag_read), READONLY,
     "voted-way all_gathers this rank read by cross-memory attach (rank 0's vote or the "
     "fixed rule)"},
    {"n", T_INT, offsetof(Core, n), READONLY, "ranks"},
    {"rank", T_INT, offsetof(Core, rank), READONLY, "this rank"},
    {NULL, 0, 0, 0, NULL},
};
