"""Conversion rates between every pair of storage formats.

Builds N records (100-byte values, 8-byte keys, one header) stored the way
each protocol's clients write them (V1: one record per batch, as a client
that waits for each answer writes them; Kafka, TANK, Cursus: batches of
``--batch`` records), then converts every stored batch
into every other format exactly as the broker does on a cross-protocol read
(``gateway.convert.convert``: runs of foreign batches decoded and re-encoded
as one batch, through ``Columns`` where both formats have the column
methods), without the cache. Prints records/s per pair, by the wall clock
and by the process's CPU time (the machine may be busy with other work); the
issue's goal is >= 500k records/s. A same-format read (no conversion) is the
reference row; with ``--reference`` every pair is also converted through
``Record``s (the path of formats without column methods, and the broker's
only path before them) in the same run, and the ratio printed.

    python benchmarks/convert.py [--records N] [--batch B] [--reference] [--pairs v1-kafka,kafka-tank]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import plot_path, progress, write_result  # noqa: E402

from gateway.convert import convert  # noqa: E402
from gateway.model import Record, StoredBatch  # noqa: E402
from gateway.registry import Registry  # noqa: E402

GOAL = 500_000


class RecordsOnly:
    """A format seen without its column methods: conversion goes through ``Record``s."""

    def __init__(self, fmt):
        self.name = fmt.name
        self.records = fmt.records
        self.encode = fmt.encode
        self.assign_offsets = fmt.assign_offsets


def rate(stored: list[StoredBatch], target: str, formats: dict, records: int) -> tuple[float, float]:
    """Records/s (wall clock, CPU time) converting ``stored`` to ``target`` as fetches of 64 batches do
    (after one warm-up fetch, from a collected heap)."""
    convert(stored[:64], target, formats)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    for start_at in range(0, len(stored), 64):
        convert(stored[start_at : start_at + 64], target, formats)
    return records / (time.perf_counter() - wall), records / max(time.process_time() - cpu, 1e-9)


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
    parser.add_argument("--reference", action="store_true", help="also convert through Records, same run")
    parser.add_argument("--pairs", default="", help="only these pairs, e.g. v1-kafka,kafka-tank")
    args = parser.parse_args()
    formats = Registry.discover().batch_formats
    plain = {name: RecordsOnly(f) for name, f in formats.items()}
    pairs = {tuple(p.split("-")) for p in args.pairs.split(",") if p}
    now = int(time.time() * 1000)
    records = [Record(os.urandom(50).hex().encode(), b"key%05d" % (i % 10000), now + i,
                      (("trace", b"t%d" % i),), offset=i) for i in range(args.records)]
    progress(f"{args.records:,} records, formats: {', '.join(sorted(formats))}")
    gc.collect()
    gc.freeze()  # the input records are set-up, not heap a server converting stored bytes would scan
    results = {}
    for src_name, src in sorted(formats.items()):
        if pairs and not any(src_name == p[0] for p in pairs):
            continue
        per_batch = 1 if src_name == "v1" else args.batch
        stored = stored_batches(src, records, per_batch)
        gc.freeze()  # set-up too: a server reads a fetch's batches from disk, it does not hold a million
        for dst_name in sorted(formats):
            if pairs and (src_name, dst_name) not in pairs:
                continue
            pair = f"{src_name}->{dst_name}"
            if src_name == dst_name:
                start = time.perf_counter()
                sum(len(b.payload) for b in stored)  # a same-format read returns the bytes
                results[pair] = {"wall": round(args.records / (time.perf_counter() - start))}
                progress(f"{src_name:>7} -> {dst_name:<7} {results[pair]['wall']:>14,} records/s (no conversion)")
                continue
            wall, cpu = rate(stored, dst_name, formats, args.records)
            results[pair] = {"wall": round(wall), "cpu": round(cpu)}
            line = f"{src_name:>7} -> {dst_name:<7} {wall:>10,.0f} records/s, {cpu:>10,.0f} by CPU time"
            if args.reference:
                ref_wall, ref_cpu = rate(stored, dst_name, plain, args.records)
                results[pair].update(records_wall=round(ref_wall), records_cpu=round(ref_cpu))
                line += f"; through Records {ref_cpu:>9,.0f} by CPU time (x{cpu / ref_cpu:.1f})"
            progress(line + ("" if cpu >= GOAL else "  (below goal)"))
    path = write_result("convert", {"records": args.records, "batch": args.batch, "goal": GOAL,
                                    "records_per_s": results})
    print(f"wrote {path}")
    png = plot_path("convert")
    if png:
        plot(results, args.records, png)
        print(f"wrote {png}")


def plot(results: dict, records: int, path: str) -> None:
    """A heatmap of the rates: one row per source format, one column per reader's format."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    names = sorted({name for pair in results for name in pair.split("->")})
    rates = [[results.get(f"{src}->{dst}", {}) for dst in names] for src in names]
    shown = [[(r.get("cpu") or r.get("wall") or 0) / 1e6 if src != dst else float("nan")
              for r, dst in zip(row, names)] for row, src in zip(rates, names)]
    fig, ax = plt.subplots(figsize=(1.3 * len(names) + 2, 1.0 * len(names) + 1.5))
    top = max([2 * GOAL / 1e6] + [v for row in shown for v in row if v == v])
    image = ax.imshow(shown, cmap="RdYlGn", norm=TwoSlopeNorm(GOAL / 1e6, 0, top))  # red below the goal
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("read by (target format)")
    ax.set_ylabel("written by (stored format)")
    for i, row in enumerate(shown):
        for j, value in enumerate(row):
            ax.text(j, i, "stored\nbytes" if i == j else f"{value:.2f}M" + ("\nbelow goal" if value * 1e6 < GOAL
                    else ""), ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="million records/s (CPU time)")
    ax.set_title(f"Conversion rates, {records:,} records of 100 bytes (goal {GOAL / 1e6:.1f}M/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
