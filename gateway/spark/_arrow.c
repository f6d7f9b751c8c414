/* Kafka record batches and TANK message sets straight into Arrow buffers, for the Spark data source
 * (optional: ``decode.py`` does the same in Python, record by record, giving the same bytes).
 *
 * Builder() gathers the records of one partition, column by column:
 * add_kafka(records, start, end, aborted, inflate) -> next_offset
 *     Appends the records of the v2 record batches of a fetch answer's ``records`` (a trailing partial
 *     batch is left out) that have ``start <= offset < end``. ``aborted`` is None (read uncommitted:
 *     every data batch is kept) or the fetch answer's aborted transactions as ``(producer id, first
 *     offset)`` pairs sorted by first offset (read committed: batches of aborted transactions are left
 *     out, as Kafka's consumer leaves them out). Control batches are never records. ``inflate(codec,
 *     data) -> bytes`` inflates a compressed batch's records. Returns the offset to fetch next: past
 *     every whole batch read, or ``end``. Raises LegacyRecords (a ValueError) at a magic 0/1 message
 *     set, ValueError on a batch or record that does not decode.
 * add_tank(messages, count, sparse, first_seq, last_seq, start, end) -> (read, stop)
 *     Appends the messages of a TANK bundle's message set (walked as ``bundle._read_messages`` walks
 *     it) whose offset (sequence number - 1) is in ``start <= offset < end``; returns how many messages
 *     it read and where it stopped, as ``_speedups.read_messages``. OverflowError for sequence numbers
 *     beyond 64 bits, ValueError for a timestamp beyond Arrow's.
 * take() -> (count, offsets, timestamps, timestamp_types, key_validity, key_offsets, key_data,
 *            value_validity, value_offsets, value_data, header_offsets, header_key_offsets,
 *            header_key_data, header_value_validity, header_value_offsets, header_value_data)
 *     The Arrow buffers of the records added since the last take, and an empty builder: int64
 *     offsets, int64 timestamps in microseconds, int32 timestamp types (0 create time, 1 log append
 *     time), binary keys and values (validity bitmap None when no value is null), int32 header list
 *     offsets, and the headers' string keys (invalid UTF-8 replaced, as Python decodes with
 *     "replace") and binary values. After an exception the builder holds an unknown part of the
 *     call's records: take nothing more from it.
 */
#include "_messages.h"
#include <string.h>

#define BATCH_HEADER 61
#define BATCH_OVERHEAD 12
#define ATTR_COMPRESSION 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_TRANSACTIONAL 0x10
#define ATTR_CONTROL 0x20

static PyObject *LegacyRecords;

/* A growing byte buffer. */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int
reserve(Buf *b, Py_ssize_t more)
{
    if (more > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int
put(Buf *b, const void *data, Py_ssize_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, data, (size_t)n);
    b->len += n;
    return 0;
}

/* An Arrow variable-size binary (or string) column: validity bitmap, int32 offsets, data. */
typedef struct {
    Buf validity, offsets, data;
    Py_ssize_t n, nulls;
} Binary;

static int
binary_init(Binary *c)
{
    int32_t zero = 0;
    memset(c, 0, sizeof(*c));
    return put(&c->offsets, &zero, 4);
}

/* Append data[0:n], or a null when n < 0. */
static int
binary_append(Binary *c, const char *data, Py_ssize_t n)
{
    if (c->n % 8 == 0) {
        unsigned char none = 0;
        if (put(&c->validity, &none, 1) < 0)
            return -1;
    }
    if (n < 0)
        c->nulls++;
    else
        ((unsigned char *)c->validity.p)[c->n / 8] |= (unsigned char)(1u << (c->n % 8));
    if (n > 0) {
        if (n > INT32_MAX - c->data.len) {
            PyErr_SetString(PyExc_OverflowError, "over 2 GiB of keys, values or headers in one Arrow batch");
            return -1;
        }
        if (put(&c->data, data, n) < 0)
            return -1;
    }
    int32_t at = (int32_t)c->data.len;
    c->n++;
    return put(&c->offsets, &at, 4);
}

static void
buf_free(Buf *b)
{
    PyMem_Free(b->p);
    b->p = NULL;
}

static void
binary_free(Binary *c)
{
    buf_free(&c->validity);
    buf_free(&c->offsets);
    buf_free(&c->data);
}

/* A new bytes object of the buffer's contents. */
static PyObject *
bytes_of(Buf *b)
{
    return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len);
}

/* Every column of the records read so far. */
typedef struct {
    Py_ssize_t count;
    Buf offsets, timestamps, types, header_offsets;
    Binary keys, values, header_keys, header_values;
} Columns;

static int
columns_init(Columns *c)
{
    int32_t zero = 0;
    memset(c, 0, sizeof(*c));
    return binary_init(&c->keys) < 0 || binary_init(&c->values) < 0 || binary_init(&c->header_keys) < 0 ||
                   binary_init(&c->header_values) < 0 || put(&c->header_offsets, &zero, 4) < 0
               ? -1
               : 0;
}

