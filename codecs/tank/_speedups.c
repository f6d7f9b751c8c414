/* The TANK message loops of conversions in C (optional; format.py has the same in Python).
 *
 * read_messages(data, count, sparse, first_seq, last_seq, seqs, stamps, keys, values) -> (read, end)
 *     appends the fields of up to ``count`` messages of a message set to the lists, as
 *     ``format._read_messages`` does, stopping at the first message cut short or undecodable;
 *     returns how many it read and the position after the last. OverflowError for sequence
 *     numbers beyond 64 bits (the Python loop takes them).
 * encode_messages(stamps, keys, values, seqs) -> bytes
 *     the messages part of an uncompressed bundle, as ``format._encode_messages`` writes it:
 *     stamps are u64 timestamps (ms), keys bytes or None (cut to 255 bytes), values bytes;
 *     seqs is None, or one ascending sequence number per message for a SPARSE bundle.
 *     TypeError or OverflowError for what only the Python loop takes (other types, out of range).
 * read_payload(payload, first_seq, limit, inflate, offsets, stamps, keys, values) -> bool
 *     appends the messages of a stored payload (``varint len | bundle``...) to the lists, as
 *     ``TankFormat.columns`` reads them: offsets (sequence numbers less one, the first bundle's numbered from
 *     ``first_seq`` unless SPARSE, each next one from where the one before ended), u64 timestamps, keys, values.
 *     A snappy message set is ``inflate(view, limit left)`` (bytes; the limit falls by what each inflates to).
 *     False, with what it appended left in the lists, at anything else: a fault, an exception from ``inflate``,
 *     numbers past 64 bits; the Python loop then reads the payload again and names the fault.
 * kafka_records(payloads, first_seqs, base_offset, limit, inflate)
 *         -> (records, count, last_offset_delta, base_timestamp, max_timestamp) | None
 *     the messages of stored payloads (a list of bytes, each numbered from its item of ``first_seqs`` as
 *     ``read_payload`` numbers it, each inflated within ``limit`` through ``inflate`` as there) written as Kafka v2
 *     records in one pass, with no Python object per record: the bytes and header fields that ``TankFormat.columns``
 *     then the Kafka format's ``encode_records`` give (offsets relative to ``base_offset``, timestamps relative to the
 *     least, u64 timestamps above 2^63-1 read as 2^63-1, no headers). None where ``read_payload`` would answer False,
 *     or for offsets or deltas outside 64 bits: the columns path then converts, or names the fault.
 * encode_plain_bundle(offsets, base_offset, stamps, keys, values) -> bytes | None
 *     ``varint len | bundle`` of one uncompressed, non-SPARSE bundle of the records, as
 *     ``format._encode_plain_bundle``: None unless the offsets are base_offset, base_offset + 1, ... (none None);
 *     stamps below 0 written as 0, keys cut to 255 bytes (empty: none), values None written empty.
 *     TypeError or OverflowError for what only the Python path takes (other types, out of range).
 * validate_plain(payload, limit) -> (records, span) | None
 *     what ``TankFormat.validate`` returns for a produced payload (``varint len | bundle``...) whose
 *     bundles are all valid: uncompressed, or snappy, each snappy message set decoded here into a scratch
 *     buffer (no Python call, no bytes object: one pass, one copy) within what is left of ``limit``, its
 *     declared length checked before anything is decoded; None for anything else (a fault, a block that does
 *     not decode exactly, a sequence number past 64 bits), which the Python path then checks and refuses
 *     with its own message.
 * parse_produce(payload, with_seqnum) -> (request_id, [(topic, [(partition, stored, base_seq, header)])])
 *     the walk of ``handlers.parse_produce``: ``topic`` as str (UTF-8, surrogateescape), ``stored`` the partition's ``varint len | bundle``
 *     (a Produce-with-seqnum's u64 base sequence number taken out), ``header`` the bundle's
 *     ``(flags, count, first_seq, seq_delta, body, first_ts)`` as ``format.parse_header`` reads it (``seq_delta``
 *     -1 unless a SPARSE bundle of several messages; ``first_ts`` 0 when ``format.first_timestamp`` would
 *     take the time now), or None when it does not parse. ValueError for a request cut short.
 * parse_plain_produce(payload, with_seqnum) -> (request_id, topic, partition, stored, count, timestamp, base_seq) | None
 *     what clients send most, ahead of ``parse_produce``: a request for one partition of one topic whose
 *     bundle is plain (not SPARSE, with its own timestamp, a count ``handlers._checked_batch`` takes as it
 *     is); its fields as ``parse_produce`` and ``handlers._batch_of_header`` make them. None for any other
 *     request, whole or not: ``parse_produce`` takes it, with its codes and faults.
 * check_messages(data, count, sparse, first_seq, last_seq)
 *     checks that a produced bundle's message set is exactly ``count`` whole messages, whose sequence
 *     numbers ascend in a SPARSE bundle; ValueError naming the first fault.
 */
#include "_messages.h"
#include <string.h>

/* The gap before message i of n in a SPARSE bundle: 0 for the first and last (their sequence numbers are
 * in the bundle header), else the sequence numbers skipped since the previous message. OverflowError
 * (the Python loop then refuses them) when the sequence numbers do not ascend. */
