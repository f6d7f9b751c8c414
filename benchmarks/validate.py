"""What checking a produced batch costs: ``BatchFormat.validate`` per batch of N records.

The broker validates every produced payload before storing it (issue 13): a
declared record count or offset delta must match the records present, and a
compressed batch is decompressed once, under its limit, to check it. This
times ``validate`` on batches of ``--records`` records (100-byte values,
8-byte keys) for every format, uncompressed (the common case) and, for Kafka
and TANK, compressed, by the process's CPU time (the machine may be busy),
next to a full decode of the same batch (``columns``, what a conversion
does) for scale. Cursus is timed both as the broker meets it (the codec has
just walked the batch and ``remember``ed it) and walked again.

    python benchmarks/validate.py [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import progress, write_result  # noqa: E402

from gateway.codecs.cursus import format as cursus  # noqa: E402
from gateway.codecs.kafka import compression  # noqa: E402
from gateway.codecs.kafka import format as kafka_format  # noqa: E402
from gateway.codecs.tank import format as tank_format  # noqa: E402
from gateway.codecs.v1 import format as v1  # noqa: E402
from gateway.model import Record, StoredBatch  # noqa: E402


def cpu_us(call, rounds: int) -> float:
    """CPU microseconds per ``call()`` (after one warm-up call)."""
    call()
    start = time.process_time()
    for _ in range(rounds):
        call()
    return (time.process_time() - start) / rounds * 1e6


def cases(n: int) -> list[tuple[str, object, bytes]]:
    """``(name, format, payload)`` of each timed batch."""
    recs = [Record(b"%0100d" % i, b"%08d" % i, 1_700_000_000_000 + i) for i in range(n)]
    messages = [(r.timestamp, r.key, r.value) for r in recs]
    out = [(f"kafka {compression.NAMES[codec]}", kafka_format.FORMAT, kafka_format.encode_batch(recs, 0, codec))
           for codec in compression.NAMES]
    out += [("tank none", tank_format.FORMAT, tank_format.frame(tank_format.encode(messages, compress=False))),
            ("tank snappy", tank_format.FORMAT, tank_format.frame(tank_format.encode(messages, compress=True))),
            ("cursus walked", cursus.FORMAT, cursus.FORMAT.encode(recs, 0)),
            ("v1 joined", v1.FORMAT, v1.FORMAT.encode(recs, 0))]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    rows = {}
    for name, fmt, payload in cases(args.records):
        validate = cpu_us(lambda: fmt.validate(payload), args.rounds)  # noqa: B023 - called at once
        stored = [StoredBatch(fmt.name, 0, args.records - 1, 0, payload)]
        decode = cpu_us(lambda: fmt.columns(stored), max(args.rounds // 10, 1))  # noqa: B023
        rows[name] = {"validate_us": round(validate, 1), "decode_us": round(decode, 1), "bytes": len(payload)}
        progress(f"{name:14} {len(payload):>7} bytes  validate {validate:8.1f} us  (full decode {decode:8.1f} us)")
    payload = cursus.FORMAT.encode([Record(b"%0100d" % i, b"%08d" % i) for i in range(args.records)], 0)
    header = cursus.parse_header(payload)
    cursus.FORMAT.remember(payload, cursus.walk(payload, header.size, header.count))
    remembered = cpu_us(lambda: cursus.FORMAT.validate(payload), args.rounds)
    rows["cursus remembered"] = {"validate_us": round(remembered, 1), "bytes": len(payload)}
    progress(f"{'cursus remembered':14} {len(payload):>7} bytes  validate {remembered:8.1f} us")
    print("results:", write_result("validate", {"records": args.records, "rows": rows}))


if __name__ == "__main__":
    main()
