/* The Cursus record loop of conversions in C (optional; format.py has the same in Python).
 *
 * read_records(data, pos, count, keys, values, headers, extras, names) -> (end, any_headers)
 *     appends the fields of ``count`` records of data[pos:] to the lists, as
 *     ``CursusFormat.columns`` does; ``names`` is the tuple of header and extras names
 *     (event type, schema version, aggregate version, metadata, producer id, epoch, seq num).
 *     Raises ValueError on a record that runs past the end of ``data``.
 * encode_plain_records(offsets, keys, values) -> bytes
 *     records without producer or event fields, as ``batch._encode_plain_records`` writes them;
 *     TypeError or OverflowError for what only the Python loops take (other types, a key over
 *     65535 bytes, a value over 4 GiB, an offset outside 64 bits).
 */
#include "_speedups.h"
#include <string.h>

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

/* offset, seq num, producer id, key length; epoch, payload length; event type, schema and aggregate
 * versions, metadata */
#define PLAIN_RECORD_FIXED (8 + 8 + 2 + 2 + 8 + 4 + 2 + 4 + 8 + 2)

static PyObject *
encode_plain_records(PyObject *self, PyObject *args)
{
    PyObject *offsets, *keys, *values;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &offsets, &PyList_Type, &keys, &PyList_Type, &values))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(values) != n) {
        PyErr_SetString(PyExc_TypeError, "one offset, key and value per record");
        return NULL;
    }
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_Check(key) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "keys and values must be bytes");
            return NULL;
        }
        if (PyBytes_GET_SIZE(key) > 0xFFFF || (uint64_t)PyBytes_GET_SIZE(value) > 0xFFFFFFFFu) {
            PyErr_SetString(PyExc_OverflowError, "a key or value longer than its length prefix allows");
            return NULL;
        }
        unsigned long long offset = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(offsets, i));
        if (offset == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        size += PLAIN_RECORD_FIXED + PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        Py_ssize_t klen = PyBytes_GET_SIZE(key), vlen = PyBytes_GET_SIZE(value);
        p = put_be(p, PyLong_AsUnsignedLongLong(PyList_GET_ITEM(offsets, i)), 8);
        memset(p, 0, 10); /* seq num, producer id length */
        p = put_be(p + 10, (uint64_t)klen, 2);
        memcpy(p, PyBytes_AS_STRING(key), klen);
        p += klen;
        memset(p, 0, 8); /* epoch */
        p = put_be(p + 8, (uint64_t)vlen, 4);
        memcpy(p, PyBytes_AS_STRING(value), vlen);
        p += vlen;
        memset(p, 0, 16); /* event type length, schema and aggregate versions, metadata length */
        p += 16;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"read_records", read_records, METH_VARARGS, "Append the fields of Cursus records to column lists."},
    {"encode_plain_records", encode_plain_records, METH_VARARGS, "Cursus records without producer or event fields."},
    {NULL, NULL, 0, NULL},
};

SPEEDUPS_MODULE("The Cursus record loops in C.", methods)
