"""The gateway's TANK listener through polygate's TANK client (``option("protocol", "tank")``).

The same three calls as ``kafka``: ``Topics`` on the driver, ``read_range``
and ``produce`` in Spark tasks. TANK sequence numbers are offsets + 1. TANK
records carry no headers (read as empty lists; rows with headers are
refused) and TANK has no offset lookup by time (timestamp bounds are
refused). Rows without a ``partition`` go where V1 and Cursus clients put
them: FNV-1a 32 of the key; rows without a key go to one partition per
Arrow batch, the next partition for the next batch.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from gateway.clients.tank import TankClient, TankError, chunk_bundles, now_ms
from gateway.codecs.tank import format as tank_format

from . import decode, encode
from .arrow import SourceError
from .options import TopicPartition

FETCH_SIZE = 8 << 20
BUNDLE = 1000  # messages per produced bundle
IN_FLIGHT = 5  # Produce requests awaiting their acknowledgement


def _client(bootstrap: str) -> TankClient:
    host, _, port = bootstrap.rpartition(":")
    return TankClient(host or "127.0.0.1", int(port))


def _discover(client: TankClient, topic: str) -> list[tuple[int, int]]:
    """``(first available, last assigned)`` sequence numbers of every partition of ``topic``."""
    try:
        return client.discover_partitions(topic)
    except TankError as e:
        raise SourceError(f"topic {topic!r}: {e}") from None


class Topics:
    """Driver-side metadata from DiscoverPartitions."""

    def __init__(self, bootstrap: str, extra: Mapping[str, str]):
        self.client = _client(bootstrap)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Topics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        return [(topic, p) for topic in topics for p in range(len(_discover(self.client, topic)))]

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        first, last = _discover(self.client, tp[0])[tp[1]]
        return min(max(first - 1, 0), last), last

    def offsets_for_times(self, times: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        if times:
            raise SourceError("TANK has no offset lookup by time: use protocol kafka for timestamp bounds")
        return {}


def read_range(bootstrap: str, extra: Mapping[str, str], topic: str, partition: int, start: int, end: int,
               schema: pa.Schema, poll_timeout_ms: int) -> Iterator[pa.RecordBatch]:
    """Records ``start <= offset < end`` of one partition as Arrow batches (see ``kafka.read_range``),
    each Consume answer's bundles decoded straight into Arrow (``decode``)."""
    if start >= end:
        return
    with _client(bootstrap) as client:
        position, last_progress, fetch_size = start, time.monotonic(), FETCH_SIZE
        builder = decode.builder()
        while position < end:
            try:
                chunk = client.consume_chunk(topic, partition, position + 1, max_wait_ms=200, min_bytes=1,
                                             fetch_size=fetch_size)
                bundles, need_bytes = chunk_bundles(chunk.data, chunk.first_seq)
                last_seq = position
                for b in bundles:
                    read, stop = builder.add_tank(b.messages, b.header.count, b.header.sparse, b.first_seq,
                                                  b.last_seq if b.header.sparse else 0, position, end)
                    if read < b.header.count or stop != len(b.messages):
                        raise TankError(0xFB, f"corrupt bundle at sequence number {b.first_seq}")
                    last_seq = max(last_seq, b.last_seq)
            except (TankError, ValueError, OverflowError) as e:
                raise SourceError(f"reading {topic}/{partition} at {position}: {e}") from None
            if (buffers := builder.take())[0]:
                yield decode.arrow_batch(buffers, schema, topic, partition)
            if last_seq > position:  # sequence numbers are offsets + 1: the next offset to read is last_seq
                position, last_progress = min(last_seq, end), time.monotonic()
            elif need_bytes:
                fetch_size = max(fetch_size * 2, need_bytes + 64)
            elif chunk.hwmark >= end:
                # nothing past ``position`` below a high watermark at or past ``end``: the rest of the
                # range is gaps (transaction markers, aborted records), which no reader is given
                position = end
            elif time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise SourceError(f"no record of {topic}/{partition} at {position} (reading up to {end}) "
                                  f"within {poll_timeout_ms} ms")


def produce(bootstrap: str, extra: Mapping[str, str], topic: str | None,
            batches: Iterable[pa.RecordBatch]) -> dict[TopicPartition, int]:
    """Produce every row (columns as ``encode.Columns.of`` takes them). A partition's rows go in
    uncompressed bundles of at most ``BUNDLE`` messages, encoded from the Arrow columns in C
    (``encode.tank_messages``), ``IN_FLIGHT`` Produce requests at a time; returns records acknowledged
    per partition."""
    written: dict[TopicPartition, int] = defaultdict(int)
    pending: deque[tuple[int, str, int, int]] = deque()  # request id, topic, partition, messages
    with _client(bootstrap) as client:

        def settle() -> None:
            request, name, part, count = pending.popleft()
            try:
                client.produce_ack(request)
            except TankError as e:
                raise SourceError(f"produce to {name}/{part}: {e}") from None
            written[name, part] += count

        counts: dict[str, int] = {}
        for number, batch in enumerate(batches):
            now = now_ms()
            for name, rows_of_topic in encode.by_topic(batch, topic) if batch.num_rows else ():
                columns = encode.Columns.of(rows_of_topic)
                if columns.headers is not None and (pc.max(pc.list_value_length(columns.headers)).as_py() or 0):
                    raise SourceError("TANK records have no headers: write them with protocol kafka")
                if name not in counts:
                    counts[name] = len(_discover(client, name))
                chosen = encode.row_partitions(columns, counts[name], number % counts[name], "fnv1a_32")
                for part, rows in encode.rows_by_partition(chosen):
                    total, at = len(columns) if rows is None else len(rows), 0
                    while at < total:
                        messages, count, at = encode.tank_messages(columns, rows, now, at, BUNDLE)
                        pending.append((client.send_bundle(name, part, tank_format.plain(messages, count)), name, part,
                                        count))
                        while len(pending) >= IN_FLIGHT:
                            settle()
        while pending:
            settle()
    return dict(written)