static int
gap_of(PyObject *seqs, Py_ssize_t i, Py_ssize_t n, uint64_t *gap)
{
    *gap = 0;
    if (seqs == Py_None || i == 0)
        return 0;
    unsigned long long prev = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(seqs, i - 1));
    if (prev == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    unsigned long long seq = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(seqs, i));
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (seq <= prev) {
        PyErr_SetString(PyExc_OverflowError, "sequence numbers must ascend");
        return -1;
    }
    if (i < n - 1)
        *gap = seq - prev - 1;
    return 0;
}

static PyObject *
encode_messages(PyObject *self, PyObject *args)
{
    PyObject *stamps, *keys, *values, *seqs;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyList_Type, &stamps, &PyList_Type, &keys, &PyList_Type, &values,
                          &seqs))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(stamps) != n || PyList_GET_SIZE(keys) != n ||
        (seqs != Py_None && (!PyList_Check(seqs) || PyList_GET_SIZE(seqs) != n))) {
        PyErr_SetString(PyExc_TypeError, "one timestamp, key, value (and sequence number) per message");
        return NULL;
    }
    /* First pass: check the types, size the bundle. */
    Py_ssize_t size = 0;
    uint64_t prev_ts = 0, gap;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        unsigned long long ts = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(stamps, i));
        if (ts == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
        if ((key != Py_None && !PyBytes_Check(key)) || !PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes or None, values bytes");
            return NULL;
        }
        if (gap_of(seqs, i, n, &gap) < 0)
            return NULL;
        size += tank_size(gap, i && ts == prev_ts, key != Py_None ? PyBytes_GET_SIZE(key) : 0,
                          PyBytes_GET_SIZE(value));
        prev_ts = ts;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    /* Second pass: write (the first one checked everything that can fail). */
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        uint64_t ts = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(stamps, i));
        gap_of(seqs, i, n, &gap);
        p = tank_put(p, seqs != Py_None && i && i < n - 1 && !gap ? SEQ_PREV_PLUS_ONE : 0, gap, i && ts == prev_ts,
                     ts, key != Py_None ? PyBytes_AS_STRING(key) : NULL, key != Py_None ? PyBytes_GET_SIZE(key) : 0,
                     PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        prev_ts = ts;
    }
    return out;
}

/* encode_plain_bundle: the timestamp of message i as TANK keeps it (below 0: 0); -1 with an exception set. */
static int
plain_ts(PyObject *stamps, Py_ssize_t i, uint64_t *ts)
{
    long long t;
    if (list_int64(stamps, i, &t) < 0)
        return -1;
    *ts = t > 0 ? (uint64_t)t : 0;
    return 0;
}

static PyObject *
encode_plain_bundle(PyObject *self, PyObject *args)
{
    PyObject *offsets, *stamps, *keys, *values;
    long long base;
    (void)self;
    if (record_columns(args, "message", &offsets, &base, &stamps, &keys, &values) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(offsets);
    if (n == 0)
        Py_RETURN_NONE;
    /* First pass: the offsets follow on from base, the types hold; size the messages. */
    Py_ssize_t size = 0;
    uint64_t prev_ts = 0, ts;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(offsets, i), *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        long long offset, expected;
        if (o == Py_None) /* numbered by the Python path, in a SPARSE bundle */
            Py_RETURN_NONE;
        if (list_int64(offsets, i, &offset) < 0 || plain_ts(stamps, i, &ts) < 0)
            return NULL;
        if (__builtin_add_overflow(base, (long long)i, &expected) || offset != expected)
            Py_RETURN_NONE;
        if ((key != Py_None && !PyBytes_Check(key)) || (value != Py_None && !PyBytes_Check(value))) {
            PyErr_SetString(PyExc_TypeError, "keys and values must be bytes or None");
            return NULL;
        }
        size += tank_size(0, i && ts == prev_ts, key != Py_None ? PyBytes_GET_SIZE(key) : 0,
                          value != Py_None ? PyBytes_GET_SIZE(value) : 0);
        prev_ts = ts;
    }
    Py_ssize_t head = 1 + ((uint64_t)n < 16 ? 0 : uvarint_size((uint64_t)n)), bundle = head + size;
    PyObject *out = PyBytes_FromStringAndSize(NULL, uvarint_size((uint64_t)bundle) + bundle);
    if (out == NULL)
        return NULL;
    /* Second pass: write (the first one checked everything that can fail). */
    unsigned char *p = put_uvarint((unsigned char *)PyBytes_AS_STRING(out), (uint64_t)bundle);
    if (n < 16) {
        *p++ = (unsigned char)(n << 2);
    } else {
        *p++ = 0;
        p = put_uvarint(p, (uint64_t)n);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        plain_ts(stamps, i, &ts);
        p = tank_put(p, 0, 0, i && ts == prev_ts, ts, key != Py_None ? PyBytes_AS_STRING(key) : NULL,
                     key != Py_None ? PyBytes_GET_SIZE(key) : 0, value != Py_None ? PyBytes_AS_STRING(value) : NULL,
                     value != Py_None ? PyBytes_GET_SIZE(value) : 0);
        prev_ts = ts;
    }
    return out;
}

/* The lists read_messages appends to. */
typedef struct {
    PyObject *seqs, *stamps, *keys, *values;
    PyObject *stamp; /* the last timestamp appended, as an int (NULL before the first): messages of one
                      * millisecond share one int; released by the caller */
    uint64_t stamp_value;
} Lists;

