/* The V1 record loop of conversions in C (optional; format.py has the same in Python).
 *
 * read_records(payloads, bases, offsets, timestamps, keys, values) -> None
 *     appends the fields of every record of every payload (a stored V1 batch) to the
 *     lists, as ``V1Format.columns`` does: the offset is the payload's base offset plus
 *     the record's offset delta; a negative length is a null key or value.
 *     Raises ValueError on a record that runs past the end of its payload.
 * encode_records(offsets, base_offset, timestamps, keys, values) -> bytes
 *     the payload of a V1 batch, as ``format._encode_records`` writes it (keys bytes or None,
 *     values bytes); TypeError or OverflowError for what only the Python loop takes (other
 *     types, an offset delta outside 32 bits, a timestamp outside 64).
 * count_records(payload) -> int
 *     the number of whole records of a produced payload, as ``V1Format.validate`` counts them;
 *     ValueError when the last one is cut short.
 * number_records(payload) -> bytes
 *     ``payload`` (whole records, as ``count_records`` checked) with the records' offset deltas
 *     set to 0, 1, 2..., as ``V1Format.assign_offsets`` numbers joined one-record payloads;
 *     the payload itself when they already are. ValueError when a record is cut short.
 * parse_produce(line, timestamp) -> (cid, topic, key, payload, acks) | None
 *     a plain PRODUCE line, as ``codec._parse_produce`` parses it: ``V1|<cid>|PRODUCE|<topic>
 *     <key>:<value>[ <acks>]``, every field printable ASCII, one space between arguments. The
 *     payload is the record as ``format.encode_keyed(timestamp, key, value)`` writes it; acks is
 *     the third argument's text or None. None for every other line (the codec's general parser
 *     takes it).
 * take_produces(lines, timestamp, limit, max_len, kinds, modes, leader) -> [Handled, ...]
 *     the requests of the first lines of the iterable ``lines`` (bytes), as ``codec._take_produces``
 *     makes them: up to ``limit`` of them, stopping before the first line that is not a plain
 *     PRODUCE line, is longer than ``max_len`` bytes or names an ack mode that is not one of
 *     ``modes`` (lower-case text -> mode; none named: ``leader``). Each is
 *     ``Handled((Produce(topic, None, Batch(format, record, 1, timestamp), mode, None, key,
 *     partitioner, True),), Produced(cid), b"", False, "", False, True, True, None, 1)``, with
 *     ``kinds`` = (Produce, Batch, Produced, Handled, format, partitioner, b"", "").
 * stored_lines(parts, results, produced) -> bytes | None | NotImplemented
 *     the answer lines of a run of plain PRODUCE lines (``parts``: their ``Handled``s, whose
 *     render is a ``produced`` each) whose records were all stored (``results``: one
 *     ``ProduceResult`` each, no error), as ``codec._stored_lines`` writes them; None for any
 *     other run; NotImplemented for a run only the Python loop writes (an offset or a
 *     correlation id it does not take).
 */
#include "_speedups.h"
#include <limits.h>
#include <string.h>

/* The i32-length-prefixed field at p[*pos] (None for a negative length); moves *pos past it. */
static PyObject *
field(const unsigned char *p, Py_ssize_t len, Py_ssize_t *pos)
{
    if (len - *pos < 4) {
        PyErr_SetString(PyExc_ValueError, "a record runs past the end of its batch");
        return NULL;
    }
    int32_t n = (int32_t)be(p + *pos, 4);
    *pos += 4;
    if (n < 0)
        return Py_NewRef(Py_None);
    if (n > len - *pos) {
        PyErr_SetString(PyExc_ValueError, "a record runs past the end of its batch");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)p + *pos, n);
    *pos += n;
    return out;
}

static int
read_payload(const unsigned char *p, Py_ssize_t len, long long base, PyObject *offsets, PyObject *timestamps,
             PyObject *keys, PyObject *values)
{
    Py_ssize_t pos = 0;
    while (pos < len) {
        if (len - pos < 12) {
            PyErr_SetString(PyExc_ValueError, "a record runs past the end of its batch");
            return -1;
        }
        uint64_t delta = be(p + pos, 4);
        int64_t ts = (int64_t)be(p + pos + 4, 8);
        pos += 12;
        if (append_new(keys, field(p, len, &pos)) < 0 || append_new(values, field(p, len, &pos)) < 0 ||
            append_new(offsets, base < 0 ? PyLong_FromLongLong(base + (long long)delta)
                                         : PyLong_FromUnsignedLongLong((unsigned long long)base + delta)) < 0 ||
            append_new(timestamps, PyLong_FromLongLong(ts)) < 0)
            return -1;
    }
    return 0;
}

