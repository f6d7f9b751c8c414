/* The ``mqtt`` storage format's record loops, and the PUBLISH parse, in C (optional; format.py and
 * packets.py have the same in Python).
 *
 * parse_publish(flags, body) -> (topic, qos, packet_id, payload)
 *     a 3.1.1 PUBLISH body: ``packets._parse_publish``, raising its MalformedPacket in its words.
 * publish_run(first, header_byte, frames, timestamp, headers, ack_head, budget, version5)
 *         -> (records, count, acks, last_payload)
 *     the records of a run of PUBLISHes to one topic name at QoS 0 or 1 (MQTT 5 ones without
 *     properties): ``first`` (a body the PUBLISH parse took), then the frames at the front of the
 *     deque ``frames`` that are like it, popped: ``packets._publish_run``, the same bytes.
 * count_records(payload) -> int
 *     the records of ``payload`` (a bytes-like object), which must be whole records numbered
 *     0, 1, 2... with nothing after the last, at least one: ``format._count_records``; raises
 *     ValueError naming the first fault, in the same words.
 * encode_record(offset_delta, timestamp, qos, key, value, headers=b"") -> bytes
 *     one record: ``format._encode_record`` (every stored PUBLISH is one); key and value bytes-like
 *     or None (null), headers an encoded headers section (with one, the qos byte gets the HEADERS
 *     bit); struct.error, as ``struct`` raises it, for a number its field does not hold.
 * deliveries(payload, base_offset) -> list
 *     ``(offset, qos, key, value, headers)`` of each record of a stored payload: what
 *     ``MqttFormat.deliveries`` yields (a null key None, a null value b"", headers the encoded
 *     section, b"" without); struct.error for a record cut short.
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

static PyObject *struct_error; /* struct.error: what the Python twin's packing raises */
static PyObject *qos_numbers;  /* (0, 1, 2) */

static int
field(PyObject *number, long long low, long long high, long long *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < low || v > high) {
        PyErr_SetString(struct_error, "a record field out of range");
        return -1;
    }
    *out = v;
    return 0;
}

static inline void
put_u32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v;
}

static PyObject *
encode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 6) {
        PyErr_SetString(PyExc_TypeError, "encode_record takes 5 or 6 arguments");
        return NULL;
    }
    long long delta, ts, qos;
    if (field(args[0], 0, 0xFFFFFFFFLL, &delta) < 0 || field(args[1], INT64_MIN, INT64_MAX, &ts) < 0
        || field(args[2], 0, 0xFF, &qos) < 0)
        return NULL;
    Py_buffer key = {0}, value = {0}, headers = {0};
    PyObject *out = NULL;
    int has_key = args[3] != Py_None, has_value = args[4] != Py_None;
    if (has_key && PyObject_GetBuffer(args[3], &key, PyBUF_SIMPLE) < 0)
        return NULL;
    if (has_value && PyObject_GetBuffer(args[4], &value, PyBUF_SIMPLE) < 0)
        goto done;
    if (nargs == 6 && PyObject_GetBuffer(args[5], &headers, PyBUF_SIMPLE) < 0)
        goto done;
    if (key.len > INT32_MAX || value.len > INT32_MAX || headers.len > INT32_MAX) {
        PyErr_SetString(struct_error, "a record field out of range");
        goto done;
    }
    if (headers.len)
        qos = HEADERS | (qos & 0x03);
    out = PyBytes_FromStringAndSize(NULL, HEAD_SIZE + key.len + 4 + value.len + (headers.len ? 4 + headers.len : 0));
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    uint64_t t = (uint64_t)ts;
    put_u32(w, (uint32_t)delta);
    put_u32(w + 4, (uint32_t)(t >> 32));
    put_u32(w + 8, (uint32_t)t);
    w[12] = (unsigned char)qos;
    put_u32(w + 13, has_key ? (uint32_t)key.len : 0xFFFFFFFFu);
    w += HEAD_SIZE;
    if (key.len)
        memcpy(w, key.buf, key.len), w += key.len;
    put_u32(w, has_value ? (uint32_t)value.len : 0xFFFFFFFFu);
    w += 4;
    if (value.len)
        memcpy(w, value.buf, value.len), w += value.len;
    if (headers.len) {
        put_u32(w, (uint32_t)headers.len);
        memcpy(w + 4, headers.buf, headers.len);
    }
done:
    if (key.obj)
        PyBuffer_Release(&key);
    if (value.obj)
        PyBuffer_Release(&value);
    if (headers.obj)
        PyBuffer_Release(&headers);
    return out;
}

