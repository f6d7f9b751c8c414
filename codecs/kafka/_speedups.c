/* Kafka record batch v2 record loops in C (optional; format.py has the same in Python).
 *
 * read_records(body, pos, stop, count, base, base_ts, append_ts, offsets, stamps, keys, values, headers)
 *     appends the fields of ``count`` records of body[pos:stop] to the lists; returns whether any
 *     record had headers; raises ValueError on a record that does not decode.
 * encode_records(offsets, base_offset, timestamps, keys, values, headers, extras=None)
 *         -> (records, last_offset_delta, base_timestamp, max_timestamp)
 *     the records part of a batch and the header fields they make, as ``format._encode_columns``:
 *     offsets relative to base_offset (None: the record's index), timestamps relative to the least
 *     of those >= 0 (a record's below 0 takes that least; -1 for both when none is set);
 *     headers: None or one tuple of (str, bytes | None) per record;
 *     extras: None or one dict per record, written after the headers as ``polygate.<key>`` headers;
 *     TypeError or OverflowError for what only the Python loop takes: other mappings, values other
 *     than bytes/str/int, offsets or deltas outside 64 bits.
 * check_records(body, pos, stop, count)
 *     checks that body[pos:stop] is exactly ``count`` well-formed records whose offset deltas are
 *     0, 1, 2...: what a produced batch must hold; raises ValueError naming the first fault.
 * tank_bundle(payloads, base_offsets, base_offset, limit, inflate)
 *         -> (bundle, count, last_offset_delta, base_timestamp, max_timestamp) | None
 *     the records of stored payloads (a list of bytes, each the v2 batches of one stored batch, its first batch
 *     numbered from its item of ``base_offsets`` and every other from its own baseOffset, as ``format.read_into``
 *     numbers them; control batches skipped; a compressed batch's records ``inflate(view, limit, codec)``, bytes)
 *     written as one uncompressed TANK bundle (``varint len | bundle``; nothing for no records) in one pass, with
 *     no Python object per record: the payload ``KafkaFormat.columns`` then the TANK format's ``encode_columns``
 *     give (a plain bundle when the offsets are ``base_offset``, ``base_offset + 1``..., else a SPARSE one;
 *     timestamps below 0 written as 0, keys cut to 255 bytes, empty keys none, null values empty, headers
 *     dropped), with the count, the last offset less ``base_offset`` and the least and greatest timestamp
 *     written (-1 when none). None where the columns path does anything else: offsets that do not ascend
 *     (which it leaves out) or a first one below 0, a batch or record that does not decode, an exception from
 *     ``inflate``, numbers outside 64 bits; it then converts, or names the fault.
 */
#include "_messages.h"
#include <string.h>

static PyObject *
corrupt(const char *what)
{
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

static PyObject *
read_blob(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int *failed)
{
    int64_t n;
    if (read_zigzag(p, pos, end, &n) < 0) {
        *failed = 1;
        corrupt("bad varint in a record");
        return NULL;
    }
    if (n < 0)
        Py_RETURN_NONE;
    if (n > end - *pos) {
        *failed = 1;
        corrupt("record field overruns the record");
        return NULL;
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)p + *pos, (Py_ssize_t)n);
    if (b == NULL)
        *failed = 1;
    *pos += (Py_ssize_t)n;
    return b;
}

#define OUT_OF_RANGE "a record offset or timestamp outside 64 bits"

