"""The gateway's TANK listener through polygate's TANK client (``option("protocol", "tank")``).

The same three calls as ``kafka``: ``Topics`` on the driver, ``read_range``
and ``produce`` in Spark tasks. TANK sequence numbers are offsets + 1. TANK
records carry no headers (read as empty lists; rows with headers are
refused) and TANK has no offset lookup by time (timestamp bounds are
refused). Rows without a ``partition`` go where V1 and Cursus clients put
them: FNV-1a 32 of the key, round robin without one.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa

from gateway.clients.tank import TankClient, TankError, chunk_bundles
from gateway.partitioners import choose

from . import decode
from .arrow import SourceError, rows
from .options import TopicPartition

FETCH_SIZE = 8 << 20
BUNDLE = 1000  # messages per produced bundle


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


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def produce(bootstrap: str, extra: Mapping[str, str], topic: str | None,
            batches: Iterable[pa.RecordBatch]) -> dict[TopicPartition, int]:
    """Produce every row (see ``arrow.rows``), one acknowledged bundle per partition and batch."""
    written: dict[TopicPartition, int] = defaultdict(int)
    with _client(bootstrap) as client:
        counts: dict[str, int] = {}
        for batch in batches:
            todo = rows(batch, topic)
            if todo.headers is not None and any(todo.headers):
                raise SourceError("TANK records have no headers: write them with protocol kafka")
            bundles: dict[TopicPartition, list[tuple[bytes | None, bytes]]] = defaultdict(list)
            for i in range(len(todo)):
                name, key = todo.topics[i], _bytes(todo.keys[i])
                if name not in counts:
                    counts[name] = len(_discover(client, name))
                part = todo.partitions[i] if todo.partitions is not None else None
                if part is None:
                    part = choose("fnv1a_32", key, counts[name], sum(written.values()) + i)
                bundles[name, part].append((key, _bytes(todo.values[i])))
            for (name, part), messages in bundles.items():
                for at in range(0, len(messages), BUNDLE):
                    try:
                        client.produce_messages(name, part, messages[at:at + BUNDLE])
                    except TankError as e:
                        raise SourceError(f"produce to {name}/{part}: {e}") from None
                written[name, part] += len(messages)
    return dict(written)