static int
append_message(void *ctx, uint64_t seq, uint64_t ts, const unsigned char *key, Py_ssize_t key_len,
               const unsigned char *value, Py_ssize_t value_len)
{
    Lists *lists = ctx;
    if (lists->stamp == NULL || ts != lists->stamp_value) {
        Py_XDECREF(lists->stamp);
        lists->stamp = PyLong_FromUnsignedLongLong(ts);
        lists->stamp_value = ts;
    }
    return append_new(lists->seqs, PyLong_FromUnsignedLongLong(seq)) < 0 || lists->stamp == NULL ||
                   PyList_Append(lists->stamps, lists->stamp) < 0 ||
                   append_new(lists->keys, key == NULL ? Py_NewRef(Py_None)
                                                       : PyBytes_FromStringAndSize((const char *)key, key_len)) < 0 ||
                   append_new(lists->values, PyBytes_FromStringAndSize((const char *)value, value_len)) < 0
               ? -1
               : 0;
}

static PyObject *
read_messages(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count, read, stop;
    int sparse;
    PyObject *first_obj, *last_obj;
    Lists lists;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*npOOO!O!O!O!", &buf, &count, &sparse, &first_obj, &last_obj, &PyList_Type,
                          &lists.seqs, &PyList_Type, &lists.stamps, &PyList_Type, &lists.keys, &PyList_Type,
                          &lists.values))
        return NULL;
    PyObject *result = NULL;
    lists.stamp = NULL;
    unsigned long long first = PyLong_AsUnsignedLongLong(first_obj), last = 0;
    if (PyErr_Occurred())
        goto done;
    last = PyLong_AsUnsignedLongLong(last_obj);
    if (PyErr_Occurred())
        goto done;
    if (tank_walk(buf.buf, buf.len, count, sparse, first, last, append_message, &lists, &read, &stop) == 0)
        result = Py_BuildValue("(nn)", read, stop);
done:
    Py_XDECREF(lists.stamp);
    PyBuffer_Release(&buf);
    return result;
}

/* The fault of a produced message set p[0:end] that should hold ``count`` whole messages (sequence numbers
 * ``first``..``last`` in a SPARSE bundle, ascending), or NULL. */
static const char *
message_set_fault(const unsigned char *p, Py_ssize_t end, Py_ssize_t count, int sparse, uint64_t first,
                  uint64_t last)
{
    const char *fault = NULL;
    Py_ssize_t pos = 0, i = 0;
    uint64_t seq = first, gap, vlen;
    for (; i < count && !fault; i++) {
        if (pos >= end)
            return "message set cut short";
        unsigned char flags = p[pos++];
        if (sparse && i) {
            if (i == count - 1) {
                if (last <= seq)
                    fault = "sequence numbers do not ascend";
                seq = last;
            } else {
                gap = 0;
                if (!(flags & SEQ_PREV_PLUS_ONE) && read_varint5(p, &pos, end, &gap) < 0)
                    fault = "message set cut short";
                else if (gap >= last - seq - 1) /* seq < last here: the last message must still ascend */
                    fault = "sequence numbers do not ascend";
                seq += gap + 1;
            }
        }
        if (!(flags & USE_LAST_TS))
            pos += 8;
        if (flags & HAVE_KEY)
            pos = pos < end ? pos + 1 + p[pos] : end + 1;
        if (pos > end || read_varint5(p, &pos, end, &vlen) < 0 || vlen > (uint64_t)(end - pos))
            fault = "message set cut short";
        else
            pos += (Py_ssize_t)vlen;
    }
    if (!fault && pos != end)
        fault = "bytes after the last message of a bundle";
    return fault;
}

static PyObject *
check_messages(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t count;
    int sparse;
    unsigned long long first, last;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*npKK", &buf, &count, &sparse, &first, &last))
        return NULL;
    const char *fault = message_set_fault(buf.buf, buf.len, count, sparse, first, last);
    PyBuffer_Release(&buf);
    if (fault) {
        PyErr_SetString(PyExc_ValueError, fault);
        return NULL;
    }
    Py_RETURN_NONE;
}

#define CODEC_MASK 0x03
#define EXTRA_FLAGS 0x80
#define RICH_PRODUCER_INFO 0x01
#define PRODUCER_INFO_SIZE 14 /* u32 | u64 | u16 */

/* The raw snappy block p[0:n] decoded into *out (``PyMem_Free`` it), *out_len its length: 0. 1, with nothing
 * to free, when the block declares more than ``budget`` bytes (checked before decoding) or does not decode to
 * exactly what it declares, every byte of it read (as the Python path's decoder requires); -1 (MemoryError). */
