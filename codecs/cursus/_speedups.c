/* The Cursus record loop of conversions in C (optional; batch.py has the same in Python).
 *
 * read_records(data, pos, count, keys, values, headers, extras, names) -> (end, any_headers)
 *     appends the fields of ``count`` records of data[pos:] to the lists, as
 *     ``CursusFormat.columns`` does; ``names`` is the tuple of header and extras names
 *     (event type, schema version, aggregate version, metadata, producer id, epoch, seq num).
 *     Raises ValueError on a record that runs past the end of ``data``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static uint64_t
be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

static PyObject *
decimal_bytes(unsigned long long v)
{
    char digits[24];
    int n = snprintf(digits, sizeof digits, "%llu", v);
    return PyBytes_FromStringAndSize(digits, n);
}

static PyObject *
read_records(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos, count;
    PyObject *keys, *values, *headers, *extras, *names;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnO!O!O!O!O!", &buf, &pos, &count, &PyList_Type, &keys, &PyList_Type, &values,
                          &PyList_Type, &headers, &PyList_Type, &extras, &PyTuple_Type, &names))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t len = buf.len;
    PyObject *result = NULL, *empty = PyTuple_New(0);
    int any_headers = 0;
    if (empty == NULL)
        goto done;
    if (PyTuple_GET_SIZE(names) != 7) {
        PyErr_SetString(PyExc_ValueError, "seven names");
        goto done;
    }
    PyObject *h_event = PyTuple_GET_ITEM(names, 0), *h_schema = PyTuple_GET_ITEM(names, 1),
             *h_aggregate = PyTuple_GET_ITEM(names, 2), *h_metadata = PyTuple_GET_ITEM(names, 3),
             *x_producer = PyTuple_GET_ITEM(names, 4), *x_epoch = PyTuple_GET_ITEM(names, 5),
             *x_seq = PyTuple_GET_ITEM(names, 6);
#define NEED(n)                                                                      \
    if ((n) > len - pos) {                                                           \
        PyErr_SetString(PyExc_ValueError, "a record runs past the end of its batch"); \
        goto done;                                                                   \
    }
    if (pos < 0 || pos > len) {
        PyErr_SetString(PyExc_ValueError, "records outside the batch");
        goto done;
    }
    for (Py_ssize_t r = 0; r < count; r++) {
        NEED(18);
        uint64_t seq = be(p + pos + 8, 8);
        Py_ssize_t plen = (Py_ssize_t)be(p + pos + 16, 2);
        pos += 18;
        NEED(plen + 2);
        const unsigned char *pid = p + pos;
        pos += plen;
        Py_ssize_t klen = (Py_ssize_t)be(p + pos, 2);
        pos += 2;
        NEED(klen + 12);
        PyObject *key = klen ? PyBytes_FromStringAndSize((const char *)p + pos, klen) : Py_NewRef(Py_None);
        if (append_new(keys, key) < 0)
            goto done;
        pos += klen;
        int64_t epoch = (int64_t)be(p + pos, 8);
        Py_ssize_t vlen = (Py_ssize_t)be(p + pos + 8, 4);
        pos += 12;
        NEED(vlen + 2);
        if (append_new(values, PyBytes_FromStringAndSize((const char *)p + pos, vlen)) < 0)
            goto done;
        pos += vlen;
        Py_ssize_t elen = (Py_ssize_t)be(p + pos, 2);
        pos += 2;
        NEED(elen + 14);
        const unsigned char *event = p + pos;
        pos += elen;
        uint64_t schema = be(p + pos, 4), aggregate = be(p + pos + 4, 8);
        Py_ssize_t mlen = (Py_ssize_t)be(p + pos + 12, 2);
        pos += 14;
        NEED(mlen);
        const unsigned char *metadata = p + pos;
        pos += mlen;
        if (elen || mlen || schema || aggregate) {
            PyObject *e = PyBytes_FromStringAndSize((const char *)event, elen);
            PyObject *s = decimal_bytes(schema);
            PyObject *a = decimal_bytes(aggregate);
            PyObject *m = PyBytes_FromStringAndSize((const char *)metadata, mlen);
            PyObject *h = (e && s && a && m) ? Py_BuildValue("((OO)(OO)(OO)(OO))", h_event, e, h_schema, s,
                                                             h_aggregate, a, h_metadata, m) : NULL;
            Py_XDECREF(e);
            Py_XDECREF(s);
            Py_XDECREF(a);
            Py_XDECREF(m);
            if (append_new(headers, h) < 0)
                goto done;
            any_headers = 1;
        } else {
            Py_INCREF(empty);
            if (append_new(headers, empty) < 0)
                goto done;
        }
        PyObject *x = PyDict_New();
        if (x == NULL)
            goto done;
        PyObject *pid_text = PyUnicode_DecodeUTF8((const char *)pid, plen, "surrogateescape");
        PyObject *epoch_int = PyLong_FromLongLong(epoch);
        PyObject *seq_int = PyLong_FromUnsignedLongLong(seq);
        int failed = pid_text == NULL || epoch_int == NULL || seq_int == NULL ||
                     PyDict_SetItem(x, x_producer, pid_text) < 0 || PyDict_SetItem(x, x_epoch, epoch_int) < 0 ||
                     PyDict_SetItem(x, x_seq, seq_int) < 0;
        Py_XDECREF(pid_text);
        Py_XDECREF(epoch_int);
        Py_XDECREF(seq_int);
        if (failed) {
            Py_DECREF(x);
            goto done;
        }
        if (append_new(extras, x) < 0)
            goto done;
    }
#undef NEED
    result = Py_BuildValue("(nO)", pos, any_headers ? Py_True : Py_False);
done:
    Py_XDECREF(empty);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"read_records", read_records, METH_VARARGS, "Append the fields of Cursus records to column lists."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "The Cursus record loop in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