static PyObject *
deliveries(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "deliveries takes a payload and its base offset");
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[1]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto failed;
    const unsigned char *p = view.buf;
    Py_ssize_t pos = 0, end = view.len;
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL)
        goto failed;
    while (pos < end) {
        if (end - pos < HEAD_SIZE)
            goto cut;
        uint32_t delta = get_u32(p + pos);
        unsigned int qos = p[pos + 12];
        int32_t klen = get_i32(p + pos + 13);
        pos += HEAD_SIZE;
        PyObject *key, *value, *headers, *item;
        if (klen < 0) {
            key = Py_NewRef(Py_None);
        } else {
            if (end - pos < klen)
                goto cut;
            key = PyBytes_FromStringAndSize((const char *)p + pos, klen);
            pos += klen;
        }
        if (key == NULL)
            goto failed_empty;
        if (end - pos < 4) {
            Py_DECREF(key);
            goto cut;
        }
        int32_t vlen = get_i32(p + pos);
        pos += 4;
        if (vlen > 0) {
            if (end - pos < vlen) {
                Py_DECREF(key);
                goto cut;
            }
            value = PyBytes_FromStringAndSize((const char *)p + pos, vlen);
            pos += vlen;
        } else {
            value = Py_NewRef(empty);
        }
        if (value == NULL) {
            Py_DECREF(key);
            goto failed_empty;
        }
        if (!(qos & HEADERS) || qos == UNKNOWN_QOS) {
            headers = Py_NewRef(empty);
        } else {
            int32_t hlen = end - pos < 4 ? -1 : get_i32(p + pos);
            if (hlen < 0 || end - pos - 4 < hlen) {
                Py_DECREF(key);
                Py_DECREF(value);
                goto cut;
            }
            headers = PyBytes_FromStringAndSize((const char *)p + pos + 4, hlen);
            pos += 4 + hlen;
            qos = (qos & 0x03) == 0x03 ? UNKNOWN_QOS : (qos & 0x03);
            if (headers == NULL) {
                Py_DECREF(key);
                Py_DECREF(value);
                goto failed_empty;
            }
        }
        PyObject *offset = PyLong_FromLongLong(base + (long long)delta);
        item = offset == NULL ? NULL : PyTuple_New(5);
        if (item == NULL) {
            Py_XDECREF(offset);
            Py_DECREF(key);
            Py_DECREF(value);
            Py_DECREF(headers);
            goto failed_empty;
        }
        PyTuple_SET_ITEM(item, 0, offset);
        PyTuple_SET_ITEM(item, 1, PyLong_FromLong(qos)); /* 0 to 255: a cached small int */
        PyTuple_SET_ITEM(item, 2, key);
        PyTuple_SET_ITEM(item, 3, value);
        PyTuple_SET_ITEM(item, 4, headers);
        int appended = PyList_Append(out, item);
        Py_DECREF(item);
        if (appended < 0)
            goto failed_empty;
    }
    Py_DECREF(empty);
    PyBuffer_Release(&view);
    return out;
cut:
    PyErr_SetString(struct_error, "a stored record cut short");
failed_empty:
    Py_DECREF(empty);
failed:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *malformed; /* properties.MalformedPacket: what a PUBLISH that breaks the spec raises */

static PyObject *
parse_publish(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "parse_publish takes the flags and the body");
        return NULL;
    }
    long flags = PyLong_AsLong(args[0]);
    if (flags == -1 && PyErr_Occurred())
        return NULL;
    int qos = (flags >> 1) & 3;
    if (qos == 3) {
        PyErr_SetString(malformed, "PUBLISH with QoS 3");
        return NULL;
    }
    Py_buffer body;
    if (PyObject_GetBuffer(args[1], &body, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = body.buf;
    PyObject *topic = NULL, *packet_id = NULL, *payload = NULL, *out = NULL;
    if (body.len < 2) {
        PyErr_SetString(malformed, "PUBLISH without a topic name");
        goto done;
    }
    Py_ssize_t end = 2 + ((Py_ssize_t)p[0] << 8 | p[1]), head = end + (qos ? 2 : 0);
    if (body.len < head) {
        PyErr_SetString(malformed, "PUBLISH shorter than its topic name and packet identifier");
        goto done;
    }
    topic = PyUnicode_DecodeUTF8((const char *)p + 2, end - 2, NULL);
    if (topic == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            PyErr_SetString(malformed, "PUBLISH topic name is not UTF-8");
        }
        goto done;
    }
    packet_id = qos ? PyLong_FromLong((long)p[end] << 8 | p[end + 1]) : Py_NewRef(Py_None);
    payload = PyBytes_FromStringAndSize((const char *)p + head, body.len - head);
    if (packet_id != NULL && payload != NULL)
        out = PyTuple_Pack(4, topic, PyTuple_GET_ITEM(qos_numbers, qos), packet_id, payload);
done:
    Py_XDECREF(topic);
    Py_XDECREF(packet_id);
    Py_XDECREF(payload);
    PyBuffer_Release(&body);
    return out;
}

