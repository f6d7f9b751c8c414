/* The walk over a TANK message set, shared by the codec's C loops (``_speedups.c``) and the Spark
 * source's Arrow loop (``gateway/spark/_arrow.c``), so that both read messages exactly as
 * ``format._read_messages`` does.
 */
#ifndef POLYGATE_TANK_MESSAGES_H
#define POLYGATE_TANK_MESSAGES_H

#include "_speedups.h"
#include <string.h>

#define HAVE_KEY 0x01
#define USE_LAST_TS 0x02
#define SEQ_PREV_PLUS_ONE 0x04
#define SPARSE 0x40 /* a bundle flag: its messages' sequence numbers are in the bundle */

/* The varint (at most 5 bytes, as TANK writes them) at p[*pos]; -1 if cut short or longer. */
static inline int
read_varint5(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 5 && *pos < end; i++) {
        unsigned char b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Called for each message: its sequence number, timestamp (ms), key (NULL: none) and value; -1 with an
 * exception set stops the walk. */
typedef int (*tank_message)(void *ctx, uint64_t seq, uint64_t ts, const unsigned char *key, Py_ssize_t key_len,
                            const unsigned char *value, Py_ssize_t value_len);

/* Walk up to ``count`` messages of the message set p[0:end] (a SPARSE bundle's messages numbered from
 * ``first`` to ``last``, else from ``first`` on), stopping at the first message cut short or undecodable.
 * Sets *read to how many it read and *stop to the position after the last (after the set when all were
 * read, else where the first unread one starts). -1 with OverflowError for sequence numbers beyond 64
 * bits (the Python loop takes them), or when ``each`` fails. */
static inline int
tank_walk(const unsigned char *p, Py_ssize_t end, Py_ssize_t count, int sparse, uint64_t first, uint64_t last,
          tank_message each, void *ctx, Py_ssize_t *read, Py_ssize_t *stop)
{
    Py_ssize_t pos = 0, at = 0, i = 0;
    uint64_t ts = 0, seq = first, gap, vlen;
    for (; i < count; i++) {
        at = pos;
        if (pos >= end)
            break;
        unsigned char flags = p[pos++];
        if (!sparse) {
            if ((uint64_t)i > UINT64_MAX - first) {
                PyErr_SetString(PyExc_OverflowError, "sequence number beyond 64 bits");
                return -1;
            }
            seq = first + (uint64_t)i;
        } else if (i) {
            if (flags & SEQ_PREV_PLUS_ONE) {
                gap = 0;
            } else if (i == count - 1) {
                seq = last;
                goto seq_known;
            } else if (read_varint5(p, &pos, end, &gap) < 0) {
                break;
            }
            if (seq >= UINT64_MAX - gap) {
                PyErr_SetString(PyExc_OverflowError, "sequence number beyond 64 bits");
                return -1;
            }
            seq += gap + 1;
        }
    seq_known:
        if (!(flags & USE_LAST_TS)) {
            if (end - pos < 8)
                break;
            ts = 0;
            for (int b = 7; b >= 0; b--)
                ts = (ts << 8) | p[pos + b];
            pos += 8;
        }
        Py_ssize_t key_at = -1, klen = 0;
        if (flags & HAVE_KEY) {
            if (pos >= end || p[pos] > end - pos - 1)
                break;
            klen = p[pos];
            key_at = pos + 1;
            pos += 1 + klen;
        }
        if (read_varint5(p, &pos, end, &vlen) < 0 || vlen > (uint64_t)(end - pos))
            break;
        if (each(ctx, seq, ts, key_at < 0 ? NULL : p + key_at, klen, p + pos, (Py_ssize_t)vlen) < 0)
            return -1;
        pos += (Py_ssize_t)vlen;
    }
    *read = i;
    *stop = i == count ? pos : at;
    return 0;
}

/* The size of a message as tank_put writes it: ``gap`` sequence numbers skipped since the previous one
 * (SPARSE bundles), ``same_ts`` when it has the previous message's timestamp, a key of key_len bytes
 * (0: none; cut to 255) and a value of value_len bytes. */
static inline Py_ssize_t
tank_size(uint64_t gap, int same_ts, Py_ssize_t key_len, Py_ssize_t value_len)
{
    return 1 + (gap ? uvarint_size(gap) : 0) + (same_ts ? 0 : 8) + (key_len ? 1 + (key_len > 255 ? 255 : key_len) : 0) +
           uvarint_size((uint64_t)value_len) + value_len;
}

/* Write a message at out (see tank_size; ``seq_flags`` SEQ_PREV_PLUS_ONE or 0); returns the byte after it. */
static inline unsigned char *
tank_put(unsigned char *out, unsigned char seq_flags, uint64_t gap, int same_ts, uint64_t ts, const char *key,
         Py_ssize_t key_len, const char *value, Py_ssize_t value_len)
{
    *out++ = seq_flags | (key_len ? HAVE_KEY : 0) | (same_ts ? USE_LAST_TS : 0);
    if (gap)
        out = put_uvarint(out, gap);
    if (!same_ts)
        for (int b = 0; b < 8; b++)
            *out++ = (unsigned char)(ts >> (8 * b));
    if (key_len) {
        if (key_len > 255)
            key_len = 255;
        *out++ = (unsigned char)key_len;
        memcpy(out, key, (size_t)key_len);
        out += key_len;
    }
    out = put_uvarint(out, (uint64_t)value_len);
    if (value_len)
        memcpy(out, value, (size_t)value_len);
    return out + value_len;
}

#endif