static PyObject *
read_records(PyObject *self, PyObject *args)
{
    PyObject *payloads, *bases, *offsets, *timestamps, *keys, *values;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!", &PyList_Type, &payloads, &PyList_Type, &bases, &PyList_Type,
                          &offsets, &PyList_Type, &timestamps, &PyList_Type, &keys, &PyList_Type, &values))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    if (PyList_GET_SIZE(bases) != n) {
        PyErr_SetString(PyExc_ValueError, "one base offset per payload");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long base;
        if (list_int64(bases, i, &base) < 0)
            return NULL;
        Py_buffer buf;
        if (PyObject_GetBuffer(PyList_GET_ITEM(payloads, i), &buf, PyBUF_SIMPLE) < 0)
            return NULL;
        int r = read_payload(buf.buf, buf.len, base, offsets, timestamps, keys, values);
        PyBuffer_Release(&buf);
        if (r < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
encode_records(PyObject *self, PyObject *args)
{
    PyObject *offsets, *stamps, *keys, *values;
    long long base;
    (void)self;
    if (record_columns(args, "record", &offsets, &base, &stamps, &keys, &values) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    /* First pass: check the types and ranges, size the payload. */
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        if ((key != Py_None && !PyBytes_Check(key)) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes or None, values bytes");
            return NULL;
        }
        long long offset, ts;
        if (list_int64(offsets, i, &offset) < 0 || list_int64(stamps, i, &ts) < 0)
            return NULL;
        if (offset < base || (unsigned long long)offset - (unsigned long long)base > 0xFFFFFFFFu ||
            (key != Py_None && PyBytes_GET_SIZE(key) > INT32_MAX) || PyBytes_GET_SIZE(value) > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "an offset delta, key or value outside its field");
            return NULL;
        }
        size += 20 + (key != Py_None ? PyBytes_GET_SIZE(key) : 0) + PyBytes_GET_SIZE(value);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    /* Second pass: write (the first one checked everything that can fail). */
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        p = put_be(p, (uint64_t)(PyLong_AsLongLong(PyList_GET_ITEM(offsets, i)) - base), 4);
        p = put_be(p, (uint64_t)PyLong_AsLongLong(PyList_GET_ITEM(stamps, i)), 8);
        if (key == Py_None) {
            p = put_be(p, 0xFFFFFFFFu, 4);
        } else {
            p = put_be(p, (uint64_t)PyBytes_GET_SIZE(key), 4);
            memcpy(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
            p += PyBytes_GET_SIZE(key);
        }
        p = put_be(p, (uint64_t)PyBytes_GET_SIZE(value), 4);
        memcpy(p, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        p += PyBytes_GET_SIZE(value);
    }
    return out;
}

static PyObject *
count_records(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t len = buf.len, pos = 0, count = 0;
    while (pos < len) {
        pos += 12; /* offset delta, timestamp */
        for (int f = 0; f < 2 && pos <= len; f++) { /* key, value: i32 length (-1: null) | bytes */
            if (len - pos < 4) {
                pos = len + 1;
                break;
            }
            int32_t n = (int32_t)be(p + pos, 4);
            pos += 4 + (n > 0 ? n : 0);
        }
        count++;
    }
    PyBuffer_Release(&buf);
    if (pos != len) {
        PyErr_SetString(PyExc_ValueError, "a record cut short");
        return NULL;
    }
    return PyLong_FromSsize_t(count);
}

static PyObject *
number_records(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *payload;
    if (!PyArg_ParseTuple(args, "S", &payload))
        return NULL;
    const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload), pos = 0;
    uint32_t index = 0;
    PyObject *out = NULL;
    unsigned char *dst = NULL;
    while (pos < len) {
        if (len - pos < 12)
            goto cut;
        if (dst == NULL && (uint32_t)be(src + pos, 4) != index) { /* the first delta to change: copy */
            out = PyBytes_FromStringAndSize((const char *)src, len);
            if (out == NULL)
                return NULL;
            dst = (unsigned char *)PyBytes_AS_STRING(out);
        }
        if (dst != NULL) {
            dst[pos] = (unsigned char)(index >> 24);
            dst[pos + 1] = (unsigned char)(index >> 16);
            dst[pos + 2] = (unsigned char)(index >> 8);
            dst[pos + 3] = (unsigned char)index;
        }
        pos += 12;
        for (int f = 0; f < 2; f++) { /* key, value: i32 length (-1: null) | bytes */
            if (len - pos < 4)
                goto cut;
            int32_t n = (int32_t)be(src + pos, 4);
            pos += 4;
            if (n > 0) {
                if (n > len - pos)
                    goto cut;
                pos += n;
            }
        }
        index++;
    }
    return out != NULL ? out : Py_NewRef(payload);
cut:
    Py_XDECREF(out);
    PyErr_SetString(PyExc_ValueError, "a record cut short");
    return NULL;
}

/* The length of the run of printable ASCII bytes (0x21-0x7e) at p[pos], stopping at ``stop`` (-1: none). */
static Py_ssize_t
printable(const unsigned char *p, Py_ssize_t len, Py_ssize_t pos, int stop)
{
    Py_ssize_t start = pos;
    while (pos < len && p[pos] > 0x20 && p[pos] < 0x7f && p[pos] != stop)
        pos++;
    return pos - start;
}

/* A plain PRODUCE line's fields (see parse_produce), each a new reference. */
typedef struct {
    PyObject *cid, *topic, *key, *payload, *acks;
} Fields;

static void
fields_clear(Fields *f)
{
    Py_CLEAR(f->cid);
    Py_CLEAR(f->topic);
    Py_CLEAR(f->key);
    Py_CLEAR(f->payload);
    Py_CLEAR(f->acks);
}

/* The fields of the plain PRODUCE line p[:len] in *f (see parse_produce): 1; 0 (*f untouched) for any other
 * line; -1 with an exception set when memory runs out. ``topic_seen`` (or NULL) is a str the topic may equal,
 * the previous line's: then it is the topic, not a new str (a burst's lines name one topic, and an equal
 * object is hashed once). */
static int
plain_produce(const unsigned char *p, Py_ssize_t len, long long timestamp, PyObject *topic_seen, Fields *f)
{
    Py_ssize_t pos, cid, topic, key, kv, acks = 0;
    if (len < 3 || memcmp(p, "V1|", 3) != 0)
        return 0;
    pos = 3;
    if (!(cid = printable(p, len, pos, '|')) || len - pos - cid < 9 || memcmp(p + pos + cid, "|PRODUCE|", 9) != 0)
        return 0;
    pos += cid + 9;
    if (!(topic = printable(p, len, pos, -1)) || pos + topic >= len || p[pos + topic] != ' ')
        return 0;
    Py_ssize_t topic_at = pos, kv_at = pos + topic + 1;
    kv = printable(p, len, kv_at, -1);
    key = printable(p, len, kv_at, ':');
    if (!kv || key == kv)  /* no value separator: the general parser says why */
        return 0;
    pos = kv_at + kv;
    if (pos < len) {
        if (p[pos] != ' ' || !(acks = printable(p, len, pos + 1, -1)) || pos + 1 + acks != len)
            return 0;
    }
    Py_ssize_t value = kv - key - 1;
    int seen = topic_seen != NULL && PyUnicode_IS_COMPACT_ASCII(topic_seen) &&
               PyUnicode_GET_LENGTH(topic_seen) == topic && memcmp(PyUnicode_DATA(topic_seen), p + topic_at, topic) == 0;
    /* Each made once the one before is (no call with an exception set): the last is NULL if any failed. */
    f->cid = PyUnicode_DecodeASCII((const char *)p + 3, cid, NULL);
    f->topic = f->cid == NULL ? NULL
               : seen         ? Py_NewRef(topic_seen)
                              : PyUnicode_DecodeASCII((const char *)p + topic_at, topic, NULL);
    f->key = f->topic == NULL ? NULL : PyBytes_FromStringAndSize((const char *)p + kv_at, key);
    f->payload = f->key == NULL ? NULL : PyBytes_FromStringAndSize(NULL, 16 + key + 4 + value);
    f->acks = f->payload == NULL ? NULL
              : acks             ? PyUnicode_DecodeASCII((const char *)p + pos + 1, acks, NULL)
                                 : Py_NewRef(Py_None);
    if (f->acks == NULL) {
        fields_clear(f);
        return -1;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(f->payload);
    w = put_be(w, 0, 4);
    w = put_be(w, (uint64_t)timestamp, 8);
    w = put_be(w, (uint64_t)key, 4);
    memcpy(w, p + kv_at, key);
    w = put_be(w + key, (uint64_t)value, 4);
    memcpy(w, p + kv_at + key + 1, value);
    return 1;
}

static PyObject *
parse_produce(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    long long timestamp;
    Fields f;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*L", &buf, &timestamp))
        return NULL;
    int parsed = plain_produce(buf.buf, buf.len, timestamp, NULL, &f);
    PyBuffer_Release(&buf);
    if (parsed <= 0)
        return parsed ? NULL : Py_NewRef(Py_None);
    PyObject *out = PyTuple_Pack(5, f.cid, f.topic, f.key, f.payload, f.acks);
    fields_clear(&f);
    return out;
}

/* The ack mode of a plain PRODUCE line's third argument ``text`` (as ``handlers._acks`` reads it:
 * ``acks=0|1|all``, any case) from ``modes`` (lower-case text -> mode): a borrowed reference, or
 * NULL (no exception set) for any other text. */
static PyObject *
ack_mode(PyObject *modes, PyObject *text)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    char lower[16];
    if (n >= (Py_ssize_t)sizeof lower)
        return NULL;
    const char *ascii = PyUnicode_AsUTF8(text); /* printable ASCII: the parser took nothing else */
    if (ascii == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        lower[i] = (char)(ascii[i] >= 'A' && ascii[i] <= 'Z' ? ascii[i] + 32 : ascii[i]);
    PyObject *key = PyUnicode_FromStringAndSize(lower, n);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *mode = PyDict_GetItemWithError(modes, key);
    Py_DECREF(key);
    return mode;
}

/* ``handled((Produce(topic, None, Batch(name, payload, 1, timestamp), mode, None, key, partitioner, True),),
 * produced(cid), b"", False, "", False, True, True, None, 1)``: the request of one plain PRODUCE line. */
static PyObject *
produce_request(PyObject *kinds, const Fields *f, PyObject *mode, PyObject *stamp)
{
    PyObject *produce = PyTuple_GET_ITEM(kinds, 0), *batch_type = PyTuple_GET_ITEM(kinds, 1),
             *produced = PyTuple_GET_ITEM(kinds, 2), *name = PyTuple_GET_ITEM(kinds, 4),
             *partitioner = PyTuple_GET_ITEM(kinds, 5), *empty = PyTuple_GET_ITEM(kinds, 6);
    PyTypeObject *handled = (PyTypeObject *)PyTuple_GET_ITEM(kinds, 3);
    PyObject *one = PyLong_FromLong(1);
    PyObject *batch_args[] = {name, f->payload, one, stamp};
    PyObject *batch = PyObject_Vectorcall(batch_type, batch_args, 4, NULL);
    Py_DECREF(one);
    if (batch == NULL)
        return NULL;
    PyObject *command_args[] = {f->topic, Py_None, batch, mode, Py_None, f->key, partitioner, Py_True};
    PyObject *command = PyObject_Vectorcall(produce, command_args, 8, NULL);
    Py_DECREF(batch);
    if (command == NULL)
        return NULL;
    PyObject *commands = PyTuple_Pack(1, command);
    Py_DECREF(command);
    PyObject *render = commands == NULL ? NULL : PyObject_Vectorcall(produced, &f->cid, 1, NULL);
    PyObject *out = render == NULL ? NULL : handled->tp_alloc(handled, 10);
    if (out == NULL) {
        Py_XDECREF(commands);
        Py_XDECREF(render);
        return NULL;
    }
    PyObject *items[] = {commands, render, Py_NewRef(empty), Py_NewRef(Py_False), Py_NewRef(PyTuple_GET_ITEM(kinds, 7)),
                         Py_NewRef(Py_False), Py_NewRef(Py_True), Py_NewRef(Py_True), Py_NewRef(Py_None),
                         PyLong_FromLong(1)};
    for (int i = 0; i < 10; i++)
        PyTuple_SET_ITEM(out, i, items[i]);
    return out;
}

static PyObject *
take_produces(PyObject *self, PyObject *args)
{
    PyObject *lines, *kinds, *modes, *leader, *line;
    long long timestamp;
    Py_ssize_t limit, max_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "OLnnO!O!O", &lines, &timestamp, &limit, &max_len, &PyTuple_Type, &kinds,
                          &PyDict_Type, &modes, &leader))
        return NULL;
    if (PyTuple_GET_SIZE(kinds) != 8 || !PyType_Check(PyTuple_GET_ITEM(kinds, 3)) ||
        !PyType_IsSubtype((PyTypeObject *)PyTuple_GET_ITEM(kinds, 3), &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "kinds: (Produce, Batch, Produced, Handled, format, partitioner, b'', '')");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(lines);
    PyObject *out = it == NULL ? NULL : PyList_New(0);
    if (out == NULL) {
        Py_XDECREF(it);
        return NULL;
    }
    PyObject *topic_seen = NULL;                       /* the last line's topic */
    PyObject *stamp = PyLong_FromLongLong(timestamp); /* every record's: one int for them all */
    if (stamp == NULL)
        goto fail;
    while (PyList_GET_SIZE(out) < limit && (line = PyIter_Next(it)) != NULL) {
        Fields f;
        int parsed = PyBytes_Check(line) && PyBytes_GET_SIZE(line) <= max_len
            ? plain_produce((const unsigned char *)PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), timestamp,
                            topic_seen, &f)
            : 0;
        Py_DECREF(line);
        if (parsed < 0)
            goto fail;
        if (parsed == 0)
            break;
        Py_XSETREF(topic_seen, Py_NewRef(f.topic));
        PyObject *mode = f.acks == Py_None ? leader : ack_mode(modes, f.acks);
        PyObject *request = mode == NULL ? NULL : produce_request(kinds, &f, mode, stamp);
        fields_clear(&f);
        if (mode == NULL) /* a wrong ack mode: handle_frame answers it */
            break;
        if (append_new(out, request) < 0)
            goto fail;
    }
    Py_DECREF(it);
    Py_XDECREF(topic_seen);
    Py_XDECREF(stamp);
    if (PyErr_Occurred()) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
fail:
    Py_DECREF(it);
    Py_XDECREF(topic_seen);
    Py_XDECREF(stamp);
    Py_DECREF(out);
    return NULL;
}

/* The attribute names stored_lines reads, made once. */
static PyObject *ERROR, *PARTITION, *BASE_OFFSET, *HIGH_WATERMARK, *CID;

static int
names(void)
{
    if (CID != NULL)
        return 0;
    ERROR = PyUnicode_InternFromString("error");
    PARTITION = PyUnicode_InternFromString("partition");
    BASE_OFFSET = PyUnicode_InternFromString("base_offset");
    HIGH_WATERMARK = PyUnicode_InternFromString("high_watermark");
    CID = PyUnicode_InternFromString("cid");
    return CID == NULL || HIGH_WATERMARK == NULL || BASE_OFFSET == NULL || PARTITION == NULL || ERROR == NULL ? -1 : 0;
}

/* What stored_lines reads of each result (a run's results are of one class): where that class keeps it. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t error, partition, base_offset, high_watermark;
} ResultSlots;

static ResultSlots
result_slots(PyObject *result)
{
    PyTypeObject *type = Py_TYPE(result);
    return (ResultSlots){type, slot_offset(type, ERROR, 0), slot_offset(type, PARTITION, 0),
                         slot_offset(type, BASE_OFFSET, 0), slot_offset(type, HIGH_WATERMARK, 0)};
}

/* The int attribute ``name`` of ``obj`` (at ``offset`` of a ``type``: ``slot_or_attr``) in *out: 0; 1 for another
 * type or an int outside 64 bits (which only Python writes); -1 with an exception set when ``obj`` has no such
 * attribute. */
static int
int_attr(PyObject *obj, PyTypeObject *type, Py_ssize_t offset, PyObject *name, long long *out)
{
    PyObject *value = slot_or_attr(obj, type, offset, name);
    if (value == NULL)
        return -1;
    int overflow = 0;
    *out = PyLong_CheckExact(value) ? PyLong_AsLongLongAndOverflow(value, &overflow) : 0;
    int other = !PyLong_CheckExact(value) || overflow || *out == LLONG_MIN;
    Py_DECREF(value);
    return other;
}

/* Write ``v`` in decimal at ``p``; the position after it. */
static char *
put_decimal(char *p, long long v)
{
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    if (v < 0)
        *p++ = '-';
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n)
        *p++ = digits[--n];
    return p;
}