static PyObject *
read_records(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, stop, count;
    long long base, base_ts;
    PyObject *append_ts, *offsets, *stamps, *keys, *values, *headers;
    if (!PyArg_ParseTuple(args, "y*nnnLLOO!O!O!O!O!", &buf, &pos, &stop, &count, &base, &base_ts, &append_ts,
                          &PyList_Type, &offsets, &PyList_Type, &stamps, &PyList_Type, &keys,
                          &PyList_Type, &values, &PyList_Type, &headers))
        return NULL;
    const unsigned char *p = buf.buf;
    PyObject *result = NULL, *empty = PyTuple_New(0), *stamp = NULL; /* stamp: the last timestamp, as an int */
    long long stamp_value = 0;
    int any_headers = 0;
    long long fixed_ts = 0;
    int use_fixed = append_ts != Py_None;
    if (empty == NULL)
        goto done;
    if (use_fixed) {
        fixed_ts = PyLong_AsLongLong(append_ts);
        if (fixed_ts == -1 && PyErr_Occurred())
            goto done;
    }
    if (pos < 0 || stop > buf.len || pos > stop) {
        corrupt("records outside the batch");
        goto done;
    }
    for (Py_ssize_t r = 0; r < count; r++) {
        int64_t len, ts_delta, offset_delta, n_headers;
        int failed = 0;
        if (read_zigzag(p, &pos, stop, &len) < 0 || len < 1 || len > stop - pos) {
            corrupt("record length out of range");
            goto done;
        }
        Py_ssize_t end = pos + (Py_ssize_t)len;
        pos += 1; /* attributes */
        if (read_zigzag(p, &pos, end, &ts_delta) < 0 || read_zigzag(p, &pos, end, &offset_delta) < 0) {
            corrupt("bad varint in a record");
            goto done;
        }
        long long offset, ts = fixed_ts;
        if (__builtin_add_overflow(base, offset_delta, &offset) ||
            (!use_fixed && __builtin_add_overflow(base_ts, ts_delta, &ts))) {
            corrupt(OUT_OF_RANGE);
            goto done;
        }
        if (stamp == NULL || ts != stamp_value) { /* records of one millisecond share one int */
            Py_XDECREF(stamp);
            stamp = PyLong_FromLongLong(ts);
            stamp_value = ts;
        }
        if (append_new(offsets, PyLong_FromLongLong(offset)) < 0 || stamp == NULL ||
            PyList_Append(stamps, stamp) < 0)
            goto done;
        PyObject *key = read_blob(p, &pos, end, &failed);
        if (failed || append_new(keys, key) < 0)
            goto done;
        PyObject *value = read_blob(p, &pos, end, &failed);
        if (failed || append_new(values, value) < 0)
            goto done;
        if (read_zigzag(p, &pos, end, &n_headers) < 0) {
            corrupt("bad varint in a record");
            goto done;
        }
        if (n_headers <= 0) {
            Py_INCREF(empty);
            if (append_new(headers, empty) < 0)
                goto done;
        } else {
            if (n_headers > end - pos) {
                corrupt("header count out of range");
                goto done;
            }
            PyObject *pairs = PyTuple_New((Py_ssize_t)n_headers);
            if (pairs == NULL)
                goto done;
            for (Py_ssize_t h = 0; h < n_headers; h++) {
                int64_t n;
                PyObject *name;
                if (read_zigzag(p, &pos, end, &n) < 0 || n > end - pos) {
                    Py_DECREF(pairs);
                    corrupt("bad header name");
                    goto done;
                }
                if (n < 0) {
                    name = PyUnicode_FromStringAndSize("", 0);
                } else {
                    name = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)n, "replace");
                    pos += (Py_ssize_t)n;
                }
                if (name == NULL) {
                    Py_DECREF(pairs);
                    goto done;
                }
                PyObject *hvalue = read_blob(p, &pos, end, &failed);
                if (failed) {
                    Py_DECREF(name);
                    Py_DECREF(pairs);
                    goto done;
                }
                PyObject *pair = PyTuple_Pack(2, name, hvalue);
                Py_DECREF(name);
                Py_DECREF(hvalue);
                if (pair == NULL) {
                    Py_DECREF(pairs);
                    goto done;
                }
                PyTuple_SET_ITEM(pairs, h, pair);
            }
            any_headers = 1;
            if (append_new(headers, pairs) < 0)
                goto done;
        }
        if (pos != end) {
            corrupt("record length mismatch");
            goto done;
        }
    }
    result = PyBool_FromLong(any_headers);
done:
    Py_XDECREF(empty);
    Py_XDECREF(stamp);
    PyBuffer_Release(&buf);
    return result;
}

/* A record's key or value as it lies in the record: its bytes and its length (below 0: null). */
typedef struct {
    const unsigned char *at;
    int64_t len;
} Blob;

/* The blob at p[*pos:end], as read_blob reads it; *pos moves past it. 0, or -1 when it overruns the record. */
static int
blob_at(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, Blob *b)
{
    if (read_zigzag(p, pos, end, &b->len) < 0 || b->len > end - *pos)
        return -1;
    b->at = p + *pos;
    if (b->len > 0)
        *pos += (Py_ssize_t)b->len;
    return 0;
}

