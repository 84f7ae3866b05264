"""End-to-end throughput of the local cluster, exactly-once on and off, next to
a single-process run of the same computation.

Runs wordcount (900,000 words) and taxi (1,000,000 records) on one local
cluster (1 scheduler, 3 workers, 2 state servers, all on this machine),
alternating delivery modes within each round so the ratio is measured under
the same conditions: ``exactly_once`` (replicated JobContainers, dedupe) and
``at_most_once`` (no replication). Prints medians of ``--runs`` rounds and
writes ``throughput.txt``, ``throughput.json`` and ``throughput.png`` to
``--out`` (default ``~/.cache/gridstream-bench/out``, outside the repository).
The plot shows the cluster's bars with their values; the single-process
ceiling and the target are reference lines (or named at the top when they
would flatten the bars). ``--replot`` draws the plot again from a JSON file.

    .venv/bin/python bench/throughput.py [--runs 3] [--taxi 1000000] [--words 900000]
                                         [--out DIR] [--replot DIR/throughput.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plots import add_out_argument, bars, out_dir, pyplot
from gridstream.builtins import count, split_words
from gridstream.config import Config
from gridstream.demo import run_on
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

MODES = ("exactly_once", "at_most_once")
TARGETS = {"wordcount": 600_000, "taxi": 170_000}


def single_process(name: str, size: int) -> float:
    """Units per second of the same computation — the job's own operator
    functions, record by record — in one plain Python process."""
    if name == "taxi":
        data = list(taxi.generate(size))
        started = time.perf_counter()
        tracks: dict[str, str] = {}
        for text in data:
            position = taxi.parse_position(text)
            device = taxi.device_of(position)
            tracks[device] = taxi.append_position(tracks.get(device, ""), position)
    else:
        lines = wordcount.generate(size)
        started = time.perf_counter()
        counts: dict[str, int] = {}
        for line in lines:
            for word in split_words(line):
                counts[word] = count(counts.get(word, 0), word)
    return size / (time.perf_counter() - started)


async def cluster_runs(sizes: dict[str, int], runs: int) -> dict[tuple[str, str], list[float]]:
    rates: dict[tuple[str, str], list[float]] = {(n, m): [] for n in sizes for m in MODES}
    with tempfile.TemporaryDirectory(prefix="gridstream-bench-") as run_dir:
        async with LocalCluster(run_dir, Config(), workers=3, state_servers=2) as cluster:
            for i in range(runs):
                for name, size in sizes.items():
                    for mode in MODES:
                        report = await run_on(cluster.scheduler_address, name, size,
                                              delivery=mode)
                        if not report.match:
                            raise SystemExit(f"{name}/{mode} did not match: {report.summary()}")
                        rates[(name, mode)].append(report.rate)
                        print(f"  round {i + 1} {mode:<13} {report.summary()}", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--taxi", type=int, default=1_000_000, help="taxi records")
    parser.add_argument("--words", type=int, default=900_000, help="wordcount words")
    parser.add_argument("--replot", type=Path, default=None,
                        help="draw the plot again from a throughput.json; run nothing")
    add_out_argument(parser)
    args = parser.parse_args()
    out = out_dir(args.out)
    if args.replot is not None:
        plot(json.loads(args.replot.read_text()), out / "throughput.png")
        return
    sizes = {"wordcount": args.words, "taxi": args.taxi}
    print(f"cluster runs ({args.runs} rounds):", flush=True)
    rates = asyncio.run(cluster_runs(sizes, args.runs))
    baseline = {name: statistics.median(single_process(name, size) for _ in range(args.runs))
                for name, size in sizes.items()}
    header = (f"{'workload':<10}{'size':>11}{'exactly-once/s':>16}{'off/s':>12}{'ratio':>8}"
              f"{'min e-o/s':>12}{'max e-o/s':>12}{'1 process/s':>13}{'target/s':>10}")
    rows = [header]
    figures: dict[str, dict[str, float]] = {}
    for name, size in sizes.items():
        on = statistics.median(rates[(name, "exactly_once")])
        off = statistics.median(rates[(name, "at_most_once")])
        ratios = [a / b for a, b in zip(rates[(name, "exactly_once")],
                                        rates[(name, "at_most_once")], strict=True)]
        rows.append(f"{name:<10}{size:>11,}{on:>16,.0f}{off:>12,.0f}"
                    f"{statistics.median(ratios):>8.2f}{min(rates[(name, 'exactly_once')]):>12,.0f}"
                    f"{max(rates[(name, 'exactly_once')]):>12,.0f}{baseline[name]:>13,.0f}"
                    f"{TARGETS[name]:>10,}")
        figures[name] = {"size": size, "exactly_once": on, "at_most_once": off,
                         "single_process": baseline[name], "target": TARGETS[name]}
    table = "\n".join(rows)
    print("\n" + table)
    (out / "throughput.txt").write_text(table + "\n")
    (out / "throughput.json").write_text(json.dumps(figures, indent=1) + "\n")
    plot(figures, out / "throughput.png")


def plot(figures: dict[str, dict[str, float]], path: Path) -> None:
    """One panel per workload: the cluster's medians as labelled bars from
    zero; the single-process ceiling and the target as references."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(figures), figsize=(5 * len(figures), 4.2), squeeze=False)
    for ax, (name, f) in zip(axes[0], figures.items(), strict=True):
        bars(ax, ["exactly-once", "at-most-once"], [f["exactly_once"], f["at_most_once"]],
             ["C0", "C1"], references=[("target", f["target"], "C3"),
                                       ("single process", f["single_process"], "C2")])
        ax.set_title(f"{name} ({int(f['size']):,})")
        ax.set_ylabel("words/s" if name == "wordcount" else "records/s")
    fig.suptitle("End-to-end throughput, 3 workers + 2 state servers on 2 cores (median)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
