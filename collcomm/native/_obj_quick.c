/* Scalars pickled and unpickled without the pickle module (included by _obj_pickle.c).
 *
 * Most objects programs move one at a time are scalars: a step, a flag, a loss, a name.
 * pickle.dumps makes a Pickler, a 4 KiB output buffer it then shrinks (glibc's malloc,
 * realloc and free: ~11% of an object irecv+send loop, perf, BENCHMARKS.md session 44)
 * and a memo for every call; pickle.loads an Unpickler. For None, bool, an int within
 * 32 bits, a float, and a str or bytes under 256 bytes, under the standard library's
 * pickle.dumps at protocol 4 or 5, quick_dumps writes the bytes pickle.dumps writes, byte
 * for byte (PROTO, a FRAME header where the frame has 4 bytes or more, the opcode pickle
 * picks, MEMOIZE after a str or bytes, STOP: tests/test_obj_quick.py compares them over
 * boundary values), so a receiver on the Python path, another process or a program's own
 * loads reads them as ever. quick_loads reads exactly those forms back (any protocol 2-5
 * header, the frame checked against the length) and leaves anything else to pickle.loads,
 * which also raises for a truncated or malformed pickle. Anything else (a subclass, a
 * tuple, a big int, a serializer of the program's own) takes pickle.
 */

enum { QK_FRAME = 0x95, QK_PROTO = 0x80, QK_STOP = '.', QK_MEMOIZE = 0x94 };

static PyObject *obj_std_dumps;                    /* pickle.dumps */

/* The pickle being written: the opcodes after PROTO and FRAME's header, the memo (what
 * MEMOIZE numbered, by identity, as pickle's memo is) and the tuples being written. */
enum { QK_ROOM = 1024, QK_MEMO = 256, QK_DEPTH = 16, QK_BATCH = 1000 };
typedef struct {
    unsigned char buf[QK_ROOM];
    Py_ssize_t len;
    PyObject *memo[QK_MEMO];
    int nmemo, depth;
} QkWriter;

static int qk_put(QkWriter *w, const void *p, Py_ssize_t n)   /* 0, or -1: no room */
{
    if (n > QK_ROOM - w->len)
        return -1;
    memcpy(w->buf + w->len, p, (size_t)n);
    w->len += n;
    return 0;
}

static int qk_byte(QkWriter *w, unsigned char b)
{
    return qk_put(w, &b, 1);
}

static int qk_memo_find(QkWriter *w, PyObject *obj)   /* its memo index, or -1 */
{
    for (int i = 0; i < w->nmemo; i++)
        if (w->memo[i] == obj)
            return i;
    return -1;
}

static int qk_memoize(QkWriter *w, PyObject *obj)     /* MEMOIZE, numbered as pickle does */
{
    if (w->nmemo == QK_MEMO)
        return -1;
    w->memo[w->nmemo++] = obj;
    return qk_byte(w, QK_MEMOIZE);
}

/* `obj` written as pickle's save() writes it: 0, or -1 (not a form written here, or no
 * room; no exception) */