static int
snappy_decode(const unsigned char *p, Py_ssize_t n, Py_ssize_t budget, unsigned char **out, Py_ssize_t *out_len)
{
    Py_ssize_t ip = 0;
    uint64_t size, op = 0;
    if (read_varint5(p, &ip, n, &size) < 0 || size > UINT32_MAX || budget < 0 || size > (uint64_t)budget)
        return 1;
    unsigned char *d = PyMem_Malloc(size ? (size_t)size : 1);
    if (d == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    while (ip < n) {
        unsigned char tag = p[ip++];
        uint64_t length, offset;
        switch (tag & 3) {
        case 0: /* a literal: its length less one in the tag, or in the 1-4 bytes after it */
            length = tag >> 2;
            if (length >= 60) {
                Py_ssize_t extra = (Py_ssize_t)length - 59;
                if (n - ip < extra)
                    goto bad;
                length = 0;
                for (Py_ssize_t b = 0; b < extra; b++)
                    length |= (uint64_t)p[ip + b] << (8 * b);
                ip += extra;
            }
            length += 1;
            if (length > (uint64_t)(n - ip) || length > size - op)
                goto bad;
            memcpy(d + op, p + ip, (size_t)length);
            ip += (Py_ssize_t)length;
            op += length;
            continue;
        case 1: /* a copy: length 4-11 and an 11-bit offset */
            if (ip >= n)
                goto bad;
            length = ((tag >> 2) & 7) + 4;
            offset = ((uint64_t)(tag >> 5) << 8) | p[ip++];
            break;
        case 2: /* a copy: length 1-64 and a 16-bit offset */
            if (n - ip < 2)
                goto bad;
            length = (tag >> 2) + 1;
            offset = (uint64_t)p[ip] | (uint64_t)p[ip + 1] << 8;
            ip += 2;
            break;
        default: /* a copy: length 1-64 and a 32-bit offset */
            if (n - ip < 4)
                goto bad;
            length = (tag >> 2) + 1;
            offset = (uint64_t)p[ip] | (uint64_t)p[ip + 1] << 8 | (uint64_t)p[ip + 2] << 16 | (uint64_t)p[ip + 3] << 24;
            ip += 4;
            break;
        }
        if (offset == 0 || offset > op || length > size - op)
            goto bad;
        if (offset >= length)
            memcpy(d + op, d + op - offset, (size_t)length);
        else /* overlapping: the bytes it repeats are written as it goes */
            for (uint64_t i = 0; i < length; i++)
                d[op + i] = d[op + i - offset];
        op += length;
    }
    if (op != size)
        goto bad;
    *out = d;
    *out_len = (Py_ssize_t)size;
    return 0;
bad:
    PyMem_Free(d);
    return 1;
}

static PyObject *
validate_plain(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t budget;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &budget))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t end = buf.len, pos = 0;
    uint64_t records = 0, span = 0;
    int ok = end > 0;
    unsigned char *set = NULL; /* a snappy bundle's message set, decoded */
    while (ok && pos < end) {
        uint64_t n, count;
        Py_ssize_t start = pos;
        if (read_varint5(p, &pos, end, &n) < 0 || n == 0 || n > (uint64_t)(end - pos)) {
            ok = 0;
            break;
        }
        Py_ssize_t h = pos, bundle_end = pos + (Py_ssize_t)n;
        unsigned char flags = p[h++];
        if ((flags & CODEC_MASK) > 1) { /* the Python path's */
            ok = 0;
            break;
        }
        if (flags & EXTRA_FLAGS) {
            if (h >= bundle_end) {
                ok = 0;
                break;
            }
            h += 1 + ((p[h] & RICH_PRODUCER_INFO) ? PRODUCER_INFO_SIZE : 0);
        }
        count = (flags >> 2) & 0x0F;
        if (!count && (h > bundle_end || read_varint5(p, &h, bundle_end, &count) < 0)) {
            ok = 0;
            break;
        }
        uint64_t first = 0, last = 0;
        int sparse = (flags & SPARSE) != 0;
        if (sparse) {
            uint64_t delta;
            if (start != 0 || bundle_end != end || h + 8 > bundle_end) { /* SPARSE: the payload's only bundle */
                ok = 0;
                break;
            }
            first = 0;
            for (int b = 7; b >= 0; b--)
                first = (first << 8) | p[h + b]; /* u64, little-endian */
            h += 8;
            if (count != 1) {
                if (read_varint5(p, &h, bundle_end, &delta) < 0 || first > UINT64_MAX - delta - 1) {
                    ok = 0;
                    break;
                }
                last = first + delta + 1;
            } else {
                last = first;
            }
        }
        if (h > bundle_end || count < 1 || count > PY_SSIZE_T_MAX) {
            ok = 0;
            break;
        }
        const unsigned char *messages = p + h;
        Py_ssize_t size = bundle_end - h;
        if (flags & CODEC_MASK) { /* snappy: decoded here, within what is left of the limit */
            int decoded = snappy_decode(p + h, size, budget, &set, &size);
            if (decoded < 0)
                goto failed;
            if (decoded > 0) {
                ok = 0;
                break;
            }
            messages = set;
            budget -= size;
        }
        ok = message_set_fault(messages, size, (Py_ssize_t)count, sparse, first, last) == NULL;
        PyMem_Free(set);
        set = NULL;
        if (!ok)
            break;
        records += count;
        span += sparse ? last - first + 1 : count;
        pos = bundle_end;
    }
    PyBuffer_Release(&buf);
    if (!ok)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)records, (unsigned long long)span);
failed:
    PyBuffer_Release(&buf);
    return NULL;
}

/* The fields of a bundle header that a produce needs, as format.parse_header reads them. */
typedef struct {
    unsigned char flags;
    uint64_t count, first, delta; /* delta: meaningful when has_delta */
    int has_delta;
    Py_ssize_t body;  /* where the message set starts */
    uint64_t first_ts; /* 0 when format.first_timestamp would take the time now */
} BundleHeader;

/* format._first_literal: where the bytes of the literal that the snappy block p[pos:end] starts with begin,
 * when that literal is at least 9 bytes long and they are there; -1 when not. */