static PyObject *
stored_lines(PyObject *self, PyObject *args)
{
    PyObject *parts, *results, *produced;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &parts, &results, &produced) || names() < 0)
        return NULL;
    if (!PyList_Check(parts) || !PyList_Check(results))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t n = PyList_GET_SIZE(parts);
    if (PyList_GET_SIZE(results) != n)
        Py_RETURN_NONE;
    if (!PyType_Check(produced))
        return Py_NewRef(Py_NotImplemented);
    Py_ssize_t cap = 64 * n + 64, size = 0, cid_at = slot_offset((PyTypeObject *)produced, CID, 0);
    ResultSlots at = n ? result_slots(PyList_GET_ITEM(results, 0)) : (ResultSlots){NULL, -1, -1, -1, -1};
    char *out = PyMem_Malloc(cap);
    if (out == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *part = PyList_GET_ITEM(parts, i), *result = PyList_GET_ITEM(results, i);
        if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) < 2 || Py_TYPE(PyTuple_GET_ITEM(part, 1)) != (PyTypeObject *)produced)
            goto other;
        PyObject *error = slot_or_attr(result, at.type, at.error, ERROR);
        if (error == NULL)
            goto fail;
        Py_DECREF(error);
        if (error != Py_None)
            goto other;
        long long partition, offset, hw;
        int r = int_attr(result, at.type, at.partition, PARTITION, &partition);
        if (r == 0)
            r = int_attr(result, at.type, at.base_offset, BASE_OFFSET, &offset);
        if (r == 0)
            r = int_attr(result, at.type, at.high_watermark, HIGH_WATERMARK, &hw);
        if (r != 0) {
            if (r < 0)
                goto fail;
            goto python;
        }
        PyObject *cid = slot_or_attr(PyTuple_GET_ITEM(part, 1), (PyTypeObject *)produced, cid_at, CID);
        if (cid == NULL)
            goto fail;
        Py_ssize_t cid_len = 0;
        const char *cid_text = PyUnicode_Check(cid) ? PyUnicode_AsUTF8AndSize(cid, &cid_len) : NULL;
        if (cid_text == NULL) {
            Py_DECREF(cid);
            PyErr_Clear();
            goto python;
        }
        if (cap - size < cid_len + 128) {
            cap = 2 * cap + cid_len + 128;
            char *grown = PyMem_Realloc(out, cap);
            if (grown == NULL) {
                Py_DECREF(cid);
                PyErr_NoMemory();
                goto fail;
            }
            out = grown;
        }
        char *w = out + size;
        memcpy(w, "V1|", 3);
        memcpy(w + 3, cid_text, cid_len);
        Py_DECREF(cid);
        w += 3 + cid_len;
        memcpy(w, "|OK|partition=", 14);
        w = put_decimal(w + 14, partition);
        memcpy(w, " offset=", 8);
        w = put_decimal(w + 8, offset);
        memcpy(w, " hw=", 4);
        w = put_decimal(w + 4, hw - 1);
        *w++ = '\n';
        size = w - out;
    }
    PyObject *answers = PyBytes_FromStringAndSize(out, size);
    PyMem_Free(out);
    return answers;
python:
    PyMem_Free(out);
    return Py_NewRef(Py_NotImplemented);
other:
    PyMem_Free(out);
    Py_RETURN_NONE;
fail:
    PyMem_Free(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"number_records", number_records, METH_VARARGS, "A V1 payload with its records numbered 0, 1, 2..."},
    {"count_records", count_records, METH_VARARGS, "The number of whole records of a produced V1 payload."},
    {"read_records", read_records, METH_VARARGS, "Append the fields of stored V1 records to column lists."},
    {"encode_records", encode_records, METH_VARARGS, "The payload of a V1 batch."},
    {"parse_produce", parse_produce, METH_VARARGS, "A plain PRODUCE line's fields and record, or None."},
    {"take_produces", take_produces, METH_VARARGS, "The requests of the leading plain PRODUCE lines."},
    {"stored_lines", stored_lines, METH_VARARGS, "The answers of a run of stored plain PRODUCE lines, or None."},
    {NULL, NULL, 0, NULL},
};

SPEEDUPS_MODULE("The V1 record loops in C.", methods)
