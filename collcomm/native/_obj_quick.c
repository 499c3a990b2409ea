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

/* `obj` as pickle.dumps(obj, proto) writes it (4 <= proto <= 5), a new bytes; NULL without
 * an exception: not a form this writes */
static PyObject *quick_dumps(PyObject *obj, long proto)
{
    unsigned char body[256 + 4];
    Py_ssize_t n = 0;
    const char *text = NULL;
    Py_ssize_t tlen = 0;
    if (obj == Py_None) {
        body[n++] = 'N';
    } else if (obj == Py_True || obj == Py_False) {
        body[n++] = obj == Py_True ? 0x88 : 0x89;
    } else if (PyLong_CheckExact(obj)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
            PyErr_Clear();
            return NULL;
        }
        uint32_t u = (uint32_t)(int32_t)v;
        if (u >> 16) {                       /* BININT: the top bytes set (negatives too) */
            body[n++] = 'J';
            for (int i = 0; i < 4; i++)
                body[n++] = (unsigned char)(u >> (8 * i));
        } else if (u >> 8) {                 /* BININT2 */
            body[n++] = 'M';
            body[n++] = (unsigned char)u;
            body[n++] = (unsigned char)(u >> 8);
        } else {                             /* BININT1 */
            body[n++] = 'K';
            body[n++] = (unsigned char)u;
        }
    } else if (PyFloat_CheckExact(obj)) {    /* BINFLOAT: the double, big-endian */
        double d = PyFloat_AS_DOUBLE(obj);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        body[n++] = 'G';
        for (int i = 7; i >= 0; i--)
            body[n++] = (unsigned char)(bits >> (8 * i));
    } else if (PyUnicode_CheckExact(obj)) {  /* SHORT_BINUNICODE, MEMOIZE */
        text = PyUnicode_AsUTF8AndSize(obj, &tlen);   /* (a lone surrogate: pickle's way) */
        if (text == NULL || tlen > 255) {
            PyErr_Clear();
            return NULL;
        }
        body[n++] = 0x8c;
        body[n++] = (unsigned char)tlen;
    } else if (PyBytes_CheckExact(obj) && PyBytes_GET_SIZE(obj) <= 255) {   /* SHORT_BINBYTES */
        text = PyBytes_AS_STRING(obj);
        tlen = PyBytes_GET_SIZE(obj);
        body[n++] = 'C';
        body[n++] = (unsigned char)tlen;
    } else {
        return NULL;
    }
    Py_ssize_t tail = (text != NULL ? 1 : 0) + 1;          /* MEMOIZE, STOP */
    Py_ssize_t frame = n + tlen + tail;
    Py_ssize_t size = 2 + (frame >= 4 ? 9 : 0) + frame;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    *p++ = QK_PROTO;
    *p++ = (unsigned char)proto;
    if (frame >= 4) {
        *p++ = QK_FRAME;
        for (int i = 0; i < 8; i++)
            *p++ = (unsigned char)((uint64_t)frame >> (8 * i));
    }
    memcpy(p, body, (size_t)n);
    p += n;
    if (text != NULL) {
        memcpy(p, text, (size_t)tlen);
        p += tlen;
        *p++ = QK_MEMOIZE;
    }
    *p = QK_STOP;
    return out;
}

/* The object of a pickle quick_dumps writes (any protocol 2-5 header), a new reference;
 * NULL without an exception: another form (pickle.loads reads it). */
static PyObject *quick_loads(const char *data, Py_ssize_t len)
{
    const unsigned char *p = (const unsigned char *)data, *end = p + len;
    if (len < 4 || p[0] != QK_PROTO || p[1] < 2 || p[1] > 5)
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
    if (end - p < 2 || end[-1] != QK_STOP)
        return NULL;
    Py_ssize_t left = end - p - 1;           /* the opcode and its argument, STOP excluded */
    switch (p[0]) {
    case 'N':
        return left == 1 ? Py_NewRef(Py_None) : NULL;
    case 0x88:
        return left == 1 ? Py_NewRef(Py_True) : NULL;
    case 0x89:
        return left == 1 ? Py_NewRef(Py_False) : NULL;
    case 'K':
        return left == 2 ? PyLong_FromLong(p[1]) : NULL;
    case 'M':
        return left == 3 ? PyLong_FromLong(p[1] | (long)p[2] << 8) : NULL;
    case 'J': {
        if (left != 5)
            return NULL;
        uint32_t u = p[1] | (uint32_t)p[2] << 8 | (uint32_t)p[3] << 16 | (uint32_t)p[4] << 24;
        return PyLong_FromLong((long)(int32_t)u);
    }
    case 'G': {
        if (left != 9)
            return NULL;
        uint64_t bits = 0;
        for (int i = 0; i < 8; i++)
            bits = bits << 8 | p[1 + i];
        double d;
        memcpy(&d, &bits, 8);
        return PyFloat_FromDouble(d);
    }
    case 0x8c:                               /* SHORT_BINUNICODE (+ MEMOIZE at protocol 4+) */
    case 'C': {                              /* SHORT_BINBYTES (+ MEMOIZE) */
        if (left < 2 || (left != 2 + p[1] + 1 && left != 2 + p[1]))
            return NULL;
        if (left == 2 + p[1] + 1 && p[2 + p[1]] != QK_MEMOIZE)
            return NULL;
        if (p[0] == 'C')
            return PyBytes_FromStringAndSize((const char *)p + 2, p[1]);
        PyObject *s = PyUnicode_DecodeUTF8((const char *)p + 2, p[1], "surrogatepass");
        if (s == NULL)                       /* (pickle.loads raises it, in its words) */
            PyErr_Clear();
        return s;
    }
    default:
        return NULL;
    }
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