static Py_ssize_t
first_literal(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end)
{
    uint64_t size, length;
    if (read_varint5(p, &pos, end, &size) < 0 || pos >= end || (p[pos] & 3))
        return -1;
    length = p[pos++] >> 2;
    if (length >= 60) { /* its length less one in the 1-4 bytes after the tag */
        Py_ssize_t extra = (Py_ssize_t)length - 59;
        length = 0;
        for (Py_ssize_t b = 0; b < extra && pos + b < end; b++)
            length |= (uint64_t)p[pos + b] << (8 * b);
        pos += extra;
    }
    return length + 1 >= 9 && pos + 9 <= end ? pos : -1;
}

/* Read the header of the bundle p[pos:end] into *h: 0, or -1 when it does not parse. */
static int
read_bundle_header(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, BundleHeader *h)
{
    if (pos >= end)
        return -1;
    unsigned char flags = p[pos++];
    if ((flags & CODEC_MASK) > 1)
        return -1;
    if (flags & EXTRA_FLAGS) {
        if (pos >= end)
            return -1;
        pos += 1 + ((p[pos] & RICH_PRODUCER_INFO) ? PRODUCER_INFO_SIZE : 0);
    }
    uint64_t count = (flags >> 2) & 0x0F, first = 0, delta = 0;
    int has_delta = 0;
    if (!count && (pos > end || read_varint5(p, &pos, end, &count) < 0))
        return -1;
    if (flags & SPARSE) {
        if (pos + 8 > end)
            return -1;
        for (int b = 7; b >= 0; b--)
            first = (first << 8) | p[pos + b];
        pos += 8;
        if (count != 1) {
            if (read_varint5(p, &pos, end, &delta) < 0)
                return -1;
            has_delta = 1;
        }
    }
    if (pos > end)
        return -1;
    uint64_t ts = 0;
    Py_ssize_t at = (flags & CODEC_MASK) ? first_literal(p, pos, end) : pos;
    if (at >= 0 && at + 9 <= end && !(p[at] & USE_LAST_TS))
        for (int b = 8; b >= 1; b--)
            ts = (ts << 8) | p[at + b];
    *h = (BundleHeader){flags, count, first, delta, has_delta, pos, ts};
    return 0;
}

/* The messages of the bundle p[0:end] (sequence numbers first..last, or from first on), each passed to ``each``
 * with its offset (sequence number less one): 0, or -1 (with no exception set) for a message set that is not
 * exactly its count of whole messages, numbers that do not fit, or a failure of ``each``. */
static int
walk_bundle_offsets(const unsigned char *p, Py_ssize_t end, const BundleHeader *h, uint64_t first, uint64_t last,
                    tank_message each, void *ctx)
{
    Py_ssize_t read, stop;
    if (first == 0 || (h->flags & SPARSE && last == 0) || h->count > PY_SSIZE_T_MAX)
        return -1;
    if (tank_walk(p, end, (Py_ssize_t)h->count, h->flags & SPARSE, first - 1, last - 1, each, ctx, &read, &stop) <
        0) {
        PyErr_Clear(); /* beyond 64 bits (the Python loop's), or a failed append, which the Python loop meets again */
        return -1;
    }
    return read == (Py_ssize_t)h->count && stop == end ? 0 : -1;
}

/* The messages of a stored payload p[0:end] (``varint len | bundle``...), each passed to ``each`` with its offset
 * (sequence number less one: the first bundle's numbered from ``seq`` unless SPARSE, each next one from where the
 * one before ended): 1 when every bundle holds exactly its count of whole messages; 0 at anything else, with no
 * exception set (a fault, an exception from ``inflate`` or ``each``, numbers past 64 bits); -1 with an exception
 * to pass on (an interrupt, a failed append to ``sets``). A snappy message set is ``inflate(view, limit left)``
 * (bytes; the limit, ``budget``, falls by what each inflates to), appended to ``sets`` unless it is NULL; with
 * ``inflate`` NULL, it is instead ``sets[*taken]`` (*taken then moves on): what an earlier walk of the same
 * payload inflated. */
static int
walk_payload(const unsigned char *p, Py_ssize_t end, uint64_t seq, Py_ssize_t budget, PyObject *inflate,
             PyObject *sets, Py_ssize_t *taken, tank_message each, void *ctx)
{
    Py_ssize_t pos = 0;
    while (pos < end) {
        uint64_t n;
        BundleHeader h;
        if (read_varint5(p, &pos, end, &n) < 0 || n > (uint64_t)(end - pos) ||
            read_bundle_header(p, pos, pos + (Py_ssize_t)n, &h) < 0)
            return 0;
        Py_ssize_t bundle_end = pos + (Py_ssize_t)n;
        uint64_t first = seq, last;
        if (h.flags & SPARSE) {
            first = h.first;
            last = h.has_delta ? h.first + h.delta + 1 : h.first;
            if (last < first)
                return 0;
        } else {
            last = seq + h.count - 1;
            if (h.count != 0 && last < seq)
                return 0;
        }
        const unsigned char *messages = p + h.body;
        Py_ssize_t size = bundle_end - h.body;
        PyObject *set = NULL;
        if (h.flags & CODEC_MASK) { /* snappy: inflated by the caller's function, within the budget */
            if (inflate == NULL) {
                if (*taken >= PyList_GET_SIZE(sets))
                    return 0;
                set = Py_NewRef(PyList_GET_ITEM(sets, (*taken)++));
            } else {
                set = inflated(inflate, messages, size, budget, -1);
                if (set == NULL)
                    return PyErr_Occurred() ? -1 : 0; /* an interrupt (not a fault of the bundle) is passed on */
                if (sets != NULL && PyList_Append(sets, set) < 0) {
                    Py_DECREF(set);
                    return -1;
                }
            }
            messages = (const unsigned char *)PyBytes_AS_STRING(set);
            size = PyBytes_GET_SIZE(set);
            budget -= size;
        }
        int whole = walk_bundle_offsets(messages, size, &h, first, last, each, ctx) == 0;
        Py_XDECREF(set);
        if (!whole)
            return 0;
        seq = last + 1;
        pos = bundle_end;
    }
    return 1;
}