static PyObject *popleft_name; /* "popleft" */

/* The size of the record a PUBLISH body makes whose topic name field ends at ``field_end`` and
 * whose payload starts at ``head`` (``publish_run``). */
static inline Py_ssize_t
run_record_size(Py_ssize_t body_len, Py_ssize_t field_end, Py_ssize_t head, Py_ssize_t headers_len)
{
    return HEAD_SIZE + (field_end - 2) + 4 + (body_len - head) + (headers_len ? 4 + headers_len : 0);
}

/* Whether ``item`` (a frame of ``frames``: ``(header, body)``, both bytes) is a PUBLISH like the
 * run's: its first byte ``header_byte``, its body starting with the run's topic name field
 * ``field`` (``field_end`` bytes) and as long as ``head`` at least; an MQTT 5 one (``version5``)
 * with a packet identifier other than 0 (at QoS 1) and no properties (a property length of 0,
 * the byte before ``head``). Its body in ``*body``. */
static inline int
like_run(PyObject *item, int header_byte, const char *field, Py_ssize_t field_end, Py_ssize_t head,
         int version5, PyObject **body)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
        return 0;
    PyObject *header = PyTuple_GET_ITEM(item, 0), *b = PyTuple_GET_ITEM(item, 1);
    if (!PyBytes_Check(header) || !PyBytes_Check(b) || PyBytes_GET_SIZE(header) < 1
        || (unsigned char)PyBytes_AS_STRING(header)[0] != header_byte || PyBytes_GET_SIZE(b) < head
        || memcmp(PyBytes_AS_STRING(b), field, field_end) != 0)
        return 0;
    const char *p = PyBytes_AS_STRING(b);
    if (version5 && (p[head - 1] != 0 || (head - field_end == 3 && p[field_end] == 0 && p[field_end + 1] == 0)))
        return 0;
    *body = b;
    return 1;
}

