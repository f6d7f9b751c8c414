/* The gateway core's optional C loops: where this module is not built, ``gateway.model`` keeps
 * attrs' own ``__init__``, ``gateway.partitioners`` hashes keys and ``gateway.codec.framing`` cuts
 * frames in Python, with the same results.
 *
 * A C ``__init__`` for the model's frozen, slotted attrs classes.
 *
 * attrs makes a frozen class's ``__init__`` set each field through ``object.__setattr__``,
 * because the class's own ``__setattr__`` refuses: 0.8 µs for eight fields, where a mutable
 * class takes 0.2 µs. The model builds a few such objects per request (a produce, its batch,
 * its result), so on a pipelined produce path that was a fifth of the gateway's CPU.
 *
 * init(cls, names, defaults) -> an ``__init__`` for ``cls``
 *     ``names`` are the fields' ``__init__`` parameters in order, each stored in the slot of
 *     the same name; the last ``len(defaults)`` have those defaults (attrs puts the fields
 *     without a default first). It takes the same arguments as attrs' ``__init__``, positional
 *     or by keyword, and stores them in the slots directly; the same TypeErrors for missing,
 *     repeated, unknown or too many arguments. Only for fields with no converter, validator
 *     or factory, which ``gateway.model`` checks.
 *
 * fnv1a_32(key), fnv1a_64(key), murmur2(key) -> int
 *     the partitioners' hashes of ``gateway.partitioners`` (a bytes-like key).
 *
 * cut_frames(data, pos, size_at, size_width, flags, max_size, most, budget) -> (frames, pos)
 *     ``gateway.codec.framing``'s ``_cut_frames``: the whole frames at ``data[pos:]`` (a bytearray),
 *     at most ``most`` and no more once they hold ``budget`` bytes, as ``(header, body)``
 *     tuples, and the position after the last. Each
 *     frame's body size is the unsigned (``CUT_SIGNED``: signed) ``size_width``-byte integer at
 *     ``size_at``, little-endian (``CUT_BIG_ENDIAN``: big), after which the body starts; with
 *     ``CUT_VARINT`` it is instead an unsigned LEB128 varint of at most ``size_width`` bytes at
 *     ``size_at``. Bodies are bytes (``CUT_MUTABLE``: bytearray). Cutting stops before the first
 *     frame that is not whole yet, whose size is negative or over ``max_size``, or whose varint
 *     runs too long: the framer's general path then takes it, with its errors.
 */
#include "_speedups.h"

#define MAX_FIELDS 64

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *names;    /* tuple of str */
    PyObject *defaults; /* tuple: the defaults of the last fields */
    Py_ssize_t fields, required;
    Py_ssize_t offsets[MAX_FIELDS];
} SlotsInit;

static PyObject *
missing(SlotsInit *self, Py_ssize_t i)
{
    PyErr_Format(PyExc_TypeError, "%s.__init__() missing required argument: '%U'", self->cls->tp_name,
                 PyTuple_GET_ITEM(self->names, i));
    return NULL;
}