/* Skip a varint-length blob (or null) inside a record; -1 if it does not fit. */
static int
skip_blob(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end)
{
    Blob b;
    return blob_at(p, pos, end, &b);
}

static PyObject *
check_records(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf;
    Py_ssize_t pos, stop, count;
    if (!PyArg_ParseTuple(args, "y*nnn", &buf, &pos, &stop, &count))
        return NULL;
    const unsigned char *p = buf.buf;
    PyObject *result = NULL;
    if (pos < 0 || stop > buf.len || pos > stop) {
        corrupt("records outside the batch");
        goto done;
    }
    for (Py_ssize_t r = 0; r < count; r++) {
        int64_t len, ts_delta, offset_delta, n_headers;
        if (read_zigzag(p, &pos, stop, &len) < 0 || len < 1 || len > stop - pos) {
            corrupt(pos >= stop ? "fewer records than the batch declares" : "record length out of range");
            goto done;
        }
        Py_ssize_t end = pos + (Py_ssize_t)len;
        pos += 1; /* attributes */
        if (read_zigzag(p, &pos, end, &ts_delta) < 0 || read_zigzag(p, &pos, end, &offset_delta) < 0) {
            corrupt("bad varint in a record");
            goto done;
        }
        if (offset_delta != r) {
            corrupt("a record's offset delta is not its position in the batch");
            goto done;
        }
        if (skip_blob(p, &pos, end) < 0 || skip_blob(p, &pos, end) < 0 ||
            read_zigzag(p, &pos, end, &n_headers) < 0) {
            corrupt("record field overruns the record");
            goto done;
        }
        for (int64_t h = 0; h < n_headers; h++) {
            if (skip_blob(p, &pos, end) < 0 || skip_blob(p, &pos, end) < 0) {
                corrupt("bad record header");
                goto done;
            }
        }
        if (pos != end) {
            corrupt("record length mismatch");
            goto done;
        }
    }
    if (pos != stop) {
        corrupt("more records than the batch declares");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&buf);
    return result;
}

/* ---------------------------------------------------------------- encoding */

/* A blob (bytes or None): its size with its length prefix, -1 with an exception set on a bad type. */
static Py_ssize_t
blob_size(PyObject *b)
{
    if (b == Py_None)
        return 1;
    if (!PyBytes_Check(b)) {
        PyErr_SetString(PyExc_TypeError, "record keys, values and header values must be bytes or None");
        return -1;
    }
    return zigzag_size(PyBytes_GET_SIZE(b)) + PyBytes_GET_SIZE(b);
}

static unsigned char *
put_blob(unsigned char *out, PyObject *b)
{
    if (b == Py_None) {
        *out++ = 1;
        return out;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    out = put_zigzag(out, n);
    memcpy(out, PyBytes_AS_STRING(b), n);
    return out + n;
}

#define EXTRA_PREFIX "polygate."
#define EXTRA_PREFIX_LEN 9

/* An extras value as header bytes: bytes as they are, str as UTF-8, int in decimal (into ``digits``);
 * anything else, and a str holding surrogate escapes, raises TypeError (the Python loop takes it). Returns the data, its length in *n. */
static const char *
extra_bytes(PyObject *v, char *digits, Py_ssize_t *n)
{
    if (PyBytes_Check(v)) {
        *n = PyBytes_GET_SIZE(v);
        return PyBytes_AS_STRING(v);
    }
    if (PyUnicode_CheckExact(v)) {
        const char *s = PyUnicode_AsUTF8AndSize(v, n);
        if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) { /* surrogate escapes */
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "a str holding surrogate escapes");
        }
        return s;
    }
    if (PyLong_CheckExact(v)) {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred())
            return NULL;
        *n = snprintf(digits, 24, "%lld", x);
        return digits;
    }
    PyErr_SetString(PyExc_TypeError, "extras values other than bytes, str and int");
    return NULL;
}

