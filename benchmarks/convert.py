"""Conversion rates between every pair of storage formats.

Builds N records (100-byte values, 8-byte keys, one header) stored the way
each protocol's clients write them (V1: one record per batch; Kafka, TANK,
Cursus: batches of ``--batch`` records), then converts every stored batch
into every other format exactly as the broker does on a cross-protocol read
(``gateway.convert.convert``: runs of foreign batches decoded to records and
re-encoded as one batch), without the cache. Prints
records/s per pair; the issue's goal is >= 500k records/s. A same-format
read (no conversion) is the reference row.

    python benchmarks/convert.py [--records N] [--batch B]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import progress, write_result  # noqa: E402

from gateway.convert import convert  # noqa: E402
from gateway.model import Record, StoredBatch  # noqa: E402
from gateway.registry import Registry  # noqa: E402

GOAL = 500_000


def stored_batches(fmt, records: list[Record], batch: int) -> list[StoredBatch]:
    out = []
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        base = chunk[0].offset
        out.append(StoredBatch(fmt.name, base, chunk[-1].offset, chunk[-1].timestamp, fmt.encode(chunk, base)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    formats = Registry.discover().batch_formats
    now = int(time.time() * 1000)
    records = [Record(os.urandom(50).hex().encode(), b"key%05d" % (i % 10000), now + i,
                      (("trace", b"t%d" % i),), offset=i) for i in range(args.records)]
    progress(f"{args.records:,} records, formats: {', '.join(sorted(formats))}")
    results = {}
    for src_name, src in sorted(formats.items()):
        per_batch = 1 if src_name == "v1" else args.batch
        stored = stored_batches(src, records, per_batch)
        for dst_name in sorted(formats):
            start = time.perf_counter()
            if src_name == dst_name:
                converted = sum(len(b.payload) for b in stored)  # a same-format read returns the bytes
            else:
                for start_at in range(0, len(stored), 64):  # as fetches of 64 stored batches read them
                    convert(stored[start_at : start_at + 64], dst_name, formats)
            rate = args.records / (time.perf_counter() - start)
            results[f"{src_name}->{dst_name}"] = round(rate)
            flag = "" if src_name == dst_name or rate >= GOAL else "  (below goal)"
            progress(f"{src_name:>7} -> {dst_name:<7} {rate:>14,.0f} records/s{flag}")
        del converted
    path = write_result("convert", {"records": args.records, "batch": args.batch, "goal": GOAL,
                                    "records_per_s": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
