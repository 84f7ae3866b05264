"""End-to-end throughput of the local cluster against a single-process run.

Runs wordcount (900,000 words) and taxi (1,000,000 records) on one local
cluster (1 scheduler, 3 workers, 2 state servers, all on this machine), each
``--runs`` times, and prints the median records/s next to a single-process
pure-Python run of the same computation. Writes a table and a PNG plot to
``bench/out/``.

    .venv/bin/python bench/throughput.py [--runs 3] [--taxi 1000000] [--words 900000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridstream.config import Config
from gridstream.demo import run_on
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

OUT = Path(__file__).resolve().parent / "out"


def single_process(name: str, size: int) -> float:
    """Units per second of the same computation in one Python process."""
    if name == "taxi":
        data = list(taxi.generate(size))
        started = time.perf_counter()
        taxi.reference(data)
    else:
        lines = wordcount.generate(size)
        started = time.perf_counter()
        wordcount.reference(lines)
    return size / (time.perf_counter() - started)


async def cluster_runs(sizes: dict[str, int], runs: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in sizes}
    with tempfile.TemporaryDirectory(prefix="gridstream-bench-") as run_dir:
        async with LocalCluster(run_dir, Config(), workers=3, state_servers=2) as cluster:
            for i in range(runs):
                for name, size in sizes.items():
                    report = await run_on(cluster.scheduler_address, name, size)
                    if not report.match:
                        raise SystemExit(f"run {i} of {name} did not match the reference: "
                                         f"{report.summary()}")
                    rates[name].append(report.rate)
                    print(f"  run {i + 1}: {report.summary()}", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--taxi", type=int, default=1_000_000, help="taxi records")
    parser.add_argument("--words", type=int, default=900_000, help="wordcount words")
    args = parser.parse_args()
    sizes = {"wordcount": args.words, "taxi": args.taxi}
    print(f"cluster runs (median of {args.runs}):", flush=True)
    rates = asyncio.run(cluster_runs(sizes, args.runs))
    baseline = {name: statistics.median(single_process(name, size) for _ in range(args.runs))
                for name, size in sizes.items()}
    targets = {"wordcount": 600_000, "taxi": 170_000}
    rows = []
    header = (f"{'workload':<10}{'size':>11}{'cluster/s (median)':>20}{'min':>11}{'max':>11}"
              f"{'1 process/s':>13}{'target/s':>10}")
    for name, size in sizes.items():
        med = statistics.median(rates[name])
        rows.append(f"{name:<10}{size:>11,}{med:>20,.0f}{min(rates[name]):>11,.0f}"
                    f"{max(rates[name]):>11,.0f}{baseline[name]:>13,.0f}{targets[name]:>10,}")
    table = "\n".join([header, *rows])
    print("\n" + table)
    OUT.mkdir(exist_ok=True)
    (OUT / "throughput.txt").write_text(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = list(sizes)
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(names))
        ax.bar([x - 0.27 for x in xs], [statistics.median(rates[n]) for n in names], 0.27,
               label="gridstream cluster (3 workers)")
        ax.bar(list(xs), [baseline[n] for n in names], 0.27, label="single process")
        ax.bar([x + 0.27 for x in xs], [targets[n] for n in names], 0.27, label="target")
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("records (words) per second")
        ax.set_title("End-to-end throughput on 2 cores")
        ax.legend()
        fig.tight_layout()
        fig.savefig(OUT / "throughput.png", dpi=100)
        print(f"plot: {OUT / 'throughput.png'}")
    except ImportError:
        print("matplotlib not installed; no plot")


if __name__ == "__main__":
    main()