/* The extras of a record: NULL when it has none, or a dict; -1 (TypeError) for another mapping. */
static int
extras_dict(PyObject *extras, Py_ssize_t i, PyObject **x)
{
    *x = NULL;
    if (extras == Py_None)
        return 0;
    PyObject *item = PyList_GET_ITEM(extras, i);
    if (item == Py_None)
        return 0;
    if (PyDict_CheckExact(item)) {
        if (PyDict_GET_SIZE(item))
            *x = item;
        return 0;
    }
    Py_ssize_t size = PyObject_Size(item);
    if (size == 0)
        return 0;
    if (size > 0)
        PyErr_SetString(PyExc_TypeError, "extras other than dicts");
    return -1;
}

/* The record body size without its length prefix, and its header count in *count; -1 on error. */
static Py_ssize_t
record_size(int64_t d, int64_t t, PyObject *key, PyObject *value, PyObject *hdrs, PyObject *x, Py_ssize_t *count)
{
    Py_ssize_t size = 1 + zigzag_size(t) + zigzag_size(d), s;
    if ((s = blob_size(key)) < 0)
        return -1;
    size += s;
    if ((s = blob_size(value)) < 0)
        return -1;
    size += s;
    Py_ssize_t nh = hdrs == NULL ? 0 : PyTuple_GET_SIZE(hdrs);
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *pair = PyTuple_GET_ITEM(hdrs, h);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "headers must be (str, bytes | None) pairs");
            return -1;
        }
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &n) == NULL)
            return -1;
        size += zigzag_size(n) + n;
        if ((s = blob_size(PyTuple_GET_ITEM(pair, 1))) < 0)
            return -1;
        size += s;
    }
    if (x != NULL) {
        Py_ssize_t at = 0;
        PyObject *k, *v;
        char digits[24];
        while (PyDict_Next(x, &at, &k, &v)) {
            Py_ssize_t n;
            if (v == Py_None)
                continue;
            if (!PyUnicode_CheckExact(k)) {
                PyErr_SetString(PyExc_TypeError, "extras keys other than str");
                return -1;
            }
            if (PyUnicode_AsUTF8AndSize(k, &n) == NULL)
                return -1;
            size += zigzag_size(EXTRA_PREFIX_LEN + n) + EXTRA_PREFIX_LEN + n;
            if (extra_bytes(v, digits, &n) == NULL)
                return -1;
            size += zigzag_size(n) + n;
            nh++;
        }
    }
    *count = nh;
    return size + zigzag_size(nh);
}

static unsigned char *
put_bytes(unsigned char *out, const char *data, Py_ssize_t n)
{
    out = put_zigzag(out, n);
    memcpy(out, data, n);
    return out + n;
}

static unsigned char *
put_record(unsigned char *out, const int64_t *num, PyObject *key, PyObject *value, PyObject *hdrs, PyObject *x)
{
    out = put_zigzag(out, num[2]);
    *out++ = 0; /* attributes */
    out = put_zigzag(out, num[1]);
    out = put_zigzag(out, num[0]);
    out = put_blob(out, key);
    out = put_blob(out, value);
    out = put_zigzag(out, num[3]);
    Py_ssize_t nh = hdrs == NULL ? 0 : PyTuple_GET_SIZE(hdrs), n;
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *pair = PyTuple_GET_ITEM(hdrs, h);
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &n);
        out = put_bytes(out, name, n);
        out = put_blob(out, PyTuple_GET_ITEM(pair, 1));
    }
    if (x != NULL) {
        Py_ssize_t at = 0;
        PyObject *k, *v;
        char digits[24];
        while (PyDict_Next(x, &at, &k, &v)) {
            if (v == Py_None)
                continue;
            const char *name = PyUnicode_AsUTF8AndSize(k, &n);
            out = put_zigzag(out, EXTRA_PREFIX_LEN + n);
            memcpy(out, EXTRA_PREFIX, EXTRA_PREFIX_LEN);
            memcpy(out + EXTRA_PREFIX_LEN, name, n);
            out += EXTRA_PREFIX_LEN + n;
            const char *data = extra_bytes(v, digits, &n);
            out = put_bytes(out, data, n);
        }
    }
    return out;
}

/* offsets[i] less base, or i where offsets[i] is None: a record's offset delta; -1 with an exception set
 * (TypeError, or OverflowError outside 64 bits: the Python loop takes those). */