static PyObject *
slots_init_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SlotsInit *self = (SlotsInit *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), n = self->fields;
    if (nargs < 1 || !PyObject_TypeCheck(args[0], self->cls)) {
        PyErr_Format(PyExc_TypeError, "%s.__init__() needs a %s instance", self->cls->tp_name, self->cls->tp_name);
        return NULL;
    }
    PyObject *obj = args[0], *values[MAX_FIELDS];
    Py_ssize_t positional = nargs - 1;
    if (positional > n) {
        PyErr_Format(PyExc_TypeError, "%s.__init__() takes %zd positional arguments but %zd were given",
                     self->cls->tp_name, n + 1, nargs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        values[i] = i < positional ? args[1 + i] : NULL;
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < keywords; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i = 0;
        while (i < n && PyTuple_GET_ITEM(self->names, i) != name)  /* interned: usually the same object */
            i++;
        for (Py_ssize_t j = 0; i == n && j < n; j++) {
            int equal = PyObject_RichCompareBool(PyTuple_GET_ITEM(self->names, j), name, Py_EQ);
            if (equal < 0)
                return NULL;
            if (equal)
                i = j;
        }
        if (i == n) {
            PyErr_Format(PyExc_TypeError, "%s.__init__() got an unexpected keyword argument '%U'",
                         self->cls->tp_name, name);
            return NULL;
        }
        if (values[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s.__init__() got multiple values for argument '%U'",
                         self->cls->tp_name, name);
            return NULL;
        }
        values[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (values[i] != NULL)
            continue;
        if (i < self->required)
            return missing(self, i);
        values[i] = PyTuple_GET_ITEM(self->defaults, i - self->required);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject **slot = (PyObject **)((char *)obj + self->offsets[i]);
        Py_XSETREF(*slot, Py_NewRef(values[i]));
    }
    Py_RETURN_NONE;
}

static PyObject *
slots_init_get(PyObject *self, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int
slots_init_traverse(SlotsInit *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    Py_VISIT(self->names);
    Py_VISIT(self->defaults);
    return 0;
}

static int
slots_init_clear(SlotsInit *self)
{
    Py_CLEAR(self->cls);
    Py_CLEAR(self->names);
    Py_CLEAR(self->defaults);
    return 0;
}

static void
slots_init_dealloc(SlotsInit *self)
{
    PyObject_GC_UnTrack(self);
    slots_init_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject SlotsInitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gateway._speedups.SlotsInit",
    .tp_basicsize = sizeof(SlotsInit),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "A C __init__ that stores its arguments in a frozen class's slots.",
    .tp_vectorcall_offset = offsetof(SlotsInit, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = slots_init_get,
    .tp_traverse = (traverseproc)slots_init_traverse,
    .tp_clear = (inquiry)slots_init_clear,
    .tp_dealloc = (destructor)slots_init_dealloc,
};

static PyObject *
init(PyObject *module, PyObject *args)
{
    PyTypeObject *cls;
    PyObject *names, *defaults;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyType_Type, &cls, &PyTuple_Type, &names, &PyTuple_Type, &defaults))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names), d = PyTuple_GET_SIZE(defaults);
    if (n > MAX_FIELDS || d > n) {
        PyErr_SetString(PyExc_ValueError, "too many fields or defaults");
        return NULL;
    }
    SlotsInit *self = PyObject_GC_New(SlotsInit, &SlotsInitType);
    if (self == NULL)
        return NULL;
    self->vectorcall = slots_init_call;
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    self->names = PyTuple_New(n);
    self->defaults = Py_NewRef(defaults);
    self->fields = n;
    self->required = n - d;
    PyObject_GC_Track(self);
    if (self->names == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = Py_NewRef(PyTuple_GET_ITEM(names, i));
        if (!PyUnicode_Check(name)) {
            Py_DECREF(name);
            PyErr_SetString(PyExc_TypeError, "field names are str");
            goto fail;
        }
        PyUnicode_InternInPlace(&name);
        PyTuple_SET_ITEM(self->names, i, name);
        self->offsets[i] = slot_offset(cls, name, 1);
        if (self->offsets[i] < 0) {
            PyErr_Format(PyExc_TypeError, "%U is not a slot of %s", name, cls->tp_name);
            goto fail;
        }
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* ------------------------------------------------------------------------------ partitioners */

static uint64_t
fnv1a_64_of(const unsigned char *p, Py_ssize_t length)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (Py_ssize_t i = 0; i < length; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* ``hash`` of the bytes-like ``key``, as a Python int. */
static PyObject *
hashed(PyObject *key, uint64_t (*hash)(const unsigned char *, Py_ssize_t))
{
    Py_buffer buf;
    if (PyObject_GetBuffer(key, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t h = hash(buf.buf, buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *
fnv1a_32(PyObject *module, PyObject *key)
{
    (void)module;
    return hashed(key, fnv1a_32_of);
}

static PyObject *
fnv1a_64(PyObject *module, PyObject *key)
{
    (void)module;
    return hashed(key, fnv1a_64_of);
}

static PyObject *
murmur2(PyObject *module, PyObject *key)
{
    (void)module;
    return hashed(key, murmur2_of);
}

enum { CUT_BIG_ENDIAN = 1, CUT_SIGNED = 2, CUT_VARINT = 4, CUT_MUTABLE = 8 };

/* The body size of the frame at p (avail bytes there) and where its body starts (*body), or -1 to stop. */
static inline long long
frame_size(const unsigned char *p, Py_ssize_t avail, Py_ssize_t size_at, int width, long flags, Py_ssize_t *body)
{
    if (flags & CUT_VARINT) {
        unsigned long long size = 0;
        for (int i = 0; i < width; i++) {
            if (size_at + i >= avail)
                return -1;
            unsigned char b = p[size_at + i];
            size |= (unsigned long long)(b & 0x7f) << (7 * i);
            if (!(b & 0x80)) {
                *body = size_at + i + 1;
                return size > (unsigned long long)LLONG_MAX ? -1 : (long long)size;
            }
        }
        return -1;
    }
    if (size_at + width > avail)
        return -1;
    uint64_t v = 0;
    const unsigned char *f = p + size_at;
    if (flags & CUT_BIG_ENDIAN)
        v = be(f, width);
    else
        for (int i = width - 1; i >= 0; i--)
            v = (v << 8) | f[i];
    *body = size_at + width;
    if ((flags & CUT_SIGNED) && width < 8 && (v >> (8 * width - 1)))
        return -1;  /* negative */
    if (v > (uint64_t)LLONG_MAX)
        return -1;
    return (long long)v;
}

static PyObject *
cut_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8 || !PyByteArray_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "cut_frames(data: bytearray, pos, size_at, size_width, flags, max_size, most, budget)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), size_at = PyLong_AsSsize_t(args[2]);
    long width = PyLong_AsLong(args[3]), flags = PyLong_AsLong(args[4]);
    long long max_size = PyLong_AsLongLong(args[5]);
    Py_ssize_t most = PyLong_AsSsize_t(args[6]), budget = PyLong_AsSsize_t(args[7]), total = 0;
    if (PyErr_Occurred())
        return NULL;
    if (width < 1 || width > 8 || size_at < 0 || pos < 0) {
        PyErr_SetString(PyExc_ValueError, "cut_frames: bad size field");
        return NULL;
    }
    PyObject *frames = PyList_New(0);
    if (frames == NULL)
        return NULL;
    Py_ssize_t end = PyByteArray_GET_SIZE(args[0]);
    while (PyList_GET_SIZE(frames) < most && total < budget && pos < end) {
        /* The bytearray's storage is read again each time: nothing below runs Python code, but
         * the address is cheap to take and this way no stale pointer can survive a change. */
        const unsigned char *p = (const unsigned char *)PyByteArray_AS_STRING(args[0]) + pos;
        Py_ssize_t avail = end - pos, body_at;
        long long size = frame_size(p, avail, size_at, (int)width, flags, &body_at);
        if (size < 0 || size > max_size || size > avail - body_at)
            break;
        PyObject *header = PyBytes_FromStringAndSize((const char *)p, body_at);
        PyObject *body = flags & CUT_MUTABLE ? PyByteArray_FromStringAndSize((const char *)p + body_at, size)
                                             : PyBytes_FromStringAndSize((const char *)p + body_at, size);
        PyObject *frame = header && body ? PyTuple_Pack(2, header, body) : NULL;
        Py_XDECREF(header);
        Py_XDECREF(body);
        if (frame == NULL || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            Py_DECREF(frames);
            return NULL;
        }
        Py_DECREF(frame);
        pos += body_at + size;
        total += body_at + size;
    }
    PyObject *out = Py_BuildValue("(Nn)", frames, pos);
    return out;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "A C __init__ for a frozen, slotted class: init(cls, names, defaults)."},
    {"fnv1a_32", fnv1a_32, METH_O, "FNV-1a 32 of a key."},
    {"fnv1a_64", fnv1a_64, METH_O, "FNV-1a 64 of a key."},
    {"murmur2", murmur2, METH_O, "Kafka's murmur2 of a key, as an unsigned 32-bit int."},
    {"cut_frames", (PyCFunction)(void (*)(void))cut_frames, METH_FASTCALL,
     "The whole frames at the front of a receive buffer (gateway.codec.framing)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "The gateway core's optional C loops.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&SlotsInitType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
