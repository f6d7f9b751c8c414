/* Helpers shared by the optional C loops (gateway/_speedups.c, codecs/<name>/_speedups.c, gateway/spark/_arrow.c).
 *
 * Each codec builds its own extension module; this header only saves them from
 * repeating the same few lines. Everything here is static inline.
 */
#ifndef POLYGATE_SPEEDUPS_H
#define POLYGATE_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <structmember.h>

/* The big-endian unsigned integer of n bytes at p. */
static inline uint64_t
be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Write v as an n-byte big-endian unsigned integer at p; returns the byte after it. */
static inline unsigned char *
put_be(unsigned char *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

/* Where ``type`` keeps its slot ``name`` (a member descriptor of an object, as ``__slots__`` and the
 * model's frozen classes make): its offset in an instance, or -1 (no exception set) for any other
 * attribute, and, when ``to_store``, for a read-only one. */
static inline Py_ssize_t
slot_offset(PyTypeObject *type, PyObject *name, int to_store)
{
    PyObject *descr = _PyType_Lookup(type, name); /* borrowed; the type's own lookup, through its MRO */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    return member->type == T_OBJECT_EX && !(to_store && (member->flags & READONLY)) ? member->offset : -1;
}

/* ``obj.name`` (a new reference): read from the slot at ``offset`` (``slot_offset``) when ``obj`` is a
 * ``type`` and the slot is set, with no attribute lookup; else by ``getattr``, with its exceptions. */
static inline PyObject *
slot_or_attr(PyObject *obj, PyTypeObject *type, Py_ssize_t offset, PyObject *name)
{
    if (offset >= 0 && Py_TYPE(obj) == type) {
        PyObject *value = *(PyObject **)((char *)obj + offset);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, name);
}

/* Append a new reference to list and drop it; -1 (exception set) if item is NULL or the append fails. */
static inline int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

/* list[i] as a long long: TypeError for anything but an int, so that no ``__index__`` code runs (and
 * changes the lists) while a loop holds borrowed items; OverflowError outside 64 bits. */
static inline int
list_int64(PyObject *list, Py_ssize_t i, long long *out)
{
    PyObject *v = PyList_GET_ITEM(list, i);
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "ints expected");
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The arguments of an encoder of records, ``(offsets, base, timestamps, keys, values)``: four lists
 * of one item per record (``what`` names a record in the error) and the base offset; 0, or -1 with
 * an exception set. The items are checked by the encoder's own pass. */
static inline int
record_columns(PyObject *args, const char *what, PyObject **offsets, long long *base, PyObject **stamps,
               PyObject **keys, PyObject **values)
{
    if (!PyArg_ParseTuple(args, "O!LO!O!O!", &PyList_Type, offsets, base, &PyList_Type, stamps, &PyList_Type,
                          keys, &PyList_Type, values))
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(*offsets);
    if (PyList_GET_SIZE(*stamps) != n || PyList_GET_SIZE(*keys) != n || PyList_GET_SIZE(*values) != n) {
        PyErr_Format(PyExc_TypeError, "one offset, timestamp, key and value per %s", what);
        return -1;
    }
    return 0;
}

/* The size of v as an unsigned LEB128 varint. */
static inline Py_ssize_t
uvarint_size(uint64_t v)
{
    Py_ssize_t s = 1;
    while (v >= 0x80) {
        v >>= 7;
        s++;
    }
    return s;
}

/* Write v as an unsigned LEB128 varint at out; returns the byte after it. */
static inline unsigned char *
put_uvarint(unsigned char *out, uint64_t v)
{
    while (v >= 0x80) {
        *out++ = (unsigned char)((v & 0x7f) | 0x80);
        v >>= 7;
    }
    *out++ = (unsigned char)v;
    return out;
}

/* n as Kafka's zigzag varint (varint and varlong) encodes it, before its LEB128 bytes. */
static inline uint64_t
zigzag(int64_t n)
{
    return ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
}

/* The size of n as a zigzag varint. */
static inline Py_ssize_t
zigzag_size(int64_t n)
{
    return uvarint_size(zigzag(n));
}

/* Write n as a zigzag varint at out; returns the byte after it. */
static inline unsigned char *
put_zigzag(unsigned char *out, int64_t n)
{
    return put_uvarint(out, zigzag(n));
}

/* ``inflate(view of p[0:size], budget)`` (with ``codec`` 0 or above: ``inflate(view, budget, codec)``): the
 * bytes it returns, or NULL: with no exception set when the data is at fault (``inflate`` raised an Exception,
 * or returned no bytes), else with the exception (an interrupt). The view is released after the call, so that
 * one kept by ``inflate`` cannot outlive the buffer it shows. */
static inline PyObject *
inflated(PyObject *inflate, const unsigned char *p, Py_ssize_t size, Py_ssize_t budget, int codec)
{
    PyObject *view = PyMemoryView_FromMemory((char *)p, size, PyBUF_READ);
    PyObject *set = view == NULL ? NULL
                    : codec < 0  ? PyObject_CallFunction(inflate, "On", view, budget)
                                 : PyObject_CallFunction(inflate, "Oni", view, budget, codec);
    if (view != NULL) {
        PyObject *released = PyObject_CallMethod(view, "release", NULL);
        if (released == NULL)
            Py_CLEAR(set); /* still exported (``inflate`` holds a buffer of it): a fault */
        Py_XDECREF(released);
        Py_DECREF(view);
    }
    if (set != NULL && !PyBytes_Check(set))
        Py_CLEAR(set);
    if (set == NULL && (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)))
        PyErr_Clear();
    return set;
}

/* The definition and init function of a codec's ``_speedups`` module exporting ``methods``. */
#define SPEEDUPS_MODULE(doc, methods)                                                                  \
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", doc, -1, methods,         \
                                        NULL, NULL, NULL, NULL};                                       \
    PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }

/* The zigzag LEB128 varint (Kafka's varint and varlong) at p[*pos], below stop; -1 if cut short or over 10 bytes. */
static inline int
read_zigzag(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t stop, int64_t *out)
{
    uint64_t v = 0;
    int shift = 0;
    Py_ssize_t i = *pos;
    while (i < stop && shift < 70) {
        unsigned char b = p[i++];
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pos = i;
            *out = (int64_t)((v >> 1) ^ (~(v & 1) + 1));
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* Kafka's murmur2 (the Java client's default partitioner hash) of p[0:length]. */
static inline uint64_t
murmur2_of(const unsigned char *p, Py_ssize_t length)
{
    const uint32_t m = 0x5BD1E995u;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    Py_ssize_t whole = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 | (uint32_t)p[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)p[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)p[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= p[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

/* FNV-1a 32 of p[0:length] (where V1 and Cursus clients put a keyed record). */
static inline uint64_t
fnv1a_32_of(const unsigned char *p, Py_ssize_t length)
{
    uint32_t h = 0x811C9DC5u;
    for (Py_ssize_t i = 0; i < length; i++)
        h = (h ^ p[i]) * 0x01000193u;
    return h;
}

#endif
