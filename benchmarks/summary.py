"""One plot of every benchmark's polygate-against-reference figures: ``results/summary.png``.

Reads each ``results/*.json`` and its ``comparisons`` (written by the benchmarks through
``common.comparison``): for each entry, the polygate/reference ratio of records/s (left) and,
where the benchmark could meter them, the server process's CPU µs per record of polygate
beside its reference's (right). Files or entries without those figures are skipped, with a
printed note; a reference with no server process to meter is marked ``n/a``.

    python benchmarks/summary.py
"""

from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import RESULTS, plot_path, progress  # noqa: E402

NEEDED = ("label", "reference", "ratio_records_s")
POLYGATE_CPU, REFERENCE_CPU = "polygate_server_cpu_us_per_record", "reference_server_cpu_us_per_record"


def entries() -> list[tuple[str, dict]]:
    """(benchmark, comparison) for every usable comparison of every result file, in file name order."""
    found = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.json"))):
        name = os.path.basename(path).removesuffix(".json")
        try:
            with open(path) as f:
                comparisons = json.load(f).get("comparisons")
        except (OSError, ValueError, AttributeError) as e:
            progress(f"skipped {name}: unreadable ({e})")
            continue
        if not comparisons:
            progress(f"skipped {name}: no polygate/reference comparisons in it")
            continue
        for entry in comparisons:
            missing = [k for k in NEEDED if entry.get(k) is None]
            if missing:
                progress(f"skipped an entry of {name} ({entry.get('label', '?')}): no {', '.join(missing)}")
            else:
                found.append((name, entry))
    return found


def plot(found: list[tuple[str, dict]], path: str) -> None:
    import matplotlib.pyplot as plt

    rows = range(len(found))
    labels = [f"{name}: {e['label']}\nvs {e['reference']}" for name, e in found]
    benchmarks = list(dict.fromkeys(name for name, _ in found))
    colours = [plt.get_cmap("tab10")(benchmarks.index(name) % 10) for name, _ in found]
    fig, (speed, cpu) = plt.subplots(1, 2, sharey=True, figsize=(15, 0.42 * len(found) + 1.8))

    speed.barh(rows, [e["ratio_records_s"] for _, e in found], color=colours)
    speed.axvline(1.0, color="grey", linewidth=0.8)
    speed.set_xscale("log")
    speed.margins(x=0.12)  # room for the labels beside the bars
    speed.set_xlabel("records/s, polygate / reference (log; > 1: polygate faster)")
    speed.set_yticks(rows, labels, fontsize=7)
    speed.invert_yaxis()
    for row, (_, e) in zip(rows, found, strict=True):
        speed.annotate(f"x{e['ratio_records_s']:.2f}", (e["ratio_records_s"], row), xytext=(3, 0),
                       textcoords="offset points", va="center", fontsize=7)

    height = 0.4
    for offset, key, colour, legend in ((-height / 2, POLYGATE_CPU, "#4c72b0", "polygate"),
                                        (height / 2, REFERENCE_CPU, "#dd8452", "reference")):
        shown = [(row + offset, e[key]) for row, (_, e) in zip(rows, found, strict=True) if e.get(key)]
        if shown:
            cpu.barh(*zip(*shown, strict=True), height=height, color=colour, label=legend)
    low = min([e[k] for _, e in found for k in (POLYGATE_CPU, REFERENCE_CPU) if e.get(k)], default=1.0)
    for row, (_, e) in zip(rows, found, strict=True):
        for offset, key in ((-height / 2, POLYGATE_CPU), (height / 2, REFERENCE_CPU)):
            if not e.get(key):  # no server process to meter, or under /proc's 10 ms tick
                cpu.annotate("n/a" if e.get(key) is None else "< tick", (low, row + offset), fontsize=6,
                             va="center", color="grey")
    cpu.set_xscale("log")
    cpu.set_xlabel("server CPU µs per record (user + system, log)")
    cpu.legend(loc="lower right", fontsize=8)
    fig.suptitle("polygate against each benchmark's reference, same run (2-core machine: CPU per record "
                 "is the steadier figure)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    found = entries()
    if not found:
        progress(f"no comparisons in {RESULTS}/*.json: no summary plot")
        return
    path = plot_path("summary")
    if path is not None:
        plot(found, path)
        progress(f"plot of {len(found)} comparisons: {path}")


if __name__ == "__main__":
    main()