static int
offset_delta(PyObject *offsets, Py_ssize_t i, long long base, long long *d)
{
    if (PyList_GET_ITEM(offsets, i) == Py_None) {
        *d = i;
        return 0;
    }
    long long o;
    if (list_int64(offsets, i, &o) < 0)
        return -1;
    if (__builtin_sub_overflow(o, base, d)) {
        PyErr_SetString(PyExc_OverflowError, "an offset delta outside 64 bits");
        return -1;
    }
    return 0;
}

static PyObject *
encode_records(PyObject *self, PyObject *args)
{
    PyObject *offsets, *stamps, *keys, *values, *headers, *extras = Py_None;
    long long base;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!LO!O!O!O|O", &PyList_Type, &offsets, &base, &PyList_Type, &stamps, &PyList_Type,
                          &keys, &PyList_Type, &values, &headers, &extras))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    if (PyList_GET_SIZE(stamps) != n || PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(values) != n ||
        (headers != Py_None && (!PyList_Check(headers) || PyList_GET_SIZE(headers) != n)) ||
        (extras != Py_None && (!PyList_Check(extras) || PyList_GET_SIZE(extras) != n))) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        return NULL;
    }
    /* per record: offset delta, timestamp (then its delta), body size, header count */
    int64_t *nums = PyMem_Malloc(sizeof(int64_t) * 4 * (n ? n : 1));
    if (nums == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL, *records = NULL, *x;
    long long base_ts = -1, max_ts = -1, last_delta = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* the batch's timestamps: the least and most of those set (>= 0) */
        long long t;
        if (list_int64(stamps, i, &t) < 0)
            goto done;
        nums[4 * i + 1] = t;
        if (t >= 0) {
            if (base_ts < 0 || t < base_ts)
                base_ts = t;
            if (t > max_ts)
                max_ts = t;
        }
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hdrs = headers == Py_None ? NULL : PyList_GET_ITEM(headers, i);
        if (hdrs != NULL && !PyTuple_Check(hdrs)) {
            PyErr_SetString(PyExc_TypeError, "headers must be tuples");
            goto done;
        }
        if (extras_dict(extras, i, &x) < 0)
            goto done;
        long long d, t = nums[4 * i + 1];
        if (offset_delta(offsets, i, base, &d) < 0)
            goto done;
        t = t >= 0 ? t - base_ts : 0; /* a record without a timestamp takes the batch's first */
        if (i == 0 || d > last_delta)
            last_delta = d;
        Py_ssize_t count;
        Py_ssize_t size = record_size(d, t, PyList_GET_ITEM(keys, i), PyList_GET_ITEM(values, i), hdrs, x, &count);
        if (size < 0)
            goto done;
        nums[4 * i] = d;
        nums[4 * i + 1] = t;
        nums[4 * i + 2] = size;
        nums[4 * i + 3] = count;
        total += zigzag_size(size) + size;
    }
    records = PyBytes_FromStringAndSize(NULL, total);
    if (records == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(records);
    for (Py_ssize_t i = 0; i < n; i++) {
        extras_dict(extras, i, &x);
        out = put_record(out, nums + 4 * i, PyList_GET_ITEM(keys, i), PyList_GET_ITEM(values, i),
                         headers == Py_None ? NULL : PyList_GET_ITEM(headers, i), x);
    }
    result = Py_BuildValue("(OLLL)", records, last_delta, base_ts, max_ts);
done:
    Py_XDECREF(records);
    PyMem_Free(nums);
    return result;
}

/* ---------------------------------------------------------------- stored batches into a TANK bundle */

#define BATCH_HEADER_SIZE 61 /* baseOffset .. recordCount */
#define ATTR_COMPRESSION 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_CONTROL 0x20

/* The record at p[*pos:stop], read as read_records reads it (its headers walked, not kept): its timestamp and
 * offset deltas, key and value; *pos moves past it. 0, or -1 when it does not decode. */
static int
record_at(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t stop, int64_t *ts_delta, int64_t *offset_delta,
          Blob *key, Blob *value)
{
    int64_t len, n_headers;
    if (read_zigzag(p, pos, stop, &len) < 0 || len < 1 || len > stop - *pos)
        return -1;
    Py_ssize_t end = *pos + (Py_ssize_t)len;
    *pos += 1; /* attributes */
    if (read_zigzag(p, pos, end, ts_delta) < 0 || read_zigzag(p, pos, end, offset_delta) < 0 ||
        blob_at(p, pos, end, key) < 0 || blob_at(p, pos, end, value) < 0 || read_zigzag(p, pos, end, &n_headers) < 0 ||
        (n_headers > 0 && n_headers > end - *pos))
        return -1;
    for (int64_t h = 0; h < n_headers; h++)
        if (skip_blob(p, pos, end) < 0 || skip_blob(p, pos, end) < 0) /* its name and value */
            return -1;
    return *pos == end ? 0 : -1;
}

