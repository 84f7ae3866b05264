"""gridstream against Bytewax 0.21.1, Pathway 0.33.0 and one plain Python
process: same data files, same user functions, every result checked.

``make bench-peers`` installs each peer into a virtual environment of its own
and runs this driver with gridstream's interpreter:

    .venv/bin/python bench/peers [--out DIR] [--venvs DIR] [--rounds 3] \
        [--words 900000] [--taxi 1000000] [--systems NAME,...] [--workloads NAME,...]

It writes the two data sets once (``wordcount.generate`` and ``taxi.generate``
of ``gridstream.examples``, seed 0), computes the reference results in-process
with gridstream's own reference functions, then runs rounds: in each round
every workload on every system set-up, one after another, so slow drifts of a
shared machine fall on all systems alike. Each run is a fresh process tree (a
fresh cluster for gridstream, an empty recovery store or persistence directory
for the peers) whose runner (``bench/peers/*.py``) reports its timed window,
CPU-seconds of all its processes and peak memory (see ``common.Stats``). A
result that differs from the reference, or a run that fails, is a failure:
printed at once in a banner, listed at the end, and the exit status is 1.

The table gives medians over rounds; gridstream's ratios compare like with
like: exactly_once against the peers with fault tolerance on, at_most_once
against the peers with it off and against plain Python. Everything lands in
``--out`` (default ``~/.cache/gridstream-bench/out``, outside the repository):
``peers.txt`` (the table), ``peers.json`` (every run), ``peers.png`` and, per
run, its log.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent.parent))

from common import check_taxi_layout  # noqa: E402

from bench.machine import IDLE_LIMIT_CORES, machine_busy_cores  # noqa: E402
from bench.plots import Reference, hbars, pyplot  # noqa: E402
from gridstream.demo import compare  # noqa: E402
from gridstream.examples import taxi, wordcount  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gridstream-bench"
WORKLOADS = ("wordcount", "taxi")
UNITS = {"wordcount": "words", "taxi": "records"}
RUN_TIMEOUT_S = 1800.0
"""A run still going after this long is killed and counted as a failure."""

BUSY_SAMPLE_S = 0.3
"""How long the machine is watched before each run (outside its window)."""


@dataclass(frozen=True)
class System:
    """One system set-up: how to start its runner for a workload, and what must
    exist before the timed window (a recovery store, an empty directory)."""

    name: str
    family: str
    fault_tolerance: bool
    interpreter: str
    script: Callable[[str], str]
    options: tuple[str, ...] = ()
    bytewax_recovery_parts: int = 0
    pathway_persistence: bool = False
    gridstream_delivery: str = ""

    def argv(self, workload: str, data: Path, run_dir: Path) -> list[str]:
        """The runner's command line for one run in ``run_dir``."""
        argv = [self.interpreter, str(HERE / self.script(workload)), "--input", str(data),
                "--output", str(run_dir / "result.json"), "--stats", str(run_dir / "stats.json"),
                *self.options]
        if self.gridstream_delivery:
            argv += ["--workload", workload, "--delivery", self.gridstream_delivery,
                     "--run-dir", str(run_dir / "cluster")]
        if self.family == "plain Python":
            argv += ["--workload", workload]
        if self.bytewax_recovery_parts:
            argv += ["--recovery-dir", str(run_dir / "recovery"), "--snapshot-interval", "1"]
        if self.pathway_persistence:
            argv += ["--persistence-dir", str(run_dir / "persistence")]
        return argv

    def prepare(self, run_dir: Path) -> None:
        """Creates what the run needs before its window: Bytewax's SQLite
        recovery partitions (``python -m bytewax.recovery DIR N``)."""
        if self.bytewax_recovery_parts:
            store = run_dir / "recovery"
            store.mkdir(parents=True)
            subprocess.run([self.interpreter, "-m", "bytewax.recovery", str(store),
                            str(self.bytewax_recovery_parts)], check=True)


