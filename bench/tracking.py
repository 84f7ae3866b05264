"""The XOR tracker experiments: memory per root, memory per tracker, load
balance over trackers, and xor() throughput — the compact TrackingTable next
to the plain-dict NaiveTracker (Storm's acker as usually written).

(a) memory of one tracker for 100k .. 900k in-flight roots;
(b) memory per tracker for 500k roots over 1..8 trackers on the tracker ring;
(c) load balance of 100k, 200k, 300k roots over 6 trackers (and how it
    depends on the virtual positions);
(d) xor() throughput for batches of 1,000 roots with 3-level trees
    (fan-out 3: 13 tuples and 14 reports per root), reports pipelined the way
    stages deliver them, with 0 / 100k / 500k other roots in flight.

In-flight roots are registered and their root tuple processed (the children
still pending); a quarter as many short-lived roots are created and completed
meanwhile, so the tables also carry completions. Root ids come from a seeded
numpy generator. Prints Markdown tables and writes ``tracking.txt`` and
``tracking_*.png`` to ``--out`` (default ``~/.cache/gridstream-bench/out``,
outside the repository).

    .venv/bin/python bench/tracking.py [--quick] [--positions 64] [--seed 7]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plots import add_out_argument, out_dir, si
from gridstream.tracking import NaiveTracker, TrackerRing, TrackingTable
from gridstream.tracking.trees import Reports, complete_tree_stages, random_ids

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

MB = 1e6
FILL_BATCH = 10_000
TIMEOUT_S = 3600.0  # nothing expires during a run

Tracker = TrackingTable | NaiveTracker
Batch = list[Reports]  # the xor() calls of one fill step


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats get sensible precision."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fill_batches(rng: np.random.Generator, count: int) -> list[Batch]:
    """xor() calls that leave ``count`` roots in flight: per step, one call
    with the registration and root-tuple reports of FILL_BATCH roots and the
    registrations of short-lived roots (a quarter as many), and one call with
    the rest of the short-lived roots' reports, which completes them."""
    steps: list[Batch] = []
    for start in range(0, count, FILL_BATCH):
        n = min(FILL_BATCH, count - start)
        live = complete_tree_stages(rng, n, fanout=3, levels=2)
        short = complete_tree_stages(rng, n // 4, fanout=2, levels=2)
        steps.append([
            (np.concatenate([live[0][0], live[1][0], short[0][0]]),
             np.concatenate([live[0][1], live[1][1], short[0][1]])),
            (np.concatenate([short[1][0], short[2][0]]),
             np.concatenate([short[1][1], short[2][1]])),
        ])
    return steps


def apply(tracker: Tracker, calls: Batch) -> None:
    for roots, values in calls:
        tracker.xor(roots, values)


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


# -- (a) -----------------------------------------------------------------------


def grow(make: Callable[[], Tracker], batches: list[Batch], every: int,
         compact: bool) -> list[tuple[int, int, int, int]]:
    """Fills a tracker under tracemalloc; at every ``every`` steps records
    (in-flight roots, nbytes, traced bytes, traced peak since the last record)."""
    tracemalloc.start()
    base = traced()
    tracker = make()
    records = []
    for i, calls in enumerate(batches, start=1):
        apply(tracker, calls)
        if i % every == 0:
            if compact and isinstance(tracker, TrackingTable):
                tracker.compact()
            nbytes = tracker.nbytes if isinstance(tracker, TrackingTable) else 0
            records.append((len(tracker), nbytes, traced() - base,
                            tracemalloc.get_traced_memory()[1] - base))
            tracemalloc.reset_peak()
    tracemalloc.stop()
    return records


def memory_per_root(sizes: Sequence[int], seed: int) -> tuple[str, dict[str, list[float]]]:
    """One tracker grown step by step, measured at each size: as the table
    leaves itself, after an explicit compact(), and the naive tracker."""
    batches = fill_batches(np.random.default_rng(seed), sizes[-1])
    every = sizes[0] // FILL_BATCH
    def new_table() -> Tracker:
        return TrackingTable(TIMEOUT_S, now=0.0)
    def new_naive() -> Tracker:
        return NaiveTracker(TIMEOUT_S, now=0.0)
    as_filled = grow(new_table, batches, every, compact=False)
    compacted = grow(new_table, batches, every, compact=True)
    naive = grow(new_naive, batches, every, compact=False)
    rows: list[list[object]] = []
    series: dict[str, list[float]] = {"compact": [], "traced": [], "naive": []}
    for size, filled, packed, plain in zip(sizes, as_filled, compacted, naive, strict=True):
        assert size == filled[0] == packed[0] == plain[0]
        rows.append([size, filled[1] / size, filled[2] / size, filled[3] / MB,
                     packed[1] / size, packed[2] / size, plain[2] / MB, plain[2] / size,
                     plain[2] / filled[2]])
        series["compact"].append(packed[1] / MB)
        series["traced"].append(filled[2] / MB)
        series["naive"].append(plain[2] / MB)
    headers = ["in-flight roots", "as filled: nbytes B/root", "tracemalloc B/root",
               "peak since previous row MB", "after compact(): nbytes B/root", "tracemalloc B/root",
               "NaiveTracker tracemalloc MB", "B/root", "naive / compact"]
    return table(headers, rows), series


# -- (b) -----------------------------------------------------------------------


def per_tracker_memory(total: int, counts: Sequence[int], positions: int,
                       seed: int) -> tuple[str, list[tuple[float, float, float]]]:
    """``total`` roots over n trackers: each tracker's own table."""
    rng = np.random.default_rng(seed)
    stages = complete_tree_stages(rng, total, fanout=3, levels=2)
    roots = np.concatenate([stages[0][0], stages[1][0]])
    values = np.concatenate([stages[0][1], stages[1][1]])
    rows = []
    plot = []
    for n in counts:
        ring = TrackerRing([f"tracker-{k}" for k in range(1, n + 1)], positions)
        owner = ring.owner_index(roots)
        sizes, held = [], []
        for k in range(n):
            mine = owner == k
            tracker = TrackingTable(TIMEOUT_S, now=0.0)
            for part in np.array_split(np.flatnonzero(mine), max(1, int(mine.sum()) // 20_000)):
                tracker.xor(roots[part], values[part])
            tracker.compact()
            sizes.append(tracker.nbytes)
            held.append(len(tracker))
        biggest = int(np.argmax(held))
        mine = np.flatnonzero(owner == biggest)
        tracemalloc.start()
        base = traced()
        naive = NaiveTracker(TIMEOUT_S, now=0.0)
        naive.xor(roots[mine], values[mine])
        naive_bytes = traced() - base
        tracemalloc.stop()
        del naive
        mean_bytes = statistics.fmean(sizes)
        rows.append([n, statistics.fmean(held), max(held), mean_bytes / MB, max(sizes) / MB,
                     max(sizes) / max(held), naive_bytes / MB])
        plot.append((mean_bytes / MB, max(sizes) / MB, naive_bytes / MB))
    headers = ["trackers", "roots/tracker mean", "max", "TrackingTable MB mean", "max",
               "B/root", "NaiveTracker MB (largest tracker)"]
    return table(headers, rows), plot


# -- (c) -----------------------------------------------------------------------


def balance(totals: Sequence[int], trackers: int, positions: int,
            seed: int) -> tuple[str, str, dict[int, list[int]]]:
    """Per-tracker root counts, and how evenness depends on the positions."""
    rng = np.random.default_rng(seed)
    names = [f"tracker-{k}" for k in range(1, trackers + 1)]
    ring = TrackerRing(names, positions)
    rows = []
    counts_by_total: dict[int, list[int]] = {}
    for total in totals:
        counts = np.bincount(ring.owner_index(random_ids(rng, total)), minlength=trackers)
        counts_by_total[total] = counts.tolist()
        rows.append([total, *counts.tolist(), float(counts.max() / counts.mean()),
                     float(counts.std() / counts.mean())])
    main = table(["roots", *names, "max/mean", "CV"], rows)
    roots = random_ids(rng, totals[-1])
    sweep = []
    for v in (1, 4, 16, 64, 256):
        vring = TrackerRing(names, v)
        counts = np.bincount(vring.owner_index(roots), minlength=trackers)
        grown = vring.with_trackers([*names, "tracker-new"])
        moved = float(vring.moved_mask(grown, roots).mean())
        sweep.append([v, float(counts.max() / counts.mean()), float(counts.std() / counts.mean()),
                      moved, 1 / (trackers + 1)])
    by_positions = table(["virtual positions", "max/mean", "CV",
                          f"moved when a tracker joins ({totals[-1]:,} roots)", "ideal"], sweep)
    return main, by_positions, counts_by_total


# -- (d) -----------------------------------------------------------------------


def pipelined_calls(rng: np.random.Generator, batches: int, batch: int) -> list[Reports]:
    """One xor() call per step: stage k of batch s-k for every stage k."""
    stages = [complete_tree_stages(rng, batch, fanout=3, levels=3) for _ in range(batches)]
    depth = len(stages[0])
    calls = []
    for s in range(batches + depth - 1):
        parts = [stages[s - k][k] for k in range(depth) if 0 <= s - k < batches]
        calls.append((np.concatenate([p[0] for p in parts]),
                      np.concatenate([p[1] for p in parts])))
    return calls


def throughput(backgrounds: Sequence[int], batches: int, naive_batches: int,
               seed: int) -> tuple[str, dict[str, list[float]]]:
    """Roots per second through xor() with other roots in flight."""
    rng = np.random.default_rng(seed)
    batch = 1_000
    rows = []
    series: dict[str, list[float]] = {"compact": [], "naive": []}
    for background in backgrounds:
        held = fill_batches(rng, background) if background else []
        for name, make, count in (("TrackingTable", TrackingTable, batches),
                                  ("NaiveTracker", NaiveTracker, naive_batches)):
            calls = pipelined_calls(rng, count, batch)
            tracker: Tracker = make(TIMEOUT_S, now=0.0)
            for step in held:
                apply(tracker, step)
            completed = 0
            started = time.perf_counter()
            for roots, values in calls:
                completed += tracker.xor(roots, values).size
            elapsed = time.perf_counter() - started
            assert completed == count * batch and len(tracker) == background
            reports = sum(v.size for _, v in calls)
            rate = count * batch / elapsed
            rows.append([name, background, count * batch, rate, reports / elapsed,
                         elapsed / len(calls) * 1e3])
            series["compact" if make is TrackingTable else "naive"].append(rate)
    headers = ["tracker", "other roots in flight", "roots", "roots/s", "reports/s",
               "ms per xor() call"]
    return table(headers, rows), series


# -- plots -----------------------------------------------------------------------


def plot(path: Path, draw: Callable[[Axes], None]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw(ax)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    parser.add_argument("--positions", type=int, default=64, help="virtual positions per tracker")
    parser.add_argument("--seed", type=int, default=7)
    add_out_argument(parser)
    args = parser.parse_args()
    out_path = out_dir(args.out)
    scale = 10 if args.quick else 1
    sizes = [k * 100_000 // scale for k in range(1, 10)]
    started = time.perf_counter()
    out = [f"# XOR tracking: TrackingTable vs NaiveTracker\n\nPython {platform.python_version()}"
           f", numpy {np.__version__}, {args.positions} virtual positions per tracker, "
           f"seed {args.seed}{', --quick' if args.quick else ''}."]

    text, memory = memory_per_root(sizes, args.seed)
    out.append(f"## (a) Memory of one tracker\n\n{text}")
    print(out[0] + "\n\n" + out[-1] + "\n", flush=True)

    text, per_tracker = per_tracker_memory(500_000 // scale, range(1, 9), args.positions,
                                           args.seed + 1)
    out.append(f"## (b) Memory per tracker, {500_000 // scale:,} roots\n\n{text}")
    print(out[-1] + "\n", flush=True)

    totals = [k * 100_000 // scale for k in (1, 2, 3)]
    text, sweep, counts = balance(totals, 6, args.positions, args.seed + 2)
    out.append(f"## (c) Load balance over 6 trackers\n\n{text}\n\n"
               f"By virtual positions, {totals[-1]:,} roots:\n\n{sweep}")
    print(out[-1] + "\n", flush=True)

    backgrounds = [0, 20_000, 50_000] if args.quick else [0, 100_000, 500_000]
    text, rates = throughput(backgrounds, 30 if args.quick else 300, 10 if args.quick else 60,
                             args.seed + 3)
    out.append("## (d) xor() throughput, batches of 1,000 roots, 3-level trees (fan-out 3)\n\n"
               + text)
    print(out[-1] + "\n", flush=True)

    (out_path / "tracking.txt").write_text("\n\n".join(out) + "\n")

    def draw_memory(ax: Axes) -> None:
        roots = [s / 1e3 for s in sizes]
        ax.plot(roots, memory["naive"], "o-", label="NaiveTracker (tracemalloc)")
        ax.plot(roots, memory["traced"], "s-", label="TrackingTable as filled (tracemalloc)")
        ax.plot(roots, memory["compact"], "^--", label="TrackingTable compacted (nbytes)")
        ax.set(xlabel="in-flight roots (thousands)", ylabel="MB",
               title="(a) memory of one tracker")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        for key in ("naive", "compact"):  # the largest size's figures, at the line ends
            ax.annotate(f"{memory[key][-1]:,.1f} MB", (roots[-1], memory[key][-1]),
                        xytext=(-4, 4), textcoords="offset points", ha="right", fontsize=8)
        ax.legend()

    def draw_trackers(ax: Axes) -> None:
        n = list(range(1, 9))
        ax.plot(n, [p[2] for p in per_tracker], "o-", label="NaiveTracker, largest tracker")
        ax.plot(n, [p[1] for p in per_tracker], "s-", label="TrackingTable, max")
        ax.plot(n, [p[0] for p in per_tracker], "^--", label="TrackingTable, mean")
        ax.set(xlabel="trackers", ylabel="MB per tracker",
               title=f"(b) memory per tracker, {500_000 // scale:,} roots")
        ax.set_ylim(bottom=0)
        for index in (2, 1):  # NaiveTracker and TrackingTable max
            for trackers in (1, 8):
                value = per_tracker[trackers - 1][index]
                ax.annotate(f"{value:,.1f}", (trackers, value), xytext=(0, 4),
                            textcoords="offset points", ha="center", fontsize=8)
        ax.legend()

    def draw_balance(ax: Axes) -> None:
        width = 0.8 / len(counts)
        for i, (total, per) in enumerate(counts.items()):
            drawn = ax.bar([k + i * width for k in range(len(per))],
                           [c / total * 100 for c in per], width, label=f"{total:,} roots")
            ax.bar_label(drawn, fmt="%.0f", fontsize=7, padding=1)
        ax.axhline(100 / 6, color="black", lw=1, ls="--", label="even")
        ax.set(xlabel="tracker", ylabel="% of roots", title="(c) load over 6 trackers")
        ax.set_xticks([k + width for k in range(6)], [str(k + 1) for k in range(6)])
        ax.legend()

    def draw_throughput(ax: Axes) -> None:
        x = np.arange(len(backgrounds))
        for offset, key, label in ((-0.2, "compact", "TrackingTable"),
                                   (0.2, "naive", "NaiveTracker")):
            drawn = ax.bar(x + offset, rates[key], 0.4, label=label)
            ax.bar_label(drawn, labels=[si(v) for v in rates[key]], fontsize=8, padding=2)
        ax.set_xticks(x, [f"{b:,}" for b in backgrounds])
        ax.set(xlabel="other roots in flight", ylabel="roots/s",
               title="(d) xor() throughput, 1,000 roots per batch")
        ax.legend()

    for name, draw in (("memory", draw_memory), ("trackers", draw_trackers),
                       ("balance", draw_balance), ("throughput", draw_throughput)):
        plot(out_path / f"tracking_{name}.png", draw)
    print(f"wrote {out_path}/tracking.txt and tracking_*.png in "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