static PyObject *
read_payload(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    unsigned long long seq;
    Py_ssize_t budget;
    PyObject *inflate;
    Lists lists;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*KnOO!O!O!O!", &buf, &seq, &budget, &inflate, &PyList_Type, &lists.seqs,
                          &PyList_Type, &lists.stamps, &PyList_Type, &lists.keys, &PyList_Type, &lists.values))
        return NULL;
    lists.stamp = NULL;
    int whole = walk_payload(buf.buf, buf.len, seq, budget, inflate, NULL, NULL, append_message, &lists);
    Py_XDECREF(lists.stamp);
    PyBuffer_Release(&buf);
    return whole < 0 ? NULL : PyBool_FromLong(whole);
}

/* kafka_records: the records of the payloads as Kafka's v2 records, what the first walk learns of them (every
 * offset delta within 64 bits) and, in the second, where the next one is written. */
typedef struct {
    int64_t base; /* the batch's base offset */
    int64_t count, last_delta, base_ts, max_ts;
    Py_ssize_t bound; /* the most the records can take */
    unsigned char *out;
} KafkaRecords;

#define KAFKA_RECORD_OVERHEAD 52 /* the most a record takes besides its key and value: 5 varints, 2 bytes */
#define TS_MAX ((uint64_t)INT64_MAX) /* TANK's timestamps are u64, Kafka's i64: above, read as INT64_MAX */

static int
measure_kafka_record(void *ctx, uint64_t offset, uint64_t ts, const unsigned char *key, Py_ssize_t key_len,
                     const unsigned char *value, Py_ssize_t value_len)
{
    KafkaRecords *r = ctx;
    int64_t d, t = ts > TS_MAX ? INT64_MAX : (int64_t)ts;
    (void)key;
    (void)value;
    if (offset > (uint64_t)INT64_MAX || __builtin_sub_overflow((int64_t)offset, r->base, &d) ||
        r->bound > PY_SSIZE_T_MAX - KAFKA_RECORD_OVERHEAD - key_len - value_len) {
        PyErr_SetString(PyExc_OverflowError, "an offset delta outside 64 bits"); /* the columns path's */
        return -1;
    }
    if (r->count == 0 || d > r->last_delta)
        r->last_delta = d;
    if (r->count == 0 || t < r->base_ts)
        r->base_ts = t;
    if (r->count == 0 || t > r->max_ts)
        r->max_ts = t;
    r->count++;
    r->bound += KAFKA_RECORD_OVERHEAD + key_len + value_len;
    return 0;
}

static int
put_kafka_record(void *ctx, uint64_t offset, uint64_t ts, const unsigned char *key, Py_ssize_t key_len,
                 const unsigned char *value, Py_ssize_t value_len)
{
    KafkaRecords *r = ctx;
    int64_t d = (int64_t)offset - r->base, t = (ts > TS_MAX ? INT64_MAX : (int64_t)ts) - r->base_ts;
    Py_ssize_t size = 1 + zigzag_size(t) + zigzag_size(d) + (key == NULL ? 1 : zigzag_size(key_len) + key_len) +
                      zigzag_size(value_len) + value_len + 1;
    unsigned char *out = put_zigzag(r->out, size);
    *out++ = 0; /* attributes */
    out = put_zigzag(out, t);
    out = put_zigzag(out, d);
    if (key == NULL) {
        *out++ = 1; /* zigzag(-1): no key */
    } else {
        out = put_zigzag(out, key_len);
        memcpy(out, key, (size_t)key_len);
        out += key_len;
    }
    out = put_zigzag(out, value_len);
    memcpy(out, value, (size_t)value_len);
    out += value_len;
    *out++ = 0; /* no headers */
    r->out = out;
    return 0;
}