static int qk_save(QkWriter *w, PyObject *obj)
{
    unsigned char op[16];
    Py_ssize_t n = 0;
    if (obj == Py_None)
        return qk_byte(w, 'N');
    if (obj == Py_True || obj == Py_False)
        return qk_byte(w, obj == Py_True ? 0x88 : 0x89);
    if (PyLong_CheckExact(obj)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            PyErr_Clear();
            return -1;
        }
        uint32_t u = (uint32_t)(int32_t)v;
        if (u >> 16) {                       /* BININT: the top bytes set (negatives too) */
            op[n++] = 'J';
            for (int i = 0; i < 4; i++)
                op[n++] = (unsigned char)(u >> (8 * i));
        } else if (u >> 8) {                 /* BININT2 */
            op[n++] = 'M';
            op[n++] = (unsigned char)u;
            op[n++] = (unsigned char)(u >> 8);
        } else {                             /* BININT1 */
            op[n++] = 'K';
            op[n++] = (unsigned char)u;
        }
        return qk_put(w, op, n);
    }
    if (PyFloat_CheckExact(obj)) {           /* BINFLOAT: the double, big-endian */
        double d = PyFloat_AS_DOUBLE(obj);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        op[n++] = 'G';
        for (int i = 7; i >= 0; i--)
            op[n++] = (unsigned char)(bits >> (8 * i));
        return qk_put(w, op, n);
    }
    /* the rest is memoized: met again, BINGET (pickle checks its memo here too) */
    int at = qk_memo_find(w, obj);
    if (at >= 0) {
        op[0] = 'h';
        op[1] = (unsigned char)at;
        return qk_put(w, op, 2);
    }
    if (PyUnicode_CheckExact(obj) || PyBytes_CheckExact(obj)) {   /* SHORT_BINUNICODE / _BINBYTES */
        const char *text;
        Py_ssize_t tlen;
        if (PyBytes_CheckExact(obj)) {
            text = PyBytes_AS_STRING(obj);
            tlen = PyBytes_GET_SIZE(obj);
        } else if ((text = PyUnicode_AsUTF8AndSize(obj, &tlen)) == NULL) {   /* (a lone surrogate) */
            PyErr_Clear();
            return -1;
        }
        if (tlen > 255)
            return -1;
        op[0] = PyBytes_CheckExact(obj) ? 'C' : 0x8c;
        op[1] = (unsigned char)tlen;
        return qk_put(w, op, 2) < 0 || qk_put(w, text, tlen) < 0 ? -1 : qk_memoize(w, obj);
    }
    if (w->depth == QK_DEPTH)
        return -1;
    int r = -1;
    w->depth++;
    if (PyTuple_CheckExact(obj)) {
        Py_ssize_t k = PyTuple_GET_SIZE(obj);
        if (k == 0) {                        /* EMPTY_TUPLE, not memoized */
            r = qk_byte(w, ')');
        } else if (k <= QK_BATCH) {
            r = k > 3 ? qk_byte(w, '(') : 0;                        /* MARK */
            for (Py_ssize_t i = 0; i < k && r == 0; i++)
                r = qk_save(w, PyTuple_GET_ITEM(obj, i));
            /* (a tuple met inside itself, through a list: pickle's recursive form) */
            if (r == 0 && qk_memo_find(w, obj) >= 0)
                r = -1;
            if (r == 0)
                r = qk_byte(w, k > 3 ? 't' : (unsigned char)(0x84 + k));   /* TUPLE, TUPLE1-3 */
            if (r == 0)
                r = qk_memoize(w, obj);
        }
    } else if (PyList_CheckExact(obj) || PyDict_CheckExact(obj)) {
        int list = PyList_CheckExact(obj);
        Py_ssize_t k = list ? PyList_GET_SIZE(obj) : PyDict_GET_SIZE(obj);
        r = k > QK_BATCH || qk_byte(w, list ? ']' : '}') < 0 || qk_memoize(w, obj) < 0 ? -1 : 0;
        if (r == 0 && k > 1)
            r = qk_byte(w, '(');                                      /* MARK */
        if (list) {
            for (Py_ssize_t i = 0; i < k && r == 0; i++)
                r = PyList_GET_SIZE(obj) == k ? qk_save(w, PyList_GET_ITEM(obj, i)) : -1;
        } else {
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (r == 0 && PyDict_Next(obj, &pos, &key, &value))
                r = qk_save(w, key) < 0 || qk_save(w, value) < 0 ? -1 : 0;
            if (r == 0 && PyDict_GET_SIZE(obj) != k)
                r = -1;
        }
        if (r == 0 && k > 0)        /* APPEND / APPENDS, SETITEM / SETITEMS */
            r = qk_byte(w, list ? (k == 1 ? 'a' : 'e') : (k == 1 ? 's' : 'u'));
    }
    w->depth--;
    return r;
}

/* `obj` as pickle.dumps(obj, proto) writes it (4 <= proto <= 5), a new bytes; NULL without
 * an exception: not a form this writes */
static PyObject *quick_dumps(PyObject *obj, long proto)
{
    QkWriter w;
    w.len = 0;
    w.nmemo = w.depth = 0;
    if (qk_save(&w, obj) < 0 || qk_byte(&w, QK_STOP) < 0)
        return NULL;
    Py_ssize_t frame = w.len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 2 + (frame >= 4 ? 9 : 0) + frame);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    *p++ = QK_PROTO;
    *p++ = (unsigned char)proto;
    if (frame >= 4) {                        /* FRAME: pickle frames 4 bytes and more */
        *p++ = QK_FRAME;
        for (int i = 0; i < 8; i++)
            *p++ = (unsigned char)((uint64_t)frame >> (8 * i));
    }
    memcpy(p, w.buf, (size_t)frame);
    return out;
}

/* The object of a pickle made of the opcodes quick_dumps writes (any protocol 2-5 header,
 * an optional FRAME that must cover the rest exactly, STOP last, one object left), a new
 * reference; NULL without an exception: anything else, pickle.loads reads it (and raises
 * for a malformed one, in its words). The opcodes do what pickle's do. */