def systems(venvs: Path) -> tuple[list[System], list[str]]:
    """Every set-up whose interpreter exists, and a note for each peer missing."""
    own = sys.executable
    bytewax = venvs / "bytewax" / "bin" / "python"
    pathway = venvs / "pathway" / "bin" / "python"
    found = [
        System("gridstream exactly_once", "gridstream", True, own,
               lambda _w: "gridstream_run.py", gridstream_delivery="exactly_once"),
        System("gridstream at_most_once", "gridstream", False, own,
               lambda _w: "gridstream_run.py", gridstream_delivery="at_most_once"),
    ]
    missing = []
    if bytewax.exists():
        for workers in (1, 2):
            found.append(System(f"Bytewax {workers}w recovery 1s", "Bytewax", True,
                                str(bytewax), lambda w: f"bytewax_{w}.py",
                                ("--workers", str(workers)), bytewax_recovery_parts=workers))
            found.append(System(f"Bytewax {workers}w no recovery", "Bytewax", False,
                                str(bytewax), lambda w: f"bytewax_{w}.py",
                                ("--workers", str(workers))))
    else:
        missing.append(f"Bytewax: no interpreter at {bytewax} (run `make bench-peers`)")
    if pathway.exists():
        found.append(System("Pathway persistence", "Pathway", True, str(pathway),
                            lambda w: f"pathway_{w}.py", pathway_persistence=True))
        found.append(System("Pathway no persistence", "Pathway", False, str(pathway),
                            lambda w: f"pathway_{w}.py"))
    else:
        missing.append(f"Pathway: no interpreter at {pathway} (run `make bench-peers`)")
    found.append(System("plain Python", "plain Python", False, own, lambda _w: "plain.py"))
    return found, missing


@dataclass
class Run:
    """One run's outcome, as ``peers.json`` keeps it."""

    workload: str
    system: str
    round: int
    records: int
    ok: bool = False
    failure: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_bytes: int = 0
    processes: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    busy_before: float = 0.0
    """Cores busy on the machine just before the run (:func:`machine_busy_cores`)."""

    @property
    def rate(self) -> float:
        """Records (words for wordcount) per second of the timed window."""
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def per_cpu(self) -> float:
        """Records per CPU-second of all the system's processes."""
        return self.records / self.cpu_seconds if self.cpu_seconds else 0.0

    @property
    def cores(self) -> float:
        """Cores the system's processes kept busy on average over the timed
        window (CPU-seconds over seconds). A multi-process system's rate
        moves with how much of the machine's cores it gets: with another
        process busy on the machine, gridstream's taxi runs kept 1.5 cores
        busy instead of 1.8 and took a fifth longer for the same
        CPU-seconds (docs/benchmarks.md)."""
        return self.cpu_seconds / self.seconds if self.seconds else 0.0


def loud(message: str) -> None:
    """A failure, impossible to miss in the scrolling output."""
    bar = "!" * 78
    print(f"\n{bar}\n!!! {message}\n{bar}\n", flush=True)