static PyObject *
publish_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "publish_run takes first, header_byte, frames, timestamp, headers, ack_head, budget, version5");
        return NULL;
    }
    int version5 = PyObject_IsTrue(args[7]);
    if (version5 < 0)
        return NULL;
    long long header_byte, ts, budget;
    if (field(args[1], 0, 0xFF, &header_byte) < 0 || field(args[3], INT64_MIN, INT64_MAX, &ts) < 0
        || field(args[6], 0, PY_SSIZE_T_MAX, &budget) < 0)
        return NULL;
    int qos = (int)(header_byte >> 1) & 3;
    if (qos > 1) {
        PyErr_SetString(PyExc_ValueError, "a run is of QoS 0 or 1 PUBLISHes");
        return NULL;
    }
    PyObject *first = args[0], *frames = args[2], *headers = args[4], *ack_head = args[5];
    if (!PyBytes_Check(first) || !PyBytes_Check(headers) || (ack_head != Py_None && !PyBytes_Check(ack_head))) {
        PyErr_SetString(PyExc_TypeError, "publish_run takes bytes");
        return NULL;
    }
    const char *f = PyBytes_AS_STRING(first);
    Py_ssize_t first_len = PyBytes_GET_SIZE(first);
    if (first_len < 2) {
        PyErr_SetString(PyExc_ValueError, "the first PUBLISH has no topic name");
        return NULL;
    }
    Py_ssize_t field_end = 2 + ((Py_ssize_t)(unsigned char)f[0] << 8 | (unsigned char)f[1]);
    Py_ssize_t head = field_end + (qos ? 2 : 0) + version5, hlen = PyBytes_GET_SIZE(headers);
    if (first_len < head) {
        PyErr_SetString(PyExc_ValueError, "the first PUBLISH is shorter than its topic name and packet identifier");
        return NULL;
    }
    if (version5 && f[head - 1] != 0) {
        PyErr_SetString(PyExc_ValueError, "the first PUBLISH has properties");
        return NULL;
    }
    Py_ssize_t ack_len = ack_head == Py_None ? 0 : PyBytes_GET_SIZE(ack_head);
    if (ack_head != Py_None && !qos) {
        PyErr_SetString(PyExc_ValueError, "QoS 0 PUBLISHes are not acknowledged");
        return NULL;
    }
    /* First pass: how many frames join the run, and the size of its records. */
    Py_ssize_t total = run_record_size(first_len, field_end, head, hlen), count = 1;
    Py_ssize_t available = PyObject_Length(frames);
    if (available < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < available; i++) {
        PyObject *item = PySequence_GetItem(frames, i), *body;
        if (item == NULL)
            return NULL;
        int like = like_run(item, (int)header_byte, f, field_end, head, version5, &body);
        Py_ssize_t size = like ? run_record_size(PyBytes_GET_SIZE(body), field_end, head, hlen) : 0;
        Py_DECREF(item);
        if (!like || size > INT32_MAX || total + size > budget)
            break;
        total += size;
        count++;
    }
    if (first_len - head > INT32_MAX || field_end - 2 > INT32_MAX || hlen > INT32_MAX) {
        PyErr_SetString(struct_error, "a record field out of range");
        return NULL;
    }
    PyObject *records = PyBytes_FromStringAndSize(NULL, total);
    PyObject *acks = PyBytes_FromStringAndSize(NULL, ack_head == Py_None ? 0 : count * (ack_len + 2));
    PyObject *last = NULL, *out = NULL, *body = NULL;
    if (records == NULL || acks == NULL)
        goto done;
    /* Second pass: the records (and acknowledgements) of the first and of each frame popped. */
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(records), *a = (unsigned char *)PyBytes_AS_STRING(acks);
    uint64_t t = (uint64_t)ts;
    Py_ssize_t key_len = field_end - 2;
    body = Py_NewRef(first);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (k) {
            PyObject *item = PyObject_CallMethodNoArgs(frames, popleft_name);
            if (item == NULL)
                goto done;
            Py_SETREF(body, Py_NewRef(PyTuple_GET_ITEM(item, 1)));
            Py_DECREF(item);
        }
        const char *p = PyBytes_AS_STRING(body);
        Py_ssize_t value_len = PyBytes_GET_SIZE(body) - head;
        put_u32(w, (uint32_t)k);
        put_u32(w + 4, (uint32_t)(t >> 32));
        put_u32(w + 8, (uint32_t)t);
        w[12] = (unsigned char)(hlen ? HEADERS | qos : qos);
        put_u32(w + 13, (uint32_t)key_len);
        w += HEAD_SIZE;
        memcpy(w, f + 2, key_len), w += key_len;
        put_u32(w, (uint32_t)value_len), w += 4;
        memcpy(w, p + head, value_len), w += value_len;
        if (hlen) {
            put_u32(w, (uint32_t)hlen);
            memcpy(w + 4, PyBytes_AS_STRING(headers), hlen), w += 4 + hlen;
        }
        if (ack_head != Py_None) {
            memcpy(a, PyBytes_AS_STRING(ack_head), ack_len);
            a[ack_len] = p[field_end], a[ack_len + 1] = p[field_end + 1];
            a += ack_len + 2;
        }
        if (k == count - 1)
            last = PyBytes_FromStringAndSize(p + head, value_len);
    }
    if (last != NULL)
        out = Py_BuildValue("(OnOO)", records, count, acks, last);
done:
    Py_XDECREF(body);
    Py_XDECREF(records);
    Py_XDECREF(acks);
    Py_XDECREF(last);
    return out;
}

static PyMethodDef methods[] = {
    {"parse_publish", (PyCFunction)(void (*)(void))parse_publish, METH_FASTCALL, "A 3.1.1 PUBLISH body's fields."},
    {"publish_run", (PyCFunction)(void (*)(void))publish_run, METH_FASTCALL, "The records of a run of PUBLISHes."},
    {"deliveries", (PyCFunction)(void (*)(void))deliveries, METH_FASTCALL, "The deliveries of a stored mqtt payload."},
    {"encode_record", (PyCFunction)(void (*)(void))encode_record, METH_FASTCALL, "One mqtt record."},
    {"count_records", count_records, METH_O, "The records of an mqtt payload, numbered from 0; ValueError else."},
    {"join", join, METH_O, "mqtt payloads as one, offset deltas renumbered across them."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "polygate_mqtt._speedups", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *structs = PyImport_ImportModule("struct");
    if (structs == NULL)
        return NULL;
    struct_error = PyObject_GetAttrString(structs, "error");
    Py_DECREF(structs);
    if (struct_error == NULL)
        return NULL;
    PyObject *properties = PyImport_ImportModule("polygate_mqtt.properties");
    if (properties == NULL)
        return NULL;
    malformed = PyObject_GetAttrString(properties, "MalformedPacket");
    Py_DECREF(properties);
    qos_numbers = Py_BuildValue("(iii)", 0, 1, 2);
    popleft_name = PyUnicode_InternFromString("popleft");
    if (malformed == NULL || qos_numbers == NULL || popleft_name == NULL)
        return NULL;
    return PyModule_Create(&module);
}