enum { QK_STACK = 512 };
#define QK_FENCE (nmarks > 0 ? marks[nmarks - 1] : 0)   /* pickle's: nothing below the last MARK */
static PyObject *quick_loads(const char *data, Py_ssize_t len)
{
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    if (len < 4 || p[0] != QK_PROTO || p[1] < 2 || p[1] > 5 || end[-1] != QK_STOP)
        return NULL;
    p += 2;
    if (p[0] == QK_FRAME) {
        if (end - p < 9)
            return NULL;
        uint64_t frame = 0;
        for (int i = 0; i < 8; i++)
            frame |= (uint64_t)p[1 + i] << (8 * i);
        p += 9;
        if (frame != (uint64_t)(end - p))
            return NULL;
    }
    PyObject *stack[QK_STACK], *memo[QK_MEMO];
    int marks[QK_STACK];
    int top = 0, nmarks = 0, nmemo = 0, ok = 0;
    end--;                                   /* (STOP) */
    while (p < end) {
        unsigned char code = *p++;
        PyObject *o = NULL;
        Py_ssize_t left = end - p;
        if (code == '(') {                   /* MARK */
            if (nmarks == QK_STACK)
                goto out;
            marks[nmarks++] = top;
            continue;
        }
        if (code == QK_MEMOIZE) {
            if (top <= QK_FENCE || nmemo == QK_MEMO)
                goto out;
            memo[nmemo++] = Py_NewRef(stack[top - 1]);
            continue;
        }
        if (code == 'a' || code == 'e' || code == 's' || code == 'u') {   /* APPEND(S), SETITEM(S) */
            int from = code == 'a' ? top - 1 : code == 's' ? top - 2 : nmarks > 0 ? marks[--nmarks] : -1;
            int list = code == 'a' || code == 'e';
            if (from < 1 || from - 1 < QK_FENCE || (!list && (top - from) % 2) ||
                !(list ? PyList_CheckExact(stack[from - 1]) : PyDict_CheckExact(stack[from - 1])))
                goto out;
            for (int i = from; i < top; i += list ? 1 : 2)
                if ((list ? PyList_Append(stack[from - 1], stack[i])
                          : PyDict_SetItem(stack[from - 1], stack[i], stack[i + 1])) < 0)
                    goto out;
            while (top > from)
                Py_DECREF(stack[--top]);
            continue;
        }
        if (code == 0x85 || code == 0x86 || code == 0x87 || code == 't') {   /* TUPLE1-3, TUPLE */
            int from = code == 't' ? (nmarks > 0 ? marks[--nmarks] : -1) : top - (code - 0x84);
            if (from < 0 || from < QK_FENCE)
                goto out;
            o = PyTuple_New(top - from);
            if (o == NULL)
                goto out;
            for (int i = from; i < top; i++)
                PyTuple_SET_ITEM(o, i - from, stack[i]);
            top = from;
        } else switch (code) {
        case 'N': o = Py_NewRef(Py_None); break;
        case 0x88: o = Py_NewRef(Py_True); break;
        case 0x89: o = Py_NewRef(Py_False); break;
        case ')': o = PyTuple_New(0); break;
        case ']': o = PyList_New(0); break;
        case '}': o = PyDict_New(); break;
        case 'K':
            if (left < 1)
                goto out;
            o = PyLong_FromLong(p[0]);
            p += 1;
            break;
        case 'M':
            if (left < 2)
                goto out;
            o = PyLong_FromLong(p[0] | (long)p[1] << 8);
            p += 2;
            break;
        case 'J':
            if (left < 4)
                goto out;
            o = PyLong_FromLong((long)(int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                                (uint32_t)p[3] << 24));
            p += 4;
            break;
        case 'G': {
            if (left < 8)
                goto out;
            uint64_t bits = 0;
            for (int i = 0; i < 8; i++)
                bits = bits << 8 | p[i];
            double d;
            memcpy(&d, &bits, 8);
            o = PyFloat_FromDouble(d);
            p += 8;
            break;
        }
        case 0x8c:                           /* SHORT_BINUNICODE */
        case 'C':                            /* SHORT_BINBYTES */
        {
            Py_ssize_t len = left < 1 ? 0 : p[0];     /* (read once: the length checked is the one used) */
            if (left < 1 || left - 1 < len)
                goto out;
            o = code == 'C' ? PyBytes_FromStringAndSize((const char *)p + 1, len)
                            : PyUnicode_DecodeUTF8((const char *)p + 1, len, "surrogatepass");
            p += 1 + len;
            break;
        }
        case 'h':                            /* BINGET */
        {
            int at = left < 1 ? nmemo : p[0];
            if (at >= nmemo)
                goto out;
            o = Py_NewRef(memo[at]);
            p += 1;
            break;
        }
        default:
            goto out;
        }
        if (o == NULL || top == QK_STACK) {
            Py_XDECREF(o);
            goto out;
        }
        stack[top++] = o;
    }
    ok = top == 1 && nmarks == 0;
out:
    if (PyErr_Occurred())                    /* (pickle.loads meets it again and raises it) */
        PyErr_Clear();
    PyObject *r = ok ? stack[0] : NULL;
    for (int i = ok ? 1 : 0; i < top; i++)
        Py_DECREF(stack[i]);
    for (int i = 0; i < nmemo; i++)
        Py_DECREF(memo[i]);
    return r;
}

/* quick_dumps(obj, protocol) -> the bytes, or None where pickle is needed; quick_loads(data)
 * -> (obj,), or None where pickle.loads reads it (tests/test_obj_quick.py) */
static PyObject *mod_quick_dumps(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    long proto = nargs == 2 ? PyLong_AsLong(args[1]) : -1;
    if (nargs != 2 || proto < 4 || proto > 5) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "quick_dumps(obj, protocol 4 or 5)");
        return NULL;
    }
    PyObject *r = quick_dumps(args[0], proto);
    return r != NULL || PyErr_Occurred() ? r : Py_NewRef(Py_None);
}

static PyObject *mod_quick_loads(PyObject *m, PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *r = quick_loads(v.buf, v.len);
    PyBuffer_Release(&v);
    if (r == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    PyObject *t = PyTuple_Pack(1, r);
    Py_DECREF(r);
    return t;
}