static void
columns_free(Columns *c)
{
    buf_free(&c->offsets);
    buf_free(&c->timestamps);
    buf_free(&c->types);
    buf_free(&c->header_offsets);
    binary_free(&c->keys);
    binary_free(&c->values);
    binary_free(&c->header_keys);
    binary_free(&c->header_values);
}

static PyObject *
corrupt(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

/* The blob (varint length, then bytes; null when negative) at p[*pos]: *data, *n (-1 null); -1 if it
 * does not fit below end. */
static int
read_blob(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, const char **data, Py_ssize_t *n)
{
    int64_t len;
    if (read_zigzag(p, pos, end, &len) < 0 || len > end - *pos)
        return -1;
    *data = (const char *)p + *pos;
    *n = len < 0 ? -1 : (Py_ssize_t)len;
    if (len > 0)
        *pos += (Py_ssize_t)len;
    return 0;
}

/* Append a header name as valid UTF-8 (a null name as ""). */
static int
append_name(Binary *c, const char *data, Py_ssize_t n)
{
    if (n < 0)
        return binary_append(c, "", 0);
    Py_ssize_t i = 0;
    while (i < n && !(data[i] & 0x80))
        i++;
    if (i == n)
        return binary_append(c, data, n);
    PyObject *text = PyUnicode_DecodeUTF8(data, n, "replace");
    if (text == NULL)
        return -1;
    Py_ssize_t size;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &size);
    int r = utf8 == NULL ? -1 : binary_append(c, utf8, size);
    Py_DECREF(text);
    return r;
}

/* Append the records of body[pos:stop] (``count`` of them) that have ``start <= offset < end``;
 * *reached is set when a record at or past ``end`` was met. */
static int
read_records(Columns *c, const unsigned char *p, Py_ssize_t pos, Py_ssize_t stop, int64_t count, int64_t base,
             int64_t base_ts, int64_t append_ts, int log_append, int64_t start, int64_t end, int *reached)
{
    int32_t type = log_append ? 1 : 0;
    for (int64_t r = 0; r < count; r++) {
        int64_t len, ts_delta, offset_delta, headers;
        if (read_zigzag(p, &pos, stop, &len) < 0 || len < 1 || len > stop - pos) {
            corrupt("record length out of range");
            return -1;
        }
        Py_ssize_t rend = pos + (Py_ssize_t)len;
        pos += 1; /* attributes */
        if (read_zigzag(p, &pos, rend, &ts_delta) < 0 || read_zigzag(p, &pos, rend, &offset_delta) < 0) {
            corrupt("bad varint in a record");
            return -1;
        }
        int64_t offset, ts = append_ts, us;
        if (__builtin_add_overflow(base, offset_delta, &offset) ||
            (!log_append && __builtin_add_overflow(base_ts, ts_delta, &ts)) || __builtin_mul_overflow(ts, 1000, &us)) {
            corrupt("a record offset or timestamp out of range");
            return -1;
        }
        if (offset >= end) {
            *reached = 1;
            return 0;
        }
        if (offset < start) {
            pos = rend;
            continue;
        }
        const char *key, *value;
        Py_ssize_t key_n, value_n;
        if (read_blob(p, &pos, rend, &key, &key_n) < 0 || read_blob(p, &pos, rend, &value, &value_n) < 0 ||
            read_zigzag(p, &pos, rend, &headers) < 0 || headers > rend - pos) {
            corrupt("record field overruns the record");
            return -1;
        }
        if (put(&c->offsets, &offset, 8) < 0 || put(&c->timestamps, &us, 8) < 0 || put(&c->types, &type, 4) < 0 ||
            binary_append(&c->keys, key, key_n) < 0 || binary_append(&c->values, value, value_n) < 0)
            return -1;
        for (int64_t h = 0; h < headers; h++) {
            const char *name, *hvalue;
            Py_ssize_t name_n, hvalue_n;
            if (read_blob(p, &pos, rend, &name, &name_n) < 0 || read_blob(p, &pos, rend, &hvalue, &hvalue_n) < 0) {
                corrupt("record header overruns the record");
                return -1;
            }
            if (append_name(&c->header_keys, name, name_n) < 0 ||
                binary_append(&c->header_values, hvalue, hvalue_n) < 0)
                return -1;
        }
        int32_t at = (int32_t)c->header_keys.n;
        if (put(&c->header_offsets, &at, 4) < 0)
            return -1;
        if (pos != rend) {
            corrupt("record length mismatch");
            return -1;
        }
        c->count++;
    }
    if (pos != stop) {
        corrupt("more records than the batch declares");
        return -1;
    }
    return 0;
}

/* Whether the control batch whose records start at p[pos] (below stop) is an abort marker. */
static int
is_abort_marker(const unsigned char *p, Py_ssize_t pos, Py_ssize_t stop)
{
    int64_t skip;
    const char *key;
    Py_ssize_t key_n;
    if (read_zigzag(p, &pos, stop, &skip) < 0 || ++pos > stop || read_zigzag(p, &pos, stop, &skip) < 0 ||
        read_zigzag(p, &pos, stop, &skip) < 0 || read_blob(p, &pos, stop, &key, &key_n) < 0 || key_n < 4)
        return 0;
    return be((const unsigned char *)key + 2, 2) == 0;
}