/* Called for each record of walk_batches: its offset, timestamp, key and value; 0 to go on, 1 to stop the walk
 * (which then answers 0), -1 with an exception set. */
typedef int (*kafka_record)(void *ctx, int64_t offset, int64_t ts, const Blob *key, const Blob *value);

/* The records of a stored payload p[0:end] (v2 batches, the first numbered from ``base``, every other from its own
 * baseOffset), each passed to ``each``, as format.read_into reads them: control batches skipped, a batch header cut
 * short at the end left out. 1 when every batch decodes; 0 at anything else, with no exception set (a fault, an
 * exception from ``inflate``, ``each`` stopping, numbers outside 64 bits); -1 with an exception to pass on (an
 * interrupt, a failed append to ``sets``). A compressed batch's records are ``inflate(view, limit, codec)`` (bytes;
 * each batch within ``limit``), appended to ``sets``; with ``inflate`` NULL, ``sets[*taken]`` (*taken then moves
 * on): what an earlier walk of the same payload inflated. */
static int
walk_batches(const unsigned char *p, Py_ssize_t end, int64_t base, Py_ssize_t limit, PyObject *inflate,
             PyObject *sets, Py_ssize_t *taken, kafka_record each, void *ctx)
{
    for (Py_ssize_t pos = 0; end - pos >= BATCH_HEADER_SIZE;) {
        const unsigned char *h = p + pos;
        int64_t length = (int32_t)be(h + 8, 4);
        if (h[16] != 2 || length < BATCH_HEADER_SIZE - 12 || length > end - pos - 12)
            return 0;
        Py_ssize_t batch_end = pos + 12 + (Py_ssize_t)length;
        int attributes = (int)be(h + 21, 2);
        if (pos)
            base = (int64_t)be(h, 8);
        pos = batch_end;
        if (attributes & ATTR_CONTROL)
            continue;
        const unsigned char *body = h + BATCH_HEADER_SIZE;
        Py_ssize_t at = 0, stop = batch_end - (body - p);
        PyObject *set = NULL;
        if (attributes & ATTR_COMPRESSION) {
            if (inflate == NULL) {
                if (*taken >= PyList_GET_SIZE(sets))
                    return 0;
                set = Py_NewRef(PyList_GET_ITEM(sets, (*taken)++));
            } else {
                set = inflated(inflate, body, stop, limit, attributes & ATTR_COMPRESSION);
                if (set == NULL)
                    return PyErr_Occurred() ? -1 : 0; /* an interrupt (not a fault of the batch) is passed on */
                if (PyList_Append(sets, set) < 0) {
                    Py_DECREF(set);
                    return -1;
                }
            }
            body = (const unsigned char *)PyBytes_AS_STRING(set);
            stop = PyBytes_GET_SIZE(set);
        }
        int64_t base_ts = (int64_t)be(h + 27, 8), max_ts = (int64_t)be(h + 35, 8);
        int32_t count = (int32_t)be(h + 57, 4);
        int whole = 1;
        for (int32_t r = 0; r < count && whole == 1; r++) {
            int64_t ts_delta, offset_delta, offset, ts = max_ts;
            Blob key, value;
            if (record_at(body, &at, stop, &ts_delta, &offset_delta, &key, &value) < 0 ||
                __builtin_add_overflow(base, offset_delta, &offset) ||
                (!(attributes & ATTR_LOG_APPEND_TIME) && __builtin_add_overflow(base_ts, ts_delta, &ts)))
                whole = 0;
            else
                whole = 1 - each(ctx, offset, ts, &key, &value); /* 0 -> 1, 1 -> 0, -1 -> 2 */
        }
        Py_XDECREF(set);
        if (whole != 1)
            return whole == 2 ? -1 : 0;
    }
    return 1;
}

/* tank_bundle: the messages, what the first walk learns of them (their offsets ascend, whether they follow on
 * from ``base`` or need a SPARSE bundle, their size either way) and, in the second, where the next one goes. */
