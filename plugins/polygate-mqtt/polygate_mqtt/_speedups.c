/* The ``mqtt`` storage format's record loops in C (optional; format.py has the same in Python).
 *
 * count_records(payload) -> int
 *     the records of ``payload`` (a bytes-like object), which must be whole records numbered
 *     0, 1, 2... with nothing after the last, at least one: ``format._count_records``; raises
 *     ValueError naming the first fault, in the same words.
 * join(payloads) -> bytes
 *     the records of ``payloads`` (a sequence of bytes-like objects, each whole records) in
 *     order, their offset deltas renumbered 0, 1, 2... across them: ``MqttFormat.join``; raises
 *     ValueError on a payload that is not whole records.
 *
 * A record is  u32 offset_delta | i64 timestamp | u8 qos | i32 key_len | key | i32 value_len |
 * value [ i32 headers_len | headers ], the headers only when the qos byte has the HEADERS bit
 * (0x40) and is not UNKNOWN_QOS (0xFF); negative lengths are null (no bytes), but for headers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HEAD_SIZE 17 /* offset delta, timestamp, qos, key length */
#define HEADERS 0x40
#define UNKNOWN_QOS 0xFF

static inline uint32_t
get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline int32_t
get_i32(const unsigned char *p)
{
    return (int32_t)get_u32(p);
}

/* Where the record at ``pos`` (index ``index``) ends, or -1 with ValueError set. */
static Py_ssize_t
record_end(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t index)
{
    if (end - pos < HEAD_SIZE + 4)
        goto cut;
    unsigned char qos = p[pos + 12];
    int32_t klen = get_i32(p + pos + 13);
    pos += HEAD_SIZE + (klen > 0 ? klen : 0);
    if (end - pos < 4)
        goto cut;
    int32_t vlen = get_i32(p + pos);
    pos += 4;
    if (vlen > 0) {
        if (end - pos < vlen)
            goto cut;
        pos += vlen;
    }
    if (qos != UNKNOWN_QOS && (qos & HEADERS)) {
        if (end - pos < 4)
            goto cut;
        int32_t hlen = get_i32(p + pos);
        if (hlen < 0) {
            PyErr_Format(PyExc_ValueError, "record %zd has a negative headers length", index);
            return -1;
        }
        pos += 4;
        if (end - pos < hlen)
            goto cut;
        pos += hlen;
    }
    return pos;
cut:
    PyErr_Format(PyExc_ValueError, "record %zd cut short", index);
    return -1;
}

static PyObject *
count_records(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t pos = 0, end = view.len, count = 0;
    while (pos < end) {
        if (end - pos >= 4 && get_u32(p + pos) != (uint64_t)count) {
            PyErr_Format(PyExc_ValueError, "record %zd has offset delta %lu", count,
                         (unsigned long)get_u32(p + pos));
            goto failed;
        }
        pos = record_end(p, pos, end, count);
        if (pos < 0)
            goto failed;
        count++;
    }
    PyBuffer_Release(&view);
    if (!count) {
        PyErr_SetString(PyExc_ValueError, "no record");
        return NULL;
    }
    return PyLong_FromSsize_t(count);
failed:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
join(PyObject *self, PyObject *arg)
{
    PyObject *seq = PySequence_Fast(arg, "join takes a sequence of payloads");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0, i;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    PyObject *out = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        if (PyObject_GetBuffer(items[i], &views[i], PyBUF_SIMPLE) < 0)
            goto release;
        total += views[i].len;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto release;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t at = 0;
    uint32_t count = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const unsigned char *p = views[k].buf;
        Py_ssize_t pos = 0, end = views[k].len;
        memcpy(w + at, p, end);
        while (pos < end) {
            Py_ssize_t next = record_end(p, pos, end, count);
            if (next < 0) {
                Py_CLEAR(out);
                goto release;
            }
            unsigned char *d = w + at + pos;
            d[0] = count >> 24, d[1] = count >> 16, d[2] = count >> 8, d[3] = count;
            count++;
            pos = next;
        }
        at += end;
    }
release:
    for (Py_ssize_t k = 0; k < i; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
done:
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"count_records", count_records, METH_O, "The records of an mqtt payload, numbered from 0; ValueError else."},
    {"join", join, METH_O, "mqtt payloads as one, offset deltas renumbered across them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "polygate_mqtt._speedups", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