static PyObject *
kafka_records(PyObject *self, PyObject *args)
{
    PyObject *payloads, *seqs, *base_obj, *inflate, *sets = NULL, *records = NULL, *result = NULL;
    Py_ssize_t limit, taken = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!nO", &PyList_Type, &payloads, &PyList_Type, &seqs, &PyLong_Type, &base_obj,
                          &limit, &inflate))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(payloads);
    long long base = PyLong_AsLongLong(base_obj);
    if (base == -1 && PyErr_Occurred()) { /* outside 64 bits: the columns path's */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    KafkaRecords r = {base, 0, 0, -1, -1, 0, NULL};
    if (PyList_GET_SIZE(seqs) != n)
        Py_RETURN_NONE;
    payloads = PyList_AsTuple(payloads); /* held as they are: ``inflate`` runs Python code between the items */
    seqs = payloads == NULL ? NULL : PyList_AsTuple(seqs);
    if (seqs == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* the types, and the numbers within 64 bits */
        PyObject *seq = PyTuple_GET_ITEM(seqs, i);
        if (!PyBytes_Check(PyTuple_GET_ITEM(payloads, i)) || !PyLong_Check(seq) ||
            (PyLong_AsUnsignedLongLong(seq) == (unsigned long long)-1 && PyErr_Occurred())) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    sets = PyList_New(0);
    if (sets == NULL)
        goto done;
    int pass, whole = 1;
    for (pass = 0; pass < 2 && whole == 1; pass++) {
        if (pass == 1) { /* the sizes known: the records written into one bytes object, cut to what they took */
            records = PyBytes_FromStringAndSize(NULL, r.bound);
            if (records == NULL)
                goto done;
            r.out = (unsigned char *)PyBytes_AS_STRING(records);
        }
        for (Py_ssize_t i = 0; i < n && whole == 1; i++) {
            PyObject *payload = PyTuple_GET_ITEM(payloads, i);
            whole = walk_payload((const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                                 PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(seqs, i)), limit,
                                 pass ? NULL : inflate, sets, &taken, pass ? put_kafka_record : measure_kafka_record,
                                 &r);
        }
    }
    if (whole < 0)
        goto done;
    if (whole == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (_PyBytes_Resize(&records, r.out - (unsigned char *)PyBytes_AS_STRING(records)) < 0)
        goto done;
    result = Py_BuildValue("(OLLLL)", records, (long long)r.count, (long long)r.last_delta, (long long)r.base_ts,
                           (long long)r.max_ts);
done:
    Py_XDECREF(records);
    Py_XDECREF(sets);
    Py_XDECREF(seqs);
    Py_XDECREF(payloads);
    return result;
}

/* The header of the bundle p[pos:end], as format.parse_header reads it, or None when it does not parse. */
static PyObject *
bundle_header(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end)
{
    BundleHeader h;
    if (read_bundle_header(p, pos, end, &h) < 0)
        Py_RETURN_NONE;
    if (h.has_delta)
        return Py_BuildValue("(BKKKnK)", h.flags, (unsigned long long)h.count, (unsigned long long)h.first,
                             (unsigned long long)h.delta, h.body, (unsigned long long)h.first_ts);
    return Py_BuildValue("(BKKinK)", h.flags, (unsigned long long)h.count, (unsigned long long)h.first, -1, h.body,
                         (unsigned long long)h.first_ts);
}

#define MAX_SPAN ((uint64_t)1 << 31)  /* handlers.MAX_SPAN */
#define MAX_SEQ ((uint64_t)1 << 63)   /* handlers.MAX_SEQ */

/* The head of a Produce request in p[:end]: its request id, its topics' count, and where they start
 * (*pos): 0, or -1 when cut short. */
static int
read_produce_head(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, uint32_t *request_id, unsigned *topics)
{
    if (end < 7 || 7 + p[6] + 6 > end)
        return -1;
    Py_ssize_t at = 7 + p[6]; /* after u16 client version | u32 request id | str8 client id */
    *request_id = (uint32_t)p[2] | (uint32_t)p[3] << 8 | (uint32_t)p[4] << 16 | (uint32_t)p[5] << 24;
    *topics = p[at + 5]; /* after u8 required acks | u32 ack timeout */
    *pos = at + 6;
    return 0;
}

/* One partition of a Produce request: ``u16 partition | varint length | (u64 base seqnum) | bundle``. */
typedef struct {
    unsigned partition;
    Py_ssize_t start, varint, body; /* where its varint length starts, that varint's size, where its bundle starts */
    uint64_t length, base_seq;
} ProducedPartition;

/* Read the partition at p[*pos:end] into *e and move *pos past it: 0, or -1 when cut short (*fault names a
 * bundle longer than what is left). */
static int
read_produced_partition(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, int with_seqnum,
                        ProducedPartition *e, const char **fault)
{
    if (*pos + 2 > end)
        return -1;
    e->partition = p[*pos] | p[*pos + 1] << 8;
    e->start = *pos + 2;
    Py_ssize_t at = e->start;
    if (read_varint5(p, &at, end, &e->length) < 0)
        return -1;
    e->varint = at - e->start;
    e->base_seq = 0;
    if (with_seqnum) {
        if (at + 8 > end)
            return -1;
        for (int b = 7; b >= 0; b--)
            e->base_seq = (e->base_seq << 8) | p[at + b];
        at += 8;
    }
    e->body = at;
    if (e->length > (uint64_t)(end - at)) {
        *fault = "bundle past the end of the request";
        return -1;
    }
    *pos = at + (Py_ssize_t)e->length;
    return 0;
}

/* What a partition stores: its varint length, then its bundle (a base sequence number taken out). */
static PyObject *
stored_of(const unsigned char *p, const ProducedPartition *e)
{
    PyObject *stored = PyBytes_FromStringAndSize(NULL, e->varint + (Py_ssize_t)e->length);
    if (stored != NULL) {
        memcpy(PyBytes_AS_STRING(stored), p + e->start, e->varint);
        memcpy(PyBytes_AS_STRING(stored) + e->varint, p + e->body, e->length);
    }
    return stored;
}

/* A topic name of a request: UTF-8, what does not decode kept as surrogates (handlers._text). */
static PyObject *
topic_name(const unsigned char *p, Py_ssize_t at, Py_ssize_t end)
{
    return PyUnicode_DecodeUTF8((const char *)p + at, end - at, "surrogateescape");
}

/* parse_plain_produce: see the module docstring. */
static PyObject *
parse_plain_produce(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int with_seqnum;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*p", &buf, &with_seqnum))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t end = buf.len, pos, name_end;
    PyObject *result = NULL;
    uint32_t request_id;
    unsigned topics;
    const char *fault = NULL;
    ProducedPartition e;
    BundleHeader h;
    if (read_produce_head(p, end, &pos, &request_id, &topics) < 0 || topics != 1 || pos >= end ||
        (name_end = pos + 1 + p[pos]) >= end || p[name_end] != 1) /* one topic, one partition */
        goto other;
    Py_ssize_t name_at = pos + 1;
    pos = name_end + 1;
    if (read_produced_partition(p, &pos, end, with_seqnum, &e, &fault) < 0 ||
        read_bundle_header(p, e.body, e.body + (Py_ssize_t)e.length, &h) < 0 || (h.flags & SPARSE) || h.count == 0 ||
        h.count > MAX_SPAN || e.base_seq >= MAX_SEQ - h.count || !h.first_ts)
        goto other;
    PyObject *topic = topic_name(p, name_at, name_end);
    if (topic == NULL)
        goto release;
    PyObject *stored = stored_of(p, &e);
    if (stored == NULL) {
        Py_DECREF(topic);
        goto release;
    }
    result = Py_BuildValue("(ININKKK)", request_id, topic, e.partition, stored, (unsigned long long)h.count,
                           (unsigned long long)h.first_ts, (unsigned long long)e.base_seq);
    goto release;
other:
    result = Py_NewRef(Py_None);
release:
    PyBuffer_Release(&buf);
    return result;
}

static PyObject *
parse_produce(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int with_seqnum;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*p", &buf, &with_seqnum))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t end = buf.len, pos;
    PyObject *topics = NULL, *result = NULL;
    const char *fault = "produce request cut short";
    uint32_t request_id;
    unsigned topics_count;
    if (read_produce_head(p, end, &pos, &request_id, &topics_count) < 0)
        goto done;
    topics = PyList_New(0);
    if (topics == NULL)
        goto done;
    for (unsigned t = 0; t < topics_count; t++) {
        if (pos >= end)
            goto done;
        Py_ssize_t name_end = pos + 1 + p[pos];
        if (name_end >= end)
            goto done;
        PyObject *parts = PyList_New(0);
        PyObject *name = parts ? topic_name(p, pos + 1, name_end) : NULL;
        PyObject *topic = name ? Py_BuildValue("(NN)", name, parts) : NULL;
        if (name == NULL)
            Py_XDECREF(parts);
        if (topic == NULL || append_new(topics, topic) < 0)
            goto error;
        unsigned parts_count = p[name_end];
        pos = name_end + 1;
        for (unsigned i = 0; i < parts_count; i++) {
            ProducedPartition e;
            if (read_produced_partition(p, &pos, end, with_seqnum, &e, &fault) < 0)
                goto done;
            PyObject *stored = stored_of(p, &e);
            if (stored == NULL)
                goto error;
            const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(stored);
            PyObject *header = bundle_header(s, e.varint, PyBytes_GET_SIZE(stored));
            PyObject *item = header ? Py_BuildValue("(INKN)", e.partition, stored, (unsigned long long)e.base_seq,
                                                    header)
                                    : NULL;
            if (item == NULL) {
                if (header == NULL)
                    Py_DECREF(stored);
                goto error;
            }
            if (append_new(parts, item) < 0)
                goto error;
        }
    }
    fault = NULL;
    result = Py_BuildValue("(IO)", request_id, topics);
    goto error; /* release */
done:
    if (fault)
        PyErr_SetString(PyExc_ValueError, fault);
error:
    Py_XDECREF(topics);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"parse_produce", parse_produce, METH_VARARGS, "The partitions and bundles of a TANK Produce request."},
    {"parse_plain_produce", parse_plain_produce, METH_VARARGS,
     "The one plain bundle of a TANK Produce request for one partition, or None."},
    {"validate_plain", validate_plain, METH_VARARGS,
     "(records, span) of a produced payload of plain bundles, all valid; else None."},
    {"check_messages", check_messages, METH_VARARGS, "Check that a produced message set holds what it declares."},
    {"read_messages", read_messages, METH_VARARGS, "Append the fields of TANK messages to column lists."},
    {"read_payload", read_payload, METH_VARARGS,
     "Append the messages of a stored payload's bundles to column lists: whether it read them all."},
    {"kafka_records", kafka_records, METH_VARARGS,
     "(records, count, last offset delta, base timestamp, max timestamp) of stored payloads as Kafka v2 records."},
    {"encode_messages", encode_messages, METH_VARARGS, "The messages part of an uncompressed TANK bundle."},
    {"encode_plain_bundle", encode_plain_bundle, METH_VARARGS,
     "``varint len | bundle``: one plain bundle of records at consecutive offsets, or None."},
    {NULL, NULL, 0, NULL},
};

SPEEDUPS_MODULE("The TANK message loops in C.", methods)
