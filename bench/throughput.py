"""End-to-end throughput of the local cluster, exactly-once on and off, next to
a single-process run of the same computation.

Runs wordcount (900,000 words) and taxi (1,000,000 records) on one local
cluster (1 scheduler, 3 workers, 2 state servers, all on this machine),
alternating delivery modes within each round so the ratio is measured under
the same conditions: ``exactly_once`` (replicated JobContainers, dedupe) and
``at_most_once`` (no replication). Prints medians of ``--runs`` rounds and
writes ``throughput.txt``, ``throughput.json`` and ``throughput.png`` to
``--out`` (default ``~/.cache/gridstream-bench/out``, outside the repository).
Each run also counts the CPU (user + system, every thread) of the client and
of every member of the cluster over the timed window, read from
``/proc/<pid>/stat``: the machine is CPU-bound, so CPU-seconds per million
records is the figure to compare changes by (far less noisy than records/s on
a shared machine).
The plot shows the cluster's bars with their values; the single-process
ceiling and the target are reference lines (or named at the top when they
would flatten the bars). ``--replot`` draws the plot again from a JSON file.

    .venv/bin/python bench/throughput.py [--runs 3] [--taxi 1000000] [--words 900000]
                                         [--workloads wordcount,taxi] [--modes ...]
                                         [--out DIR] [--replot DIR/throughput.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plots import add_out_argument, bars, out_dir, pyplot
from gridstream.builtins import count, split_words
from gridstream.client import DEFAULT_BATCH_SIZE, Client
from gridstream.config import Config
from gridstream.demo import compare, workload
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

MODES = ("exactly_once", "at_most_once")
TARGETS = {"wordcount": 1_050_000, "taxi": 280_000}
"""exactly_once targets, the whole cluster on a 2-core machine: 1.5 times the
best peer set-up measured by ``make bench-peers`` when they were set."""


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


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU of a live process (every thread), from
    ``/proc/<pid>/stat`` (0.0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()
    # fields[11] and fields[12] are utime and stime (stat fields 14 and 15).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU of this process (the client), every thread."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


@dataclass
class Run:
    """One timed run: units of work, wall seconds, CPU-seconds of the client
    and of the cluster's members over the same window."""

    units: int
    seconds: float
    client_cpu: float
    cluster_cpu: float
    roles: dict[str, float]
    """CPU-seconds per member role (scheduler, worker, stateserver)."""

    @property
    def rate(self) -> float:
        """Units per wall second."""
        return self.units / self.seconds

    @property
    def cpu(self) -> float:
        """CPU-seconds of every process of the system."""
        return self.client_cpu + self.cluster_cpu

    @property
    def cpu_per_million(self) -> float:
        """CPU-seconds of every process per million units."""
        return self.cpu / self.units * 1e6

    def summary(self) -> str:
        """One line of figures."""
        return (f"{self.units:,} in {self.seconds:.2f} s = {self.rate:,.0f}/s; "
                f"CPU {self.cpu:.2f} s (client {self.client_cpu:.2f}, cluster "
                f"{self.cluster_cpu:.2f}: "
                + ", ".join(f"{role} {cpu:.2f}" for role, cpu in sorted(self.roles.items()))
                + f") = {self.cpu_per_million:.2f} CPU-s per million, "
                f"{self.units / self.cpu:,.0f} per CPU-second")


async def timed_run(cluster: LocalCluster, name: str, size: int, delivery: str,
                    batch_size: int = DEFAULT_BATCH_SIZE) -> Run:
    """Runs a workload in a timed window (submit to drain, as ``gridstream
    demo`` measures it) that also counts the CPU of the client and of every
    member; reading and checking the results come after the window."""
    spec, keys, data, expected, units, _ = workload(name, size)
    spec = replace(spec, delivery=delivery)
    pids = {member.pid: member.role for member in cluster.members.values()}
    async with Client(cluster.scheduler_address, batch_size=batch_size,
                      security=cluster.config.security) as client:
        before = {pid: process_cpu_seconds(pid) for pid in pids}
        client_before = own_cpu_seconds()
        started = time.monotonic()
        job_id = await client.submit(spec)
        await client.send(job_id, data, keys)
        await client.drain(job_id)
        seconds = time.monotonic() - started
        client_cpu = own_cpu_seconds() - client_before
        roles: dict[str, float] = {}
        for pid, role in pids.items():
            roles[role] = roles.get(role, 0.0) + process_cpu_seconds(pid) - before[pid]
        actual = await client.results(job_id)
    missing, extra, different = compare(actual, expected)
    if missing or extra or different:
        raise SystemExit(f"{name}/{delivery} did not match the reference: {missing} missing, "
                         f"{extra} unexpected, {different} different")
    return Run(units, seconds, client_cpu, sum(roles.values()), roles)