typedef struct {
    int64_t base;  /* the batch's base offset: a plain bundle's messages follow on from it */
    int64_t count; /* the messages walked so far (in the second walk: written so far) */
    int64_t total; /* all of them (known in the second walk) */
    int64_t first, last, base_ts, max_ts;
    uint64_t prev_ts;
    int sparse;            /* an offset that does not follow on: a SPARSE bundle */
    Py_ssize_t size;       /* the messages as a plain bundle writes them */
    Py_ssize_t gaps;       /* what a SPARSE bundle adds: each message's gap since the one before... */
    Py_ssize_t last_gap;   /* ... but the last one's, which the header holds */
    unsigned char *out;
} TankBundle;

/* A record's timestamp as TANK keeps it (below 0: 0), as format._encode_plain_bundle writes it. */
static inline uint64_t
tank_ts(int64_t ts)
{
    return ts > 0 ? (uint64_t)ts : 0;
}

static int
measure_tank_message(void *ctx, int64_t offset, int64_t ts, const Blob *key, const Blob *value)
{
    TankBundle *m = ctx;
    int64_t expected;
    Py_ssize_t key_len = key->len > 0 ? (Py_ssize_t)key->len : 0, value_len = value->len > 0 ? (Py_ssize_t)value->len : 0;
    if (m->count ? offset <= m->last : offset < 0)
        return 1; /* offsets that do not ascend, or a first one below 0: the columns path's */
    if (__builtin_add_overflow(m->base, m->count, &expected) || offset != expected)
        m->sparse = 1;
    m->last_gap = m->count && offset - m->last > 1 ? uvarint_size((uint64_t)(offset - m->last - 1)) : 0;
    m->gaps += m->last_gap;
    uint64_t t = tank_ts(ts);
    m->size += tank_size(0, m->count && t == m->prev_ts, key_len, value_len);
    if (m->count == 0) {
        m->first = offset;
        m->base_ts = m->max_ts = (int64_t)t;
    }
    if ((int64_t)t < m->base_ts)
        m->base_ts = (int64_t)t;
    if ((int64_t)t > m->max_ts)
        m->max_ts = (int64_t)t;
    m->last = offset;
    m->prev_ts = t;
    m->count++;
    return 0;
}

static int
put_tank_message(void *ctx, int64_t offset, int64_t ts, const Blob *key, const Blob *value)
{
    TankBundle *m = ctx;
    uint64_t t = tank_ts(ts), gap = 0;
    unsigned char seq_flags = 0;
    if (m->sparse && m->count && m->count < m->total - 1) { /* a middle message: its gap, or none */
        gap = (uint64_t)(offset - m->last - 1);
        seq_flags = gap ? 0 : SEQ_PREV_PLUS_ONE;
    }
    m->out = tank_put(m->out, seq_flags, gap, m->count && t == m->prev_ts, t, (const char *)key->at,
                      key->len > 0 ? (Py_ssize_t)key->len : 0, (const char *)value->at,
                      value->len > 0 ? (Py_ssize_t)value->len : 0);
    m->last = offset;
    m->prev_ts = t;
    m->count++;
    return 0;
}

/* After the first walk: the size of the whole bundle, ``varint len | bundle`` (0: no messages, nothing to
 * write); m->total set and the counts made ready for the second walk. */
static Py_ssize_t
tank_bundle_size(TankBundle *m, Py_ssize_t *bundle)
{
    uint64_t n = (uint64_t)m->count;
    Py_ssize_t head = 1 + (n < 16 ? 0 : uvarint_size(n)), messages = m->size;
    if (m->sparse) {
        head += 8 + (n > 1 ? uvarint_size((uint64_t)(m->last - m->first) - 1) : 0);
        messages += m->gaps - (n > 1 ? m->last_gap : 0); /* the last message's gap is in the header */
    }
    *bundle = head + messages;
    m->total = m->count;
    m->count = 0;
    m->prev_ts = 0;
    return n ? uvarint_size((uint64_t)*bundle) + *bundle : 0;
}

/* Write ``varint len | header`` of a bundle of ``bundle`` bytes of the m->total messages at m->out, as
 * format.encode_fields writes it: the count in the flags (0 there and a varint after for 16 and more); a
 * SPARSE bundle's first sequence number (offset + 1, u64) and, for several messages, its last less the first
 * less one. */