def write_data(data_dir: Path, words: int, records: int) -> dict[str, tuple[Path, int, Any]]:
    """Writes both data sets and returns, per workload, (file, records, reference)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = wordcount.generate(words)
    words_path = data_dir / f"words-{words}-seed0.txt"
    words_path.write_text("".join(line + "\n" for line in lines))
    taxi_lines = list(taxi.generate(records))
    taxi_path = data_dir / f"taxi-{records}-seed0.jsonl"
    taxi_path.write_text("".join(line + "\n" for line in taxi_lines))
    if taxi_lines:
        check_taxi_layout(taxi_lines[0])
    return {"wordcount": (words_path, words, wordcount.reference(lines)),
            "taxi": (taxi_path, records, taxi.reference(taxi_lines))}


def run_once(system: System, workload: str, data: Path, records: int, expected: Any,
             run_dir: Path, number: int) -> Run:
    """Runs one system on one workload in a fresh directory and checks it."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    # The runs before this one left written data in the page cache (62 MB
    # after a Pathway taxi run with persistence): flushed by the kernel up to
    # 30 s later, it would land in this run's window and slow it down.
    os.sync()
    run = Run(workload, system.name, number, records)
    run.busy_before = machine_busy_cores(BUSY_SAMPLE_S)
    if run.busy_before > IDLE_LIMIT_CORES:
        loud(f"BUSY MACHINE before {workload} on {system.name} (round {number}): "
             f"{run.busy_before:.2f} cores busy with nothing of the bench running; "
             "this run's figures measure that too")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PATHWAY_LICENSE", "PATHWAY_MONITORING", "BYTEWAX_"))}
    log_path = run_dir / "run.log"
    try:
        system.prepare(run_dir)
        with log_path.open("w") as log:
            process = subprocess.Popen(system.argv(workload, data, run_dir), stdout=log,
                                       stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
            try:
                code = process.wait(RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # The runner leads a session of its own: its group is this run's
                # processes only (a cluster's members included).
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise RuntimeError(f"still running after {RUN_TIMEOUT_S:.0f} s; killed") from None
        if code != 0:
            tail = "\n".join(log_path.read_text().splitlines()[-15:])
            raise RuntimeError(f"exit status {code}; log {log_path}:\n{tail}")
        stats = json.loads((run_dir / "stats.json").read_text())
        actual = json.loads((run_dir / "result.json").read_text())
    except (OSError, RuntimeError, ValueError, subprocess.CalledProcessError) as error:
        run.failure = f"{type(error).__name__}: {error}"
        loud(f"FAILED {workload} on {system.name} (round {number}): {run.failure}")
        return run
    run.seconds = stats["seconds"]
    run.cpu_seconds = stats["cpu_seconds"]
    run.peak_rss_bytes = stats["peak_rss_bytes"]
    run.processes = stats["processes"]
    run.notes = stats["notes"]
    missing, extra, different = compare(actual, expected)
    if missing or extra or different:
        run.failure = (f"result differs from the reference: {missing} keys missing, "
                       f"{extra} unexpected, {different} with another value")
        loud(f"MISMATCH {workload} on {system.name} (round {number}): {run.failure}")
        return run
    run.ok = True
    # Results, stores and clusters can be large: a run that passed keeps its
    # log and stats only (a failed one keeps everything to look at).
    for leftover in run_dir.iterdir():
        if leftover.name not in ("run.log", "stats.json"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink()
    return run


@dataclass
class Row:
    """One line of the table: a system's medians on one workload."""

    workload: str
    system: str
    fault_tolerance: bool
    runs: int
    rate: float
    cpu_seconds: float
    per_cpu: float
    peak_mb: float
    rate_ratio: float | None = None
    cpu_ratio: float | None = None
    against: str = ""
    cores: float = 0.0
    """The median of :attr:`Run.cores`."""


def _paired_ratio(numerator: list[Run], denominator: list[Run],
                  value: Callable[[Run], float]) -> float | None:
    """Median over the rounds both passed of value(numerator) / value(denominator):
    pairing by round is what interleaving buys, since both ran under the
    same load."""
    by_round = {r.round: value(r) for r in denominator if value(r)}
    ratios = [value(r) / by_round[r.round] for r in numerator if r.round in by_round]
    return statistics.median(ratios) if ratios else None


def summarise(results: list[Run], order: list[System]) -> list[Row]:
    """Medians per (workload, system) over the rounds that passed, and
    gridstream's ratios against each other row (see the module docstring)."""
    rows: list[Row] = []
    for workload in WORKLOADS:
        by_name: dict[str, Row] = {}
        passed: dict[str, list[Run]] = {}
        for system in order:
            good = [r for r in results if r.workload == workload and r.system == system.name
                    and r.ok]
            if not good:
                continue
            passed[system.name] = good
            by_name[system.name] = Row(
                workload, system.name, system.fault_tolerance, len(good),
                statistics.median(r.rate for r in good),
                statistics.median(r.cpu_seconds for r in good),
                statistics.median(r.per_cpu for r in good),
                max(r.peak_rss_bytes for r in good) / 2**20,
                cores=statistics.median(r.cores for r in good))
        for row in by_name.values():
            against = ("gridstream exactly_once" if row.fault_tolerance
                       else "gridstream at_most_once")
            numerator, denominator = passed.get(against, []), passed[row.system]
            if row.system == "gridstream exactly_once":
                # Its own row: exactly-once over at-most-once, the cost of the guarantee.
                against = "gridstream at_most_once"
                numerator, denominator = passed[row.system], passed.get(against, [])
            elif row.system.startswith("gridstream"):
                continue
            row.rate_ratio = _paired_ratio(numerator, denominator, lambda r: r.rate)
            row.cpu_ratio = _paired_ratio(numerator, denominator, lambda r: r.per_cpu)
            if row.rate_ratio is not None:
                row.against = against.removeprefix("gridstream ")
        rows.extend(by_name.values())
    return rows


def _si(value: float) -> str:
    """1234567 -> '1.23M', 45600 -> '45.6k': the figures' scale at a glance."""
    for factor, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def table(rows: list[Row], sizes: dict[str, int], header: str) -> str:
    """The text table: one block per workload."""
    lines = [header, ""]
    columns = (f"{'system':<26}{'FT':>4}{'runs':>5}{'records/s':>12}{'CPU-s':>8}{'cores':>7}"
               f"{'rec/CPU-s':>11}{'peak MB':>9}{'gs rate x':>11}{'gs rec/CPU x':>14}  vs")
    for workload in WORKLOADS:
        block = [r for r in rows if r.workload == workload]
        if not block:
            continue
        lines.append(f"{workload}: {sizes[workload]:,} {UNITS[workload]}")
        lines.append(columns)
        for r in block:
            rate_ratio = f"{r.rate_ratio:.2f}" if r.rate_ratio is not None else "-"
            cpu_ratio = f"{r.cpu_ratio:.2f}" if r.cpu_ratio is not None else "-"
            lines.append(
                f"{r.system:<26}{'on' if r.fault_tolerance else 'off':>4}{r.runs:>5}"
                f"{r.rate:>12,.0f}{r.cpu_seconds:>8.2f}{r.cores:>7.2f}{r.per_cpu:>11,.0f}"
                f"{r.peak_mb:>9,.0f}"
                f"{rate_ratio:>11}{cpu_ratio:>14}  {r.against}".rstrip())
        lines.append("")
    lines.append("gs rate x / gs rec/CPU x: gridstream's records/s and records per CPU-second "
                 "divided by the row's,\n  exactly_once against fault tolerance on, "
                 "at_most_once against off; on gridstream's own exactly_once row,\n"
                 "  exactly_once over at_most_once; each the median of the per-round ratios.\n"
                 "cores: CPU-seconds over seconds, the cores the system's processes kept busy.\n"
                 "Peak MB: the largest over the rounds of the sum of the processes' peak RSS. "
                 "Other figures:\n  medians of the rounds that passed.")
    return "\n".join(lines)


COLOURS = {"gridstream": "#1f77b4", "Bytewax": "#ff7f0e", "Pathway": "#2ca02c",
           "plain Python": "#7f7f7f"}


CEILING = "plain Python"
"""The single-process set-up: a ceiling for what a record costs, drawn as a
reference line (or named at the top when it would flatten the bars), never
as a bar."""


def plot(rows: list[Row], order: list[System], path: Path, title: str) -> None:
    """Horizontal bars per workload: records/s, records per CPU-second and peak
    memory, each bar labelled with its value, every axis from zero; hatched
    bars are set-ups with fault tolerance on; the single-process run is a
    reference line (``bench/plots.py``)."""
    from matplotlib.patches import Patch

    plt = pyplot()
    workloads = [w for w in WORKLOADS if any(r.workload == w for r in rows)]

    def ratio(value: float | None) -> str:
        return f"   gs {value:.2f}x" if value is not None else ""

    metrics: list[tuple[str, Callable[[Row], float], Callable[[Row], str]]] = [
        ("records/s (median)", lambda r: r.rate, lambda r: _si(r.rate) + ratio(r.rate_ratio)),
        ("records per CPU-second (median)", lambda r: r.per_cpu,
         lambda r: _si(r.per_cpu) + ratio(r.cpu_ratio)),
        ("peak memory, MB (sum of processes)", lambda r: r.peak_mb,
         lambda r: f"{r.peak_mb:,.0f}"),
    ]
    family = {s.name: s.family for s in order}
    shown = [s for s in order if s.name != CEILING]
    fig, axes = plt.subplots(len(workloads), len(metrics), squeeze=False,
                             figsize=(6 * len(metrics), 0.5 * len(shown) * len(workloads) + 3))
    for row_axes, workload in zip(axes, workloads, strict=True):
        block = [r for r in rows if r.workload == workload and r.system != CEILING]
        ceiling = next((r for r in rows if r.workload == workload and r.system == CEILING), None)
        names = [r.system for r in block]
        for ax, (label, value, fmt) in zip(row_axes, metrics, strict=True):
            references: list[Reference] = []
            if ceiling is not None:
                references.append((f"{CEILING} (1 process, no fault tolerance)",
                                   value(ceiling), COLOURS[CEILING]))
            drawn = hbars(ax, names, [value(r) for r in block],
                          [COLOURS[family[n]] for n in names],
                          fmt=_si if label != metrics[2][0] else (lambda v: f"{v:,.0f}"),
                          references=references, texts=[fmt(r) for r in block])
            for bar, r in zip(drawn, block, strict=True):
                if r.fault_tolerance:
                    bar.set_hatch("//")
            if ceiling is not None and ceiling.rate_ratio is not None and label != metrics[2][0]:
                gs = ceiling.rate_ratio if label == metrics[0][0] else ceiling.cpu_ratio
                ax.text(0.98, 0.02, f"gridstream at_most_once / {CEILING}: {gs:.2f}x",
                        transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
                        color=COLOURS[CEILING])
            ax.set_title(f"{workload}: {label}", fontsize=10)
            ax.tick_params(axis="y", labelsize=8)
            ax.tick_params(axis="x", labelsize=8)
    fig.legend(handles=[Patch(facecolor="white", edgecolor="black", hatch="//",
                              label="fault tolerance on"),
                        *(Patch(color=c, label=f) for f, c in COLOURS.items() if f != CEILING),
                        Patch(facecolor="white", edgecolor=COLOURS[CEILING], ls="--",
                              label=f"{CEILING}: reference line (or named when off scale)")],
               loc="lower center", ncol=5, fontsize=8)
    fig.suptitle(title + "\ngs Nx: gridstream's figure over the bar's (exactly_once vs fault "
                 "tolerance on, at_most_once vs off; on gridstream exactly_once: over "
                 "at_most_once)", fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(results: list[Run], order: list[System], sizes: dict[str, int], header: str,
           out: Path, extra: dict[str, Any]) -> list[Run]:
    """Prints the table and writes ``peers.txt``, ``peers.json`` and
    ``peers.png`` into ``out``; returns the runs that failed."""
    rows = summarise(results, order)
    text = table(rows, sizes, header)
    failures = [r for r in results if not r.ok]
    busy = [r for r in results if r.busy_before > IDLE_LIMIT_CORES]
    if busy:
        text += (f"\n\nBUSY MACHINE: {len(busy)} of {len(results)} runs started with "
                 f"{min(r.busy_before for r in busy):.2f} to "
                 f"{max(r.busy_before for r in busy):.2f} cores busy before them "
                 "(another process?); their figures measure it too.")
    if failures:
        text += "\n\nFAILED RUNS:\n" + "\n".join(
            f"  {r.workload} on {r.system}, round {r.round}: {r.failure.splitlines()[0]}"
            for r in failures)
    print("\n" + text, flush=True)
    (out / "peers.txt").write_text(text + "\n")
    (out / "peers.json").write_text(json.dumps(
        {**extra, "header": header, "sizes": sizes, "runs": [asdict(r) for r in results],
         "rows": [asdict(r) for r in rows]}, indent=1))
    plot(rows, order, out / "peers.png", header)
    print(f"\ntable: {out / 'peers.txt'}\nruns: {out / 'peers.json'}\nplot: {out / 'peers.png'}")
    return failures


def replot(path: Path, venvs: Path) -> None:
    """Redraws the table and plot of an earlier run (its ``peers.json``) with
    this driver's summary, next to that file."""
    saved = json.loads(path.read_text())
    results = [Run(**run) for run in saved["runs"]]
    names = {r.system for r in results}
    order = [s for s in systems(venvs)[0] if s.name in names]
    extra = {k: v for k, v in saved.items() if k not in ("header", "sizes", "runs", "rows")}
    report(results, order, saved["sizes"], saved["header"], path.parent, extra)


def main() -> None:
    """Parses the command line, runs the rounds, prints and saves the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE / "out",
                        help="output directory (default: %(default)s)")
    parser.add_argument("--venvs", type=Path, default=CACHE / "venvs",
                        help="directory holding the bytewax/ and pathway/ virtual environments")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=900_000, help="wordcount words")
    parser.add_argument("--taxi", type=int, default=1_000_000, help="taxi records")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated subset of: " + ", ".join(WORKLOADS))
    parser.add_argument("--systems", default="",
                        help="comma-separated substrings; only matching set-ups run")
    parser.add_argument("--replot", type=Path, default=None,
                        help="run nothing: redraw the table and plot of a peers.json")
    args = parser.parse_args()
    if args.replot is not None:
        replot(args.replot.expanduser().resolve(), args.venvs.expanduser())
        return
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}")
    order, missing = systems(args.venvs.expanduser())
    for note in missing:
        loud(f"NOT RUN: {note}")
    if args.systems:
        wanted = [s.strip().lower() for s in args.systems.split(",") if s.strip()]
        order = [s for s in order if any(w in s.name.lower() for w in wanted)]
    out = args.out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC)
    print(f"writing data sets to {out / 'data'}", flush=True)
    data = write_data(out / "data", args.words, args.taxi)
    sizes = {w: data[w][1] for w in WORKLOADS}
    results: list[Run] = []
    for number in range(1, args.rounds + 1):
        for workload in workloads:
            path, records, expected = data[workload]
            for system in order:
                slug = system.name.lower().replace(" ", "-")
                run = run_once(system, workload, path, records, expected,
                               out / "runs" / workload / slug / f"round-{number}", number)
                results.append(run)
                if run.ok:
                    print(f"round {number} {workload:<9} {system.name:<26} "
                          f"{run.rate:>12,.0f} {UNITS[workload]}/s  {run.cpu_seconds:7.2f} CPU-s "
                          f"{run.cores:5.2f} cores {run.per_cpu:>11,.0f}/CPU-s  "
                          f"{run.peak_rss_bytes / 2**20:7,.0f} MB"
                          "  result MATCH", flush=True)
    header = (f"gridstream vs peers, {started:%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} cores, Python {platform.python_version()}; "
              f"{args.rounds} rounds; wordcount {sizes['wordcount']:,} words, "
              f"taxi {sizes['taxi']:,} records")
    failures = report(results, order, sizes, header, out,
                      {"rounds": args.rounds, "started": started.isoformat()})
    if failures:
        loud(f"{len(failures)} run(s) failed or did not match the reference (listed above)")
        raise SystemExit(1)


if __name__ == "__main__":
    started_at = time.monotonic()
    main()
    print(f"done in {time.monotonic() - started_at:.0f} s")