/* Producer ids of aborted transactions open at the current batch (Kafka consumer's abortedProducerIds). */
typedef struct {
    int64_t *ids;
    Py_ssize_t n, cap;
} IdSet;

static int
ids_find(IdSet *s, int64_t id)
{
    for (Py_ssize_t i = 0; i < s->n; i++)
        if (s->ids[i] == id)
            return (int)i;
    return -1;
}

static int
ids_add(IdSet *s, int64_t id)
{
    if (ids_find(s, id) >= 0)
        return 0;
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 8;
        int64_t *ids = PyMem_Realloc(s->ids, (size_t)cap * sizeof(int64_t));
        if (ids == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->ids = ids;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
    return 0;
}

static void
ids_remove(IdSet *s, int64_t id)
{
    int i = ids_find(s, id);
    if (i >= 0)
        s->ids[i] = s->ids[--s->n];
}

/* The (producer id, first offset) pair aborted[i]. */
static int
aborted_at(PyObject *aborted, Py_ssize_t i, long long *pid, long long *first)
{
    PyObject *pair = PySequence_Fast_GET_ITEM(aborted, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "aborted transactions are (producer id, first offset) tuples");
        return -1;
    }
    *pid = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 0));
    if (*pid == -1 && PyErr_Occurred())
        return -1;
    *first = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
    return *first == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *
buffers_of(Columns *c)
{
    return Py_BuildValue(
        "(nNNNNNNNNNNNNNNN)", c->count, bytes_of(&c->offsets), bytes_of(&c->timestamps), bytes_of(&c->types),
        c->keys.nulls ? bytes_of(&c->keys.validity) : Py_NewRef(Py_None), bytes_of(&c->keys.offsets),
        bytes_of(&c->keys.data), c->values.nulls ? bytes_of(&c->values.validity) : Py_NewRef(Py_None),
        bytes_of(&c->values.offsets), bytes_of(&c->values.data), bytes_of(&c->header_offsets),
        bytes_of(&c->header_keys.offsets), bytes_of(&c->header_keys.data),
        c->header_values.nulls ? bytes_of(&c->header_values.validity) : Py_NewRef(Py_None),
        bytes_of(&c->header_values.offsets), bytes_of(&c->header_values.data));
}

typedef struct {
    PyObject_HEAD Columns c;
} Builder;

static int
Builder_init(Builder *self, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":Builder") || (kwargs != NULL && PyDict_GET_SIZE(kwargs))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Builder() takes no arguments");
        return -1;
    }
    columns_free(&self->c);
    return columns_init(&self->c);
}