static void
put_tank_bundle_head(TankBundle *m, Py_ssize_t bundle)
{
    uint64_t n = (uint64_t)m->total;
    unsigned char flags = m->sparse ? SPARSE : 0;
    m->out = put_uvarint(m->out, (uint64_t)bundle);
    if (n < 16) {
        *m->out++ = flags | (unsigned char)(n << 2);
    } else {
        *m->out++ = flags;
        m->out = put_uvarint(m->out, n);
    }
    if (m->sparse) {
        uint64_t first_seq = (uint64_t)m->first + 1;
        for (int b = 0; b < 8; b++)
            *m->out++ = (unsigned char)(first_seq >> (8 * b));
        if (n > 1)
            m->out = put_uvarint(m->out, (uint64_t)(m->last - m->first) - 1);
    }
}

/* A list's int within 64 bits: 0, or -1 (no exception set) for anything else. */
static int
int64_of(PyObject *v, int64_t *out)
{
    if (!PyLong_Check(v))
        return -1;
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = x;
    return 0;
}

static PyObject *
tank_bundle(PyObject *self, PyObject *args)
{
    PyObject *payloads, *bases, *base_obj, *inflate, *sets = NULL, *bundle_out = NULL, *result = NULL;
    Py_ssize_t limit, taken = 0;
    int64_t base, first;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!OnO", &PyList_Type, &payloads, &PyList_Type, &bases, &base_obj, &limit, &inflate))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    if (PyList_GET_SIZE(bases) != n || int64_of(base_obj, &base) < 0)
        Py_RETURN_NONE; /* the columns path's */
    payloads = PyList_AsTuple(payloads); /* held as they are: ``inflate`` runs Python code between the items */
    bases = payloads == NULL ? NULL : PyList_AsTuple(bases);
    if (bases == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* the types, and the numbers within 64 bits */
        if (!PyBytes_Check(PyTuple_GET_ITEM(payloads, i)) || int64_of(PyTuple_GET_ITEM(bases, i), &first) < 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    sets = PyList_New(0);
    if (sets == NULL)
        goto done;
    TankBundle m = {.base = base, .base_ts = -1, .max_ts = -1};
    int pass, whole = 1;
    for (pass = 0; pass < 2 && whole == 1; pass++) {
        if (pass == 1) { /* the size known: the bundle written into one bytes object, its head first */
            Py_ssize_t bundle, size = tank_bundle_size(&m, &bundle);
            bundle_out = PyBytes_FromStringAndSize(NULL, size);
            if (bundle_out == NULL)
                goto done;
            m.out = (unsigned char *)PyBytes_AS_STRING(bundle_out);
            if (size)
                put_tank_bundle_head(&m, bundle);
        }
        for (Py_ssize_t i = 0; i < n && whole == 1; i++) {
            PyObject *payload = PyTuple_GET_ITEM(payloads, i);
            int64_of(PyTuple_GET_ITEM(bases, i), &first);
            whole = walk_batches((const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), first,
                                 limit, pass ? NULL : inflate, sets, &taken,
                                 pass ? put_tank_message : measure_tank_message, &m);
        }
    }
    if (whole < 0)
        goto done;
    if (whole == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = Py_BuildValue("(OLLLL)", bundle_out, (long long)m.total, (long long)(m.total ? m.last - base : 0),
                           (long long)m.base_ts, (long long)m.max_ts);
done:
    Py_XDECREF(bundle_out);
    Py_XDECREF(sets);
    Py_XDECREF(bases);
    Py_XDECREF(payloads);
    return result;
}

static PyMethodDef methods[] = {
    {"read_records", read_records, METH_VARARGS, "Append the fields of v2 records to column lists."},
    {"encode_records", encode_records, METH_VARARGS, "The records part of a v2 batch and its header fields, from columns."},
    {"check_records", check_records, METH_VARARGS, "Check that a produced batch holds what it declares."},
    {"tank_bundle", tank_bundle, METH_VARARGS, "Stored v2 batches as one TANK bundle, in one pass."},
    {NULL, NULL, 0, NULL},
};

SPEEDUPS_MODULE("Kafka v2 record loops in C.", methods)