async def cluster_runs(sizes: dict[str, int], runs: int,
                       modes: tuple[str, ...]) -> dict[tuple[str, str], list[Run]]:
    results: dict[tuple[str, str], list[Run]] = {(n, m): [] for n in sizes for m in modes}
    with tempfile.TemporaryDirectory(prefix="gridstream-bench-") as run_dir:
        async with LocalCluster(run_dir, Config(), workers=3, state_servers=2) as cluster:
            print("members: " + ", ".join(f"{name} pid {member.pid}"
                                          for name, member in cluster.members.items()),
                  flush=True)
            for i in range(runs):
                for name, size in sizes.items():
                    for mode in modes:
                        run = await timed_run(cluster, name, size, mode)
                        results[(name, mode)].append(run)
                        print(f"  round {i + 1} {name:<9} {mode:<13} {run.summary()}",
                              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--taxi", type=int, default=1_000_000, help="taxi records")
    parser.add_argument("--words", type=int, default=900_000, help="wordcount words")
    parser.add_argument("--workloads", default="wordcount,taxi",
                        help="comma-separated: wordcount, taxi (default both)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated delivery modes (default both; the ratio "
                             "column needs both)")
    parser.add_argument("--no-single", action="store_true",
                        help="skip the single-process reference runs")
    parser.add_argument("--replot", type=Path, default=None,
                        help="draw the plot again from a throughput.json; run nothing")
    add_out_argument(parser)
    args = parser.parse_args()
    out = out_dir(args.out)
    if args.replot is not None:
        plot(json.loads(args.replot.read_text()), out / "throughput.png")
        return
    chosen = args.workloads.split(",")
    sizes = {name: size for name, size in (("wordcount", args.words), ("taxi", args.taxi))
             if name in chosen}
    modes = tuple(args.modes.split(","))
    print(f"cluster runs ({args.runs} rounds):", flush=True)
    results = asyncio.run(cluster_runs(sizes, args.runs, modes))
    baseline = {name: 0.0 if args.no_single else
                statistics.median(single_process(name, size) for _ in range(args.runs))
                for name, size in sizes.items()}
    header = (f"{'workload':<10}{'mode':<14}{'size':>11}{'units/s':>11}{'min/s':>11}"
              f"{'max/s':>11}{'CPU-s/M':>9}{'client':>8}{'cluster':>9}{'per CPU-s':>11}"
              f"{'e-o/off':>8}")
    rows = [header]
    figures: dict[str, dict[str, float]] = {}
    for name, size in sizes.items():
        for mode in modes:
            runs = results[(name, mode)]
            ratio = ""
            if mode == "exactly_once" and (name, "at_most_once") in results:
                ratio = f"{statistics.median(a.rate / b.rate for a, b in zip(runs, results[(name, 'at_most_once')], strict=True)):>8.2f}"  # noqa: E501
            rows.append(
                f"{name:<10}{mode:<14}{size:>11,}"
                f"{statistics.median(r.rate for r in runs):>11,.0f}"
                f"{min(r.rate for r in runs):>11,.0f}{max(r.rate for r in runs):>11,.0f}"
                f"{statistics.median(r.cpu_per_million for r in runs):>9.2f}"
                f"{statistics.median(r.client_cpu / r.units * 1e6 for r in runs):>8.2f}"
                f"{statistics.median(r.cluster_cpu / r.units * 1e6 for r in runs):>9.2f}"
                f"{statistics.median(r.units / r.cpu for r in runs):>11,.0f}{ratio}")
        figures[name] = {"size": size, "single_process": baseline[name],
                         "target": TARGETS[name]}
        for mode in modes:
            runs = results[(name, mode)]
            figures[name][mode] = statistics.median(r.rate for r in runs)
            figures[name][f"{mode}_cpu_s_per_million"] = statistics.median(
                r.cpu_per_million for r in runs)
        rows.append(f"{'':<10}{'1 process':<14}{size:>11,}{baseline[name]:>11,.0f}"
                    f"{'':>31}target {TARGETS[name]:,}/s")
    rows.append("CPU-s/M: CPU-seconds of the client and every member per million units "
                "(client, cluster: its parts); medians of the runs.")
    table = "\n".join(rows)
    print("\n" + table)
    (out / "throughput.txt").write_text(table + "\n")
    (out / "throughput.json").write_text(json.dumps(figures, indent=1) + "\n")
    if set(modes) == set(MODES):
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