static void
Builder_dealloc(Builder *self)
{
    columns_free(&self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Builder_take(Builder *self, PyObject *unused)
{
    (void)unused;
    PyObject *out = buffers_of(&self->c);
    columns_free(&self->c);
    if (columns_init(&self->c) < 0)
        Py_CLEAR(out);
    return out;
}

static PyObject *
Builder_add_kafka(Builder *self, PyObject *args)
{
    Py_buffer buf;
    long long start, end;
    PyObject *aborted_arg, *inflate, *aborted = NULL, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*LLOO", &buf, &start, &end, &aborted_arg, &inflate))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t len = buf.len, pos = 0, next_aborted = 0, n_aborted = 0;
    int64_t next = start;
    int committed = aborted_arg != Py_None, reached = 0;
    IdSet open = {NULL, 0, 0};
    Columns *c = &self->c;
    if (committed) {
        aborted = PySequence_Fast(aborted_arg, "aborted transactions must be a sequence");
        if (aborted == NULL)
            goto done;
        n_aborted = PySequence_Fast_GET_SIZE(aborted);
    }
    while (!reached && len - pos >= BATCH_HEADER) {
        const unsigned char *h = p + pos;
        int64_t base = (int64_t)be(h, 8), length = (int32_t)be(h + 8, 4);
        if ((signed char)h[16] < 2) {
            PyErr_SetString(LegacyRecords, "a magic 0/1 message set");
            goto done;
        }
        if (h[16] != 2 || length < BATCH_HEADER - BATCH_OVERHEAD) {
            corrupt("bad record batch header");
            goto done;
        }
        if (length > len - pos - BATCH_OVERHEAD)
            break; /* the partial batch a fetch answer may end with */
        Py_ssize_t stop = pos + BATCH_OVERHEAD + (Py_ssize_t)length;
        int attributes = (int)be(h + 21, 2);
        int64_t last = (int64_t)((uint64_t)base + (uint64_t)(int64_t)(int32_t)be(h + 23, 4)),
                base_ts = (int64_t)be(h + 27, 8), max_ts = (int64_t)be(h + 35, 8), pid = (int64_t)be(h + 43, 8),
                count = (int32_t)be(h + 57, 4);
        int skip = (attributes & ATTR_CONTROL) || last < start;
        if (committed && pid >= 0) {
            long long aborted_pid, first;
            while (next_aborted < n_aborted) {
                if (aborted_at(aborted, next_aborted, &aborted_pid, &first) < 0)
                    goto done;
                if (first > last)
                    break;
                if (ids_add(&open, aborted_pid) < 0)
                    goto done;
                next_aborted++;
            }
            if (attributes & ATTR_CONTROL) {
                if (is_abort_marker(p, pos + BATCH_HEADER, stop))
                    ids_remove(&open, pid);
            } else if ((attributes & ATTR_TRANSACTIONAL) && ids_find(&open, pid) >= 0) {
                skip = 1;
            }
        }
        if (!skip) {
            int codec = attributes & ATTR_COMPRESSION;
            int log_append = (attributes & ATTR_LOG_APPEND_TIME) != 0;
            int failed;
            if (codec) {
                PyObject *inflated = PyObject_CallFunction(inflate, "iy#", codec, (const char *)h + BATCH_HEADER,
                                                           stop - pos - BATCH_HEADER);
                if (inflated == NULL)
                    goto done;
                if (!PyBytes_Check(inflated)) {
                    Py_DECREF(inflated);
                    PyErr_SetString(PyExc_TypeError, "inflate must return bytes");
                    goto done;
                }
                failed = read_records(c, (const unsigned char *)PyBytes_AS_STRING(inflated), 0,
                                      PyBytes_GET_SIZE(inflated), count, base, base_ts, max_ts, log_append, start,
                                      end, &reached);
                Py_DECREF(inflated);
            } else {
                failed = read_records(c, p, pos + BATCH_HEADER, stop, count, base, base_ts, max_ts, log_append,
                                      start, end, &reached);
            }
            if (failed < 0)
                goto done;
        }
        if (last >= next)
            next = last == INT64_MAX ? INT64_MAX : last + 1;
        pos = stop;
    }
    out = PyLong_FromLongLong(reached || next > end ? end : next);
done:
    PyMem_Free(open.ids);
    Py_XDECREF(aborted);
    PyBuffer_Release(&buf);
    return out;
}

/* What add_tank's walk appends to: the builder's columns and the range of offsets kept. */
typedef struct {
    Columns *c;
    uint64_t start, end; /* as sequence numbers: start < seq <= end */
} TankRange;

static int
append_tank_message(void *ctx, uint64_t seq, uint64_t ts, const unsigned char *key, Py_ssize_t key_len,
                    const unsigned char *value, Py_ssize_t value_len)
{
    TankRange *range = ctx;
    Columns *c = range->c;
    if (seq <= range->start || seq > range->end)
        return 0;
    int64_t offset = (int64_t)(seq - 1), us;
    int32_t type = 0, no_headers = (int32_t)c->header_keys.n;
    if (ts > (uint64_t)INT64_MAX || __builtin_mul_overflow((int64_t)ts, 1000, &us)) {
        PyErr_SetString(PyExc_ValueError, "a message timestamp out of range");
        return -1;
    }
    if (put(&c->offsets, &offset, 8) < 0 || put(&c->timestamps, &us, 8) < 0 || put(&c->types, &type, 4) < 0 ||
        binary_append(&c->keys, (const char *)key, key == NULL ? -1 : key_len) < 0 ||
        binary_append(&c->values, (const char *)value, value_len) < 0 || put(&c->header_offsets, &no_headers, 4) < 0)
        return -1;
    c->count++;
    return 0;
}

static PyObject *
Builder_add_tank(Builder *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count, read, stop;
    int sparse;
    unsigned long long first, last;
    long long start, end;
    if (!PyArg_ParseTuple(args, "y*npKKLL", &buf, &count, &sparse, &first, &last, &start, &end))
        return NULL;
    TankRange range = {&self->c, start < 0 ? 0 : (uint64_t)start, end < 0 ? 0 : (uint64_t)end};
    PyObject *out = NULL;
    if (tank_walk(buf.buf, buf.len, count, sparse, first, last, append_tank_message, &range, &read, &stop) == 0)
        out = Py_BuildValue("(nn)", read, stop);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef Builder_methods[] = {
    {"add_kafka", (PyCFunction)Builder_add_kafka, METH_VARARGS, "Append the records of Kafka record batches."},
    {"add_tank", (PyCFunction)Builder_add_tank, METH_VARARGS, "Append the messages of a TANK message set."},
    {"take", (PyCFunction)Builder_take, METH_NOARGS, "The Arrow buffers of the records added, and an empty builder."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.spark._arrow.Builder",
    .tp_doc = "The records of one partition gathered into Arrow buffers.",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Builder_init,
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_methods = Builder_methods,
};

/* ------------------------------------------------------------------------------------------ writing */

/* CRC32C (Castagnoli), as record batches carry it: SSE 4.2 where the CPU has it, else a table. */
static uint32_t crc_table[256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t
crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
    }
    crc = (uint32_t)c;
    for (; n; n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#define HAVE_CRC32C_HW 1
#endif

static uint32_t
crc32c(const unsigned char *p, size_t n)
{
    uint32_t crc = 0xFFFFFFFFu;
#ifdef HAVE_CRC32C_HW
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_hw(crc, p, n) ^ 0xFFFFFFFFu;
#endif
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* A pyarrow array's buffers, as the Python side passes them: ``(validity or None, values, offset, length)``
 * for fixed-size values, ``(validity or None, offsets, data, offset, length)`` for binary and strings. */
typedef struct {
    Py_buffer validity, values, data;
    int has_validity, binary;
    Py_ssize_t offset, length;
} View;

static void
view_close(View *v)
{
    if (v->has_validity)
        PyBuffer_Release(&v->validity);
    if (v->values.obj != NULL)
        PyBuffer_Release(&v->values);
    if (v->data.obj != NULL)
        PyBuffer_Release(&v->data);
    memset(v, 0, sizeof(*v));
}

/* Open ``spec`` (a tuple as above; ``width`` the byte size of a fixed-size value, 0 for binary). */
static int
view_open(PyObject *spec, View *v, int width)
{
    PyObject *validity, *values, *data = NULL;
    memset(v, 0, sizeof(*v));
    v->binary = width == 0;
    if (v->binary ? !PyArg_ParseTuple(spec, "OOOnn", &validity, &values, &data, &v->offset, &v->length)
                  : !PyArg_ParseTuple(spec, "OOnn", &validity, &values, &v->offset, &v->length))
        return -1;
    if (v->offset < 0 || v->length < 0 || v->offset > PY_SSIZE_T_MAX / 16 - v->length) {
        PyErr_SetString(PyExc_ValueError, "array offset or length out of range");
        return -1;
    }
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &v->validity, PyBUF_SIMPLE) < 0)
            return -1;
        v->has_validity = 1;
        if (v->validity.len * 8 < v->offset + v->length)
            goto short_buffer;
    }
    if (PyObject_GetBuffer(values, &v->values, PyBUF_SIMPLE) < 0 ||
        (data != NULL && PyObject_GetBuffer(data, &v->data, PyBUF_SIMPLE) < 0)) {
        view_close(v);
        return -1;
    }
    if (v->values.len < (v->offset + v->length + v->binary) * (v->binary ? 4 : width))
        goto short_buffer;
    return 0;
short_buffer:
    view_close(v);
    PyErr_SetString(PyExc_ValueError, "an Arrow buffer shorter than its array");
    return -1;
}

static inline int
view_valid(const View *v, Py_ssize_t i)
{
    Py_ssize_t j = v->offset + i;
    return !v->has_validity || (((const unsigned char *)v->validity.buf)[j / 8] >> (j % 8)) & 1;
}

/* Value i of a binary view: *p and *n (-1 for null); -1 with ValueError for offsets outside the data. */
static inline int
view_bytes(const View *v, Py_ssize_t i, const unsigned char **p, Py_ssize_t *n)
{
    if (!view_valid(v, i)) {
        *n = -1;
        return 0;
    }
    const int32_t *offsets = v->values.buf;
    int32_t start = offsets[v->offset + i], stop = offsets[v->offset + i + 1];
    if (start < 0 || stop < start || stop > v->data.len) {
        PyErr_SetString(PyExc_ValueError, "Arrow offsets outside the array's data");
        return -1;
    }
    *p = (const unsigned char *)v->data.buf + start;
    *n = stop - start;
    return 0;
}

static unsigned char *
put_blob(unsigned char *out, const unsigned char *p, Py_ssize_t n)
{
    out = put_zigzag(out, n);
    if (n > 0) {
        memcpy(out, p, (size_t)n);
        out += n;
    }
    return out;
}

/* The column row of the ``next``-th row to write: rows[next] of a view of uint64 row indices, or ``next``
 * itself without one; -1 with ValueError for an index past the ``length`` rows of the columns. */
static Py_ssize_t
row_at(const View *rows, Py_ssize_t next, Py_ssize_t length)
{
    if (rows == NULL)
        return next;
    uint64_t row = ((const uint64_t *)rows->values.buf)[rows->offset + next];
    if (row >= (uint64_t)length) {
        PyErr_SetString(PyExc_ValueError, "a row index past the columns");
        return -1;
    }
    return (Py_ssize_t)row;
}

/* The headers of the rows, as ``(list view, entry validity or None, entry offset, key view, value view)``:
 * the list's offsets index the entries (struct rows), whose fields are the key and value views. */
typedef struct {
    View list, keys, values;
    Py_buffer entry_validity;
    int has_entry_validity;
    Py_ssize_t entry_offset;
} Headers;

static void
headers_close(Headers *h)
{
    view_close(&h->list);
    view_close(&h->keys);
    view_close(&h->values);
    if (h->has_entry_validity)
        PyBuffer_Release(&h->entry_validity);
    h->has_entry_validity = 0;
}

static int
headers_open(PyObject *spec, Headers *h)
{
    PyObject *list, *entry_validity, *keys, *values;
    memset(h, 0, sizeof(*h));
    if (!PyArg_ParseTuple(spec, "OOnOO", &list, &entry_validity, &h->entry_offset, &keys, &values))
        return -1;
    /* list offsets are int32, like binary offsets: open the list as a binary view without data */
    PyObject *as_binary = NULL;
    PyObject *validity, *offsets;
    Py_ssize_t offset, length;
    if (!PyArg_ParseTuple(list, "OOnn", &validity, &offsets, &offset, &length))
        return -1;
    as_binary = Py_BuildValue("(OOOnn)", validity, offsets, offsets, offset, length);
    if (as_binary == NULL)
        return -1;
    int r = view_open(as_binary, &h->list, 0);
    Py_DECREF(as_binary);
    if (r < 0 || view_open(keys, &h->keys, 0) < 0 || view_open(values, &h->values, 0) < 0)
        goto fail;
    if (entry_validity != Py_None) {
        if (PyObject_GetBuffer(entry_validity, &h->entry_validity, PyBUF_SIMPLE) < 0)
            goto fail;
        h->has_entry_validity = 1;
    }
    return 0;
fail:
    headers_close(h);
    return -1;
}

/* The entries [*first, *stop) of row i's header list (none when the list is null). */
static int
header_range(const Headers *h, Py_ssize_t i, Py_ssize_t *first, Py_ssize_t *stop)
{
    *first = *stop = 0;
    if (!view_valid(&h->list, i))
        return 0;
    const int32_t *offsets = h->list.values.buf;
    *first = offsets[h->list.offset + i];
    *stop = offsets[h->list.offset + i + 1];
    if (*first < 0 || *stop < *first || *stop > h->keys.length || *stop > h->values.length) {
        PyErr_SetString(PyExc_ValueError, "header list offsets outside the entries");
        return -1;
    }
    return 0;
}

static inline int
entry_valid(const Headers *h, Py_ssize_t k)
{
    Py_ssize_t j = h->entry_offset + k;
    if (!h->has_entry_validity)
        return 1;
    if (j / 8 >= h->entry_validity.len)
        return 0;
    return (((const unsigned char *)h->entry_validity.buf)[j / 8] >> (j % 8)) & 1;
}

/* The size of row i's record body (after its length varint) at offset delta ``delta``; -1 on a fault. */
static Py_ssize_t
record_body_size(const View *keys, const View *values, const Headers *headers, Py_ssize_t i, int64_t delta)
{
    const unsigned char *p;
    Py_ssize_t n, size = 1 + 1 + zigzag_size(delta); /* attributes, timestamp delta 0, offset delta */
    if (keys->length) {
        if (view_bytes(keys, i, &p, &n) < 0)
            return -1;
    } else {
        n = -1;
    }
    size += zigzag_size(n) + (n > 0 ? n : 0);
    if (view_bytes(values, i, &p, &n) < 0)
        return -1;
    size += zigzag_size(n) + (n > 0 ? n : 0);
    Py_ssize_t first = 0, stop = 0, count = 0;
    if (headers != NULL && header_range(headers, i, &first, &stop) < 0)
        return -1;
    for (Py_ssize_t k = first; k < stop; k++) {
        if (!entry_valid(headers, k))
            continue;
        count++;
        if (view_bytes(&headers->keys, k, &p, &n) < 0)
            return -1;
        size += zigzag_size(n < 0 ? 0 : n) + (n > 0 ? n : 0);
        if (view_bytes(&headers->values, k, &p, &n) < 0)
            return -1;
        size += zigzag_size(n) + (n > 0 ? n : 0);
    }
    return size + zigzag_size(count);
}

static unsigned char *
put_record(unsigned char *out, const View *keys, const View *values, const Headers *headers, Py_ssize_t i,
           int64_t delta, Py_ssize_t body)
{
    const unsigned char *p = NULL;
    Py_ssize_t n;
    out = put_zigzag(out, body);
    *out++ = 0; /* attributes */
    *out++ = 0; /* timestamp delta */
    out = put_zigzag(out, delta);
    if (keys->length)
        view_bytes(keys, i, &p, &n);
    else
        n = -1;
    out = put_blob(out, p, n);
    view_bytes(values, i, &p, &n);
    out = put_blob(out, p, n);
    Py_ssize_t first = 0, stop = 0, count = 0;
    if (headers != NULL)
        header_range(headers, i, &first, &stop);
    for (Py_ssize_t k = first; k < stop; k++)
        count += entry_valid(headers, k);
    out = put_zigzag(out, count);
    for (Py_ssize_t k = first; k < stop; k++) {
        if (!entry_valid(headers, k))
            continue;
        view_bytes(&headers->keys, k, &p, &n);
        out = put_blob(out, p, n < 0 ? 0 : n);
        view_bytes(&headers->values, k, &p, &n);
        out = put_blob(out, p, n);
    }
    return out;
}

/* kafka_batch(rows, keys, values, headers, timestamp_ms, max_bytes, at) -> (batch, next)
 *     One uncompressed v2 record batch (baseOffset 0, no producer id, every record stamped
 *     ``timestamp_ms``) of the rows rows[at], rows[at + 1]... (``rows`` a view of uint64 row indices,
 *     or None for every row in order), as many as fit in ``max_bytes`` (at least one); ``next`` is
 *     where the next batch starts. ``keys`` and ``headers`` may be None (no such column); a null
 *     header key is written as "", a null header entry or list as no header. */
static PyObject *
kafka_batch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rows_spec, *keys_spec, *values_spec, *headers_spec, *out = NULL;
    long long timestamp;
    Py_ssize_t max_bytes, at;
    View rows = {0}, keys = {0}, values = {0};
    Headers headers;
    int with_headers = 0;
    Buf batch = {NULL, 0, 0};
    memset(&headers, 0, sizeof(headers));
    if (!PyArg_ParseTuple(args, "OOOOLnn", &rows_spec, &keys_spec, &values_spec, &headers_spec, &timestamp,
                          &max_bytes, &at))
        return NULL;
    if ((rows_spec != Py_None && view_open(rows_spec, &rows, 8) < 0) ||
        (keys_spec != Py_None && view_open(keys_spec, &keys, 0) < 0) || view_open(values_spec, &values, 0) < 0)
        goto done;
    if (headers_spec != Py_None) {
        if (headers_open(headers_spec, &headers) < 0)
            goto done;
        with_headers = 1;
    }
    Py_ssize_t total = rows_spec != Py_None ? rows.length : values.length;
    if ((keys_spec != Py_None && keys.length != values.length) ||
        (with_headers && headers.list.length != values.length)) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    if (at < 0 || at >= total) {
        PyErr_SetString(PyExc_ValueError, "no row at that position");
        goto done;
    }
    if (reserve(&batch, BATCH_HEADER) < 0)
        goto done;
    batch.len = BATCH_HEADER;
    Py_ssize_t next = at;
    int64_t delta = 0;
    for (; next < total; next++, delta++) {
        Py_ssize_t i = row_at(rows_spec != Py_None ? &rows : NULL, next, values.length);
        if (i < 0)
            goto done;
        Py_ssize_t body = record_body_size(&keys, &values, with_headers ? &headers : NULL, i, delta);
        if (body < 0)
            goto done;
        Py_ssize_t size = uvarint_size((uint64_t)body << 1) + body;
        if (delta > 0 && (batch.len + size > max_bytes || delta == INT32_MAX))
            break;
        if (reserve(&batch, size) < 0)
            goto done;
        put_record((unsigned char *)batch.p + batch.len, &keys, &values, with_headers ? &headers : NULL, i, delta,
                   body);
        batch.len += size;
    }
    if (batch.len - BATCH_OVERHEAD > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a record over 2 GiB");
        goto done;
    }
    unsigned char *h = (unsigned char *)batch.p;
    put_be(h, 0, 8);                                       /* baseOffset */
    put_be(h + 8, (uint64_t)(batch.len - BATCH_OVERHEAD), 4); /* batchLength */
    put_be(h + 12, (uint64_t)-1, 4);                      /* partitionLeaderEpoch */
    h[16] = 2;                                             /* magic */
    put_be(h + 21, 0, 2);                                  /* attributes */
    put_be(h + 23, (uint64_t)(delta - 1), 4);              /* lastOffsetDelta */
    put_be(h + 27, (uint64_t)timestamp, 8);                /* baseTimestamp */
    put_be(h + 35, (uint64_t)timestamp, 8);                /* maxTimestamp */
    put_be(h + 43, (uint64_t)-1, 8);                       /* producerId */
    put_be(h + 51, (uint64_t)-1, 2);                       /* producerEpoch */
    put_be(h + 53, (uint64_t)-1, 4);                       /* baseSequence */
    put_be(h + 57, (uint64_t)delta, 4);                    /* records */
    put_be(h + 17, crc32c(h + 21, (size_t)(batch.len - 21)), 4);
    out = Py_BuildValue("(Nn)", bytes_of(&batch), next);
done:
    buf_free(&batch);
    view_close(&rows);
    view_close(&keys);
    view_close(&values);
    headers_close(&headers);
    return out;
}

/* row_partitions(keys, partitions, count, sticky, hash) -> bytes
 *     The partition of each row as int32: the ``partitions`` view's value where it is not null
 *     (ValueError outside 0..count-1), else the key's hash modulo ``count`` (hash 0: murmur2, its
 *     positive 31 bits, as Kafka's Java client; 1: FNV-1a 32, as V1 and Cursus clients), else
 *     ``sticky``. ``keys`` or ``partitions`` may be None (no such column), not both. */
static PyObject *
row_partitions(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *keys_spec, *parts_spec, *out = NULL;
    int count, sticky, hash;
    View keys = {0}, parts = {0};
    if (!PyArg_ParseTuple(args, "OOiii", &keys_spec, &parts_spec, &count, &sticky, &hash))
        return NULL;
    if ((keys_spec != Py_None && view_open(keys_spec, &keys, 0) < 0) ||
        (parts_spec != Py_None && view_open(parts_spec, &parts, 4) < 0))
        goto done;
    Py_ssize_t n = parts_spec != Py_None ? parts.length : keys.length;
    if (count < 1 || sticky < 0 || sticky >= count || (keys_spec != Py_None && parts_spec != Py_None &&
                                                        keys.length != parts.length)) {
        PyErr_SetString(PyExc_ValueError, "bad partition count or columns of different lengths");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL)
        goto done;
    int32_t *chosen = (int32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parts_spec != Py_None && view_valid(&parts, i)) {
            int32_t p = ((const int32_t *)parts.values.buf)[parts.offset + i];
            if (p < 0 || p >= count) {
                PyErr_Format(PyExc_ValueError, "partition %d of row %zd: the topic has partitions 0 to %d", p, i,
                             count - 1);
                Py_CLEAR(out);
                goto done;
            }
            chosen[i] = p;
            continue;
        }
        const unsigned char *key;
        Py_ssize_t key_n = -1;
        if (keys_spec != Py_None && view_bytes(&keys, i, &key, &key_n) < 0) {
            Py_CLEAR(out);
            goto done;
        }
        if (key_n < 0)
            chosen[i] = sticky;
        else if (hash == 0)
            chosen[i] = (int32_t)((murmur2_of(key, key_n) & 0x7FFFFFFF) % (uint64_t)count);
        else
            chosen[i] = (int32_t)(fnv1a_32_of(key, key_n) % (uint64_t)count);
    }
done:
    view_close(&keys);
    view_close(&parts);
    return out;
}

/* tank_messages(rows, keys, values, timestamp_ms, at, most) -> (messages, count, next)
 *     The message set of an uncompressed TANK bundle (``bundle._encode_messages``' bytes) of the rows
 *     rows[at], rows[at + 1]... (as kafka_batch takes them), at most ``most`` of them, each stamped
 *     ``timestamp_ms``: a null or empty key is none (keys cut to 255 bytes, as TANK keeps them), a
 *     null value empty. ``count`` is how many rows it holds, ``next`` where the next bundle starts. */
static PyObject *
tank_messages(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rows_spec, *keys_spec, *values_spec, *out = NULL;
    unsigned long long timestamp;
    Py_ssize_t at, most;
    View rows = {0}, keys = {0}, values = {0};
    Buf set = {NULL, 0, 0};
    if (!PyArg_ParseTuple(args, "OOOKnn", &rows_spec, &keys_spec, &values_spec, &timestamp, &at, &most))
        return NULL;
    if ((rows_spec != Py_None && view_open(rows_spec, &rows, 8) < 0) ||
        (keys_spec != Py_None && view_open(keys_spec, &keys, 0) < 0) || view_open(values_spec, &values, 0) < 0)
        goto done;
    Py_ssize_t total = rows_spec != Py_None ? rows.length : values.length, i, next = at;
    if ((keys_spec != Py_None && keys.length != values.length) || at < 0 || at >= total || most < 1) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths, or no row at that position");
        goto done;
    }
    for (; next < total && next - at < most; next++) {
        if ((i = row_at(rows_spec != Py_None ? &rows : NULL, next, values.length)) < 0)
            goto done;
        const unsigned char *key = NULL, *value = NULL;
        Py_ssize_t key_n = -1, value_n;
        if ((keys_spec != Py_None && view_bytes(&keys, i, &key, &key_n) < 0) || view_bytes(&values, i, &value, &value_n) < 0)
            goto done;
        key_n = key_n < 0 ? 0 : key_n;
        value_n = value_n < 0 ? 0 : value_n;
        Py_ssize_t size = tank_size(0, next > at, key_n, value_n);
        if (reserve(&set, size) < 0)
            goto done;
        tank_put((unsigned char *)set.p + set.len, 0, 0, next > at, timestamp, (const char *)key, key_n,
                 (const char *)value, value_n);
        set.len += size;
    }
    out = Py_BuildValue("(Nnn)", bytes_of(&set), next - at, next);
done:
    buf_free(&set);
    view_close(&rows);
    view_close(&keys);
    view_close(&values);
    return out;
}

static PyMethodDef methods[] = {
    {"kafka_batch", kafka_batch, METH_VARARGS, "One v2 record batch of Arrow rows."},
    {"row_partitions", row_partitions, METH_VARARGS, "The partition of each Arrow row."},
    {"tank_messages", tank_messages, METH_VARARGS, "A TANK message set of Arrow rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_arrow", "Record batches to and from Arrow buffers.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC
PyInit__arrow(void)
{
    crc_init();
    if (PyType_Ready(&BuilderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    LegacyRecords = PyErr_NewExceptionWithDoc("gateway.spark._arrow.LegacyRecords",
                                              "A magic 0/1 message set, which only the librdkafka reader reads.",
                                              PyExc_ValueError, NULL);
    if (LegacyRecords == NULL || PyModule_AddObjectRef(m, "LegacyRecords", LegacyRecords) < 0 ||
        PyModule_AddObjectRef(m, "Builder", (PyObject *)&BuilderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
