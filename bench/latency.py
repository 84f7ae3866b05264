"""Ingest-to-sink latency at a steady paced rate: p50, p99 and p99.9 per 5 s
interval over a 60 s run, against the target of issue 16 (p99 <= 50 ms at half
of peak throughput).

Starts a local cluster shaped like ``bench/throughput.py``'s (1 scheduler,
3 workers, 2 state servers, on this machine) and runs a keyed job:
wordcount by default (split, then a count reduced per word), ``--workload
taxi`` (parse, then positions appended per device; records keyed by device
from the client). First it measures the job's peak throughput closed-loop
(send ``--peak-units`` as fast as the client can, submit to drain, as
``bench/throughput.py`` does; ``--peak-runs`` (3) such jobs, the median
of their rates, since one job's rate moved by a quarter between runs of
the same code) unless ``--rate`` is given; then it sends at
``--fraction`` (0.5) of that peak for ``--seconds`` (60).

How the sender paces. Open loop: record ``i`` is due at ``t0 + i / rate`` on
the wall clock and carries that time as its stamp. With ``--sender
producer`` (the default) every ``--tick-ms`` (1) the records that have come
due are put into a :class:`gridstream.producer.Producer`, which keeps
``--in-flight`` (1) sends going and sends everything put meanwhile as each
is acknowledged: the batches grow while the cluster is slow. With
``--sender ticks`` every ``--tick-ms`` (50) the due records go to
``Client.send`` as a task of their own (up to ``--in-flight`` (32) sends at
once, each partition's pushes in order). Either way the sender never slows
down to the cluster's pace: a cluster that falls behind makes records wait
(in the producer, in the client, in the pushes) with their stamps running,
and that wait is latency, not a lower rate. The records/s the sender
achieved per interval is printed next to the latencies.

How latency is measured: exactly, per record. The job is the plain
workload with the due time carried in each record (``bench/latency_job.py``):
the sink task's last stage before the sink computes ``time.time() - stamp``
for every record of the batch it is processing (the moment the workers'
``gridstream_ingest_to_sink_seconds`` histogram observes too; the row reaches
the state servers' results table on the task's next flush, not measured
here). The workers count these in 0.1 ms steps and the bench reads the counts
at the end, so the percentiles are exact to 0.1 ms, over every record, per
5 s interval of the records' due times. The first task records the same from
its side ("source": due time to the first task processing the record),
which splits the figure into getting in and crossing the cluster. The
results are checked against the workload's reference, and the sink must have
observed each record sent exactly once.

Beside it, for comparison, the workers' own histogram
(``gridstream_ingest_to_sink_seconds``, scraped every 5 s from every worker;
per-interval bucket deltas, percentiles interpolated linearly inside the
buckets, bounds ``gridstream.metrics.LATENCY_BUCKETS_S``): it starts at the
client's encoding of a push (``RecordBatch.ingest_unix_s``), so it leaves out
the wait before a push, and its buckets (50, 100, 250 ms ...) make its p99 an
estimate. Also printed: the CPU the cluster and the client used over the run
(2 cores here: whether half of peak leaves the machine any headroom) and the
worst event-loop lag the workers logged.

Writes ``latency.txt``, ``latency.json`` and ``latency.png`` to ``--out``
(default ``~/.cache/gridstream-bench/out``, outside the repository).

    .venv/bin/python bench/latency.py [--workload wordcount|taxi] [--delivery exactly_once]
                                      [--seconds 60] [--rate UNITS_PER_S | --fraction 0.5]
                                      [--sender producer|ticks] [--tick-ms 0] [--in-flight 0]
                                      [--partitions 0] [--tracking-flush-s 0]
                                      [--out DIR] [--replot DIR/latency.json]

``--partitions`` and ``--tracking-flush-s`` set the job's partitions and the
cluster's window flush (0: their defaults, 12 and 1 s); with ``--tick-ms``
they are what the figure moves with most (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import latency_job
from bench.latency_report import INTERVAL_S, plot, table
from bench.machine import busy_cores, machine_cpu_times
from bench.percentiles import bucket_percentile, exact_percentile
from bench.plots import add_out_argument, out_dir
from bench.recovery import loop_lags
from bench.throughput import own_cpu_seconds, process_cpu_seconds
from gridstream.client import Client
from gridstream.config import Config
from gridstream.demo import compare
from gridstream.examples import taxi, wordcount
from gridstream.jobspec import JobSpec, Stage
from gridstream.local import LocalCluster
from gridstream.metrics import LATENCY_BUCKETS_S
from gridstream.producer import Producer

SENDERS = {"producer": (1.0, 1), "ticks": (50.0, 32)}
"""Each sender's defaults: (how often due records are handed over, in ms;
sends in flight at most)."""
TARGET_MS = 50.0
QUANTILES = (0.5, 0.99, 0.999)
JOB_MODULE = "bench.latency_job"
METRIC = "gridstream_ingest_to_sink_seconds"


# -- workloads -----------------------------------------------------------------


@dataclass
class Workload:
    """A job of ``bench/latency_job.py`` and its records, made on demand."""

    name: str
    unit: str
    """What the rates count: words (wordcount) or records (taxi)."""
    units_per_record: int
    pool: list[str] = field(default_factory=list)
    partitions: int = 0
    """The job's partitions (0: the cluster's default)."""

    def job(self, delivery: str) -> JobSpec:
        module = JOB_MODULE
        if self.name == "taxi":
            stages = (Stage("parse", "map_batch", f"{module}:parse_batch"),
                      Stage("track", "reduce", f"{module}:append_stamped",
                            key="gridstream.examples.taxi:device_of", initial=""),
                      Stage("observe", "map_batch", f"{module}:observe_sink"),
                      Stage("store", "sink"))
        else:
            stages = (Stage("split", "map_batch", f"{module}:split_batch"),
                      Stage("count", "reduce", f"{module}:count_stamped",
                            key=f"{module}:word_of", initial=0),
                      Stage("observe", "map_batch", f"{module}:observe_sink"),
                      Stage("store", "sink"))
        return JobSpec(name=f"latency-{self.name}", stages=stages, delivery=delivery,
                       partitions=self.partitions)

    def payloads(self, start: int = 0) -> Iterator[tuple[str | None, str]]:
        """(key, record) from the ``start``-th record on, without end: taxi's
        generator in order, wordcount's pool of lines over and over."""
        if self.name == "taxi":
            generated = itertools.islice(taxi.generate(10**12), start, None)
            for i, text in enumerate(generated, start):
                yield str(1000 + i % taxi.DEVICES), text
        else:
            for i in itertools.count(start):
                yield None, self.pool[i % len(self.pool)]

    def reference(self, records: int) -> dict[str, Any]:
        """The results of the first ``records`` records."""
        if self.name == "taxi":
            return dict(taxi.reference(taxi.generate(records)))
        cycles, rest = divmod(records, len(self.pool))
        counts: Counter[str] = Counter()
        if cycles:  # a word the run never reached has no row, not a row of 0
            for word, n in wordcount.reference(self.pool).items():
                counts[word] += n * cycles
        counts.update(wordcount.reference(self.pool[:rest]))
        return dict(counts)


def make_workload(name: str, partitions: int = 0) -> Workload:
    if name == "taxi":
        return Workload("taxi", "records", 1, partitions=partitions)
    if name == "wordcount":
        return Workload("wordcount", "words", wordcount.WORDS_PER_LINE,
                        wordcount.generate(1_000_000, seed=1), partitions)
    raise SystemExit(f"unknown workload {name!r}; choose wordcount or taxi")


# -- the workers' histogram ------------------------------------------------------


def scrape_histogram(addresses: list[str], job_id: str) -> list[float]:
    """The job's ``gridstream_ingest_to_sink_seconds`` over every worker, as
    counts per bucket (not cumulative; the last above every bound)."""
    from prometheus_client.parser import text_string_to_metric_families

    cumulative: dict[float, float] = {bound: 0.0 for bound in (*LATENCY_BUCKETS_S, math.inf)}
    for address in addresses:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{METRIC}_bucket" and sample.labels.get("job") == job_id:
                    cumulative[float(sample.labels["le"])] += sample.value
    ordered = [cumulative[bound] for bound in sorted(cumulative)]
    return [ordered[0], *(b - a for a, b in itertools.pairwise(ordered))]


@dataclass
class Scrape:
    """One scrape of the workers' histogram: wall time and bucket counts."""

    wall: float
    counts: list[float]


# -- the run ---------------------------------------------------------------------


@dataclass
class Paced:
    """What the paced run measured."""

    t0: float
    rate: float
    records: int
    units: int
    send_seconds: float
    scrapes: list[Scrape]
    handed: Counter[tuple[int, int]]
    """Records by due second and 0.1 ms steps from due to handed to the client."""
    cpu: dict[str, float]
    wall: float
    machine_cores: float = 0.0
    """Cores busy on the whole machine over the same span as ``cpu``
    (:func:`bench.machine.busy_cores`)."""


async def measure_peak(client: Client, workload: Workload, delivery: str,
                       units: int) -> tuple[float, int, int]:
    """Units per second of the stamped job, closed loop (submit to drain).
    Its records carry a stamp each, as the paced run's do, so the workers
    observe every one of them: the peak is that of the job the paced run
    runs, observations included (with unstamped records, which the workers
    skip, it came out 25 to 40 % higher, and half of it left the cluster
    no headroom). Returns the rate, the records sent and the units (words or
    records) the sink observes; :func:`observed_before` takes these
    observations out of the paced run's."""
    records = max(1, units // workload.units_per_record)
    pairs = list(itertools.islice(workload.payloads(), records))
    keys = [k for k, _ in pairs] if workload.name == "taxi" else None
    stamp = time.time()
    values = [[text, stamp + i * 1e-7] for i, (_, text) in enumerate(pairs)]
    started = time.monotonic()
    job_id = await client.submit(workload.job(delivery))
    await client.send(job_id, values, keys)
    await client.drain(job_id)
    seconds = time.monotonic() - started
    await client.cancel(job_id)
    observed = (sum(len(text.lower().split()) for _, text in pairs)
                if workload.name == "wordcount" else records)
    return records * workload.units_per_record / seconds, records, observed


Observations = Counter[tuple[int, int]]


async def observed_before(directory: Path, records: int, units: int,
                          timeout_s: float = 30.0) -> tuple[Observations, Observations]:
    """The sink's and the source's observations of the peak run's
    ``records`` (``units`` at the sink), once the workers have written them
    all (they write every ``FLUSH_S``): the paced run's are what the files
    hold beyond these."""
    deadline = time.monotonic() + timeout_s
    while True:
        sink = latency_job.read_observations(directory, "sink")
        source = latency_job.read_observations(directory, "source")
        if source.total() == records and sink.total() == units:
            return sink, source
        if time.monotonic() > deadline:
            raise SystemExit(f"the workers wrote {source.total():,} source observations of "
                             f"the peak run's {records:,} records in {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


class HandingClient:
    """The client as a :class:`gridstream.producer.Producer` sends with,
    noting when each record is handed to ``Client.send`` (the send p99)."""

    def __init__(self, client: Client, handed: Counter[tuple[int, int]]) -> None:
        self.client = client
        self.handed = handed

    async def send(self, job_id: str, values: Sequence[Any],
                   keys: Sequence[Any] | None = None) -> int:
        """``Client.send``, once the records' wait is noted."""
        note_handed(self.handed, values)
        return await self.client.send(job_id, values, keys)


def note_handed(handed: Counter[tuple[int, int]], values: Sequence[Any]) -> None:
    """Counts ``[payload, stamp]`` records by due second and by the steps
    from their stamp to now."""
    now = time.time()
    handed.update([(int(stamp), int((now - stamp) / latency_job.RESOLUTION_S))
                   for _, stamp in values])


async def paced_run(cluster: LocalCluster, client: Client, workload: Workload, job_id: str,
                    rate: float, seconds: float, sender: str, tick_s: float, in_flight: int,
                    spread: int) -> Paced:
    """Sends ``rate`` units per second for ``seconds``, open loop (see the
    module docstring), scraping the workers' histogram every interval."""
    per_second = rate / workload.units_per_record
    total = int(per_second * seconds)
    source = workload.payloads()
    keyed = workload.name == "taxi"
    what = "records" if keyed else "lines"
    workers = [m.metrics_address for m in cluster.members.values() if m.role == "worker"]
    pids = {m.pid: m.role for m in cluster.members.values()}
    slots = asyncio.Semaphore(in_flight)
    sends: set[asyncio.Task[int]] = set()
    failures: list[BaseException] = []
    scrapes: list[Scrape] = []
    handed: Counter[tuple[int, int]] = Counter()
    """(due second, steps from due to handed to Client.send) -> records."""

    def finished(task: asyncio.Task[int]) -> None:
        sends.discard(task)
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    async def scraper() -> None:
        for k in itertools.count(1):
            await asyncio.sleep(max(0.0, t0 + k * INTERVAL_S - time.time()))
            counts = await asyncio.to_thread(scrape_histogram, workers, job_id)
            scrapes.append(Scrape(time.time(), counts))
            last = scrapes[-2] if len(scrapes) > 1 else None
            if last is not None:
                delta = [b - a for a, b in zip(last.counts, counts, strict=True)]
                p99 = bucket_percentile(LATENCY_BUCKETS_S, delta, 0.99) * 1e3
                print(f"  {(k - 1) * INTERVAL_S:>3}-{k * INTERVAL_S:<3}s due {due:>10,} "
                      f"sent {sent:>10,} {what}; sends in flight {len(sends):>3}; "
                      f"sink {sum(delta) / (scrapes[-1].wall - last.wall):>9,.0f} "
                      f"{workload.unit}/s; workers' histogram p99 ~ {p99:,.0f} ms",
                      flush=True)

    t0 = float(math.ceil(time.time()) + 1)  # a whole second: observations count by second
    due = sent = 0
    scrapes.append(Scrape(t0, await asyncio.to_thread(scrape_histogram, workers, job_id)))
    await asyncio.sleep(max(0.0, t0 - time.time()))
    cpu_before = {pid: process_cpu_seconds(pid) for pid in pids}
    client_before = own_cpu_seconds()
    machine_before = machine_cpu_times()
    watcher = asyncio.create_task(scraper())
    producer = (Producer(HandingClient(client, handed), job_id, max_in_flight=in_flight)
                if sender == "producer" else None)
    tick = 0
    try:
        while sent < total and not failures:
            due = min(total, int((time.time() - t0) * per_second) + 1)
            if due > sent:
                chunk = list(itertools.islice(source, due - sent))
                values = [[text, t0 + (sent + i) / per_second]
                          for i, (_, text) in enumerate(chunk)]
                sent = due
                pieces: list[tuple[list[Any], list[Any] | None]]
                if producer is not None:  # sent as the send before is acknowledged
                    await producer.put(values, [k for k, _ in chunk] if keyed else None)
                    pieces = []
                elif keyed:  # the client groups them by partition
                    pieces = [(values, [k for k, _ in chunk])]
                else:  # one batch to each of the next ``spread`` partitions in turn
                    size = math.ceil(len(values) / spread)
                    pieces = [(values[i:i + size], None) for i in range(0, len(values), size)]
                for piece, keys in pieces:
                    await slots.acquire()  # at the limit the records wait, stamps running
                    note_handed(handed, piece)
                    task = asyncio.create_task(client.send(job_id, piece, keys))
                    sends.add(task)
                    task.add_done_callback(finished)
            tick += 1
            await asyncio.sleep(max(0.0, t0 + tick * tick_s - time.time()))
        if producer is not None:
            await producer.close()  # every record acknowledged
        if sends:
            await asyncio.wait(set(sends))
        if failures:
            raise failures[0]
        send_seconds = time.time() - t0
        await client.drain(job_id)
        wall = time.time() - t0
        cpu = {"client": own_cpu_seconds() - client_before}
        for pid, role in pids.items():
            cpu[role] = cpu.get(role, 0.0) + process_cpu_seconds(pid) - cpu_before[pid]
        machine = busy_cores(machine_before, machine_cpu_times(), os.cpu_count() or 1)
    finally:
        watcher.cancel()
        if producer is not None:
            await producer.abort()
        for task in list(sends):
            task.cancel()
    scrapes.append(Scrape(time.time(), await asyncio.to_thread(scrape_histogram, workers,
                                                               job_id)))
    return Paced(t0, rate, total, total * workload.units_per_record, send_seconds, scrapes,
                 handed, cpu, wall, machine)


def steps_between(observed: Mapping[tuple[int, int], int], low: int, high: int
                  ) -> Counter[int]:
    """``latency steps -> records`` of the records due in ``[low, high)``
    (whole seconds), from ``(due second, steps) -> records``."""
    found: Counter[int] = Counter()
    for (second, steps), n in observed.items():
        if low <= second < high:
            found[steps] += n
    return found


def interval_rows(paced: Paced, sink: Counter[tuple[int, int]],
                  source: Counter[tuple[int, int]], seconds: float) -> list[dict[str, Any]]:
    """One row per interval of the records' due times: units/s sent, the
    exact percentiles at the sink (which sees units: words, records) and the
    source's p99, and the workers'
    histogram over the same stretch of wall time (sink time, not due time)."""
    step_ms = latency_job.RESOLUTION_S * 1e3
    start = int(paced.t0)
    rows = []
    for k in range(math.ceil(seconds / INTERVAL_S)):
        low, high = start + k * INTERVAL_S, start + (k + 1) * INTERVAL_S
        at_sink, at_source, at_send = (steps_between(observed, low, high)
                                       for observed in (sink, source, paced.handed))
        width = min(high, paced.t0 + seconds) - low
        row: dict[str, Any] = {
            "start_s": k * INTERVAL_S,
            "sent_per_s": sum(at_sink.values()) / width,
            **{f"p{q * 100:g}_ms": exact_percentile(at_sink, q) * step_ms for q in QUANTILES},
            "max_ms": max(at_sink, default=0) * step_ms,
            "source_p99_ms": exact_percentile(at_source, 0.99) * step_ms,
            "send_p99_ms": exact_percentile(at_send, 0.99) * step_ms,
        }
        if k + 2 <= len(paced.scrapes):
            a, b = paced.scrapes[k], paced.scrapes[k + 1]
            delta = [y - x for x, y in zip(a.counts, b.counts, strict=True)]
            row["sink_per_s"] = sum(delta) / (b.wall - a.wall)
            row["histogram_p99_ms"] = bucket_percentile(LATENCY_BUCKETS_S, delta, 0.99) * 1e3
        rows.append(row)
    return rows


def whole_run(sink: Counter[tuple[int, int]]) -> dict[str, float]:
    steps = steps_between(sink, 0, 2**62)
    step_ms = latency_job.RESOLUTION_S * 1e3
    figures = {f"p{q * 100:g}_ms": exact_percentile(steps, q) * step_ms for q in QUANTILES}
    figures["max_ms"] = max(steps, default=0) * step_ms
    figures["mean_ms"] = (sum(s * n for s, n in steps.items()) / max(1, steps.total())
                          * step_ms)
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workload = make_workload(args.workload, args.partitions)
    with tempfile.TemporaryDirectory(prefix="gridstream-latency-") as run_dir:
        observed = Path(run_dir) / "observed"
        observed.mkdir()
        base = Config()
        config = replace(base, cluster=replace(
            base.cluster, job_modules=(*base.cluster.job_modules, JOB_MODULE),
            tracking_flush_s=args.tracking_flush_s or base.cluster.tracking_flush_s))
        async with LocalCluster(run_dir, config, workers=3, state_servers=2,
                                extra_env={latency_job.ENV: str(observed)}) as cluster:
            print("members: " + ", ".join(f"{name} pid {member.pid}"
                                          for name, member in cluster.members.items()),
                  flush=True)
            async with Client(cluster.scheduler_address, batch_size=args.batch_size,
                              security=cluster.config.security) as client:
                peak = 0.0
                peaks: list[float] = []
                rate = args.rate
                before: tuple[Observations, Observations] = (Counter(), Counter())
                if not rate:
                    print(f"peak: {args.peak_runs} x {args.peak_units:,} {workload.unit}, "
                          "closed loop ...", flush=True)
                    records = units = 0
                    for _ in range(args.peak_runs):
                        run_peak, run_records, run_units = await measure_peak(
                            client, workload, args.delivery, args.peak_units)
                        peaks.append(run_peak)
                        records, units = records + run_records, units + run_units
                        print(f"  {run_peak:,.0f} {workload.unit}/s", flush=True)
                    peak = statistics.median(peaks)
                    before = await observed_before(observed, records, units)
                    rate = peak * args.fraction
                    print(f"peak {peak:,.0f} {workload.unit}/s (median of {len(peaks)}); "
                          f"sending at {args.fraction:g} of it: {rate:,.0f} {workload.unit}/s",
                          flush=True)
                job_id = await client.submit(workload.job(args.delivery))
                print(f"paced run: {rate:,.0f} {workload.unit}/s for {args.seconds:g} s, "
                      f"{workload.name}, {args.delivery}", flush=True)
                paced = await paced_run(cluster, client, workload, job_id, rate, args.seconds,
                                        args.sender, args.tick_ms / 1e3, args.in_flight,
                                        args.spread)
                actual = await client.results(job_id)
            lag, held = loop_lags(cluster.run_dir / "logs", paced.t0)
            await asyncio.sleep(latency_job.FLUSH_S * 3)  # the workers' last counts
        sink = latency_job.read_observations(observed, "sink") - before[0]
        source = latency_job.read_observations(observed, "source") - before[1]
    missing, extra, different = compare(actual, workload.reference(paced.records))
    observed_units = sink.total()
    if workload.name == "wordcount":
        checked = observed_units == paced.units and source.total() == paced.records
    else:
        checked = observed_units == paced.records == source.total()
    problems = []
    if missing or extra or different:
        problems.append(f"results differ from the reference: {missing} missing, {extra} "
                        f"unexpected, {different} different")
    if not checked:
        problems.append(f"the sink observed {observed_units:,} records and the source "
                        f"{source.total():,} for {paced.records:,} sent ({paced.units:,} "
                        f"{workload.unit}): some were missed or counted twice")
    rows = interval_rows(paced, sink, source, args.seconds)
    return {
        "workload": workload.name, "unit": workload.unit, "delivery": args.delivery,
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "cores": os.cpu_count(),
        "python": sys.version.split()[0], "peak_per_s": peak, "peak_runs_per_s": peaks,
        "fraction": args.fraction,
        "rate_per_s": rate, "seconds": args.seconds, "sender": args.sender,
        "tick_ms": args.tick_ms,
        "in_flight": args.in_flight, "batch_size": args.batch_size, "spread": args.spread,
        "partitions": workload.partitions or config.cluster.partitions,
        "tracking_flush_s": config.cluster.tracking_flush_s,
        "records": paced.records, "units": paced.units, "send_seconds": paced.send_seconds,
        "wall_s": paced.wall, "cpu_s": paced.cpu, "machine_cores": paced.machine_cores,
        "loop_lag_s": lag, "loop_held_s": held,
        "intervals": rows, "whole": whole_run(sink), "target_ms": TARGET_MS,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", default="wordcount", choices=("wordcount", "taxi"))
    parser.add_argument("--delivery", default="exactly_once",
                        choices=("exactly_once", "at_least_once", "at_most_once"))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="units/s to send (words or records); skips the peak run")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="of the measured peak to send at (default 0.5)")
    parser.add_argument("--peak-units", type=int, default=900_000,
                        help="units of each closed-loop peak run (default 900,000)")
    parser.add_argument("--peak-runs", type=int, default=3,
                        help="closed-loop peak runs; the peak is their median (default 3: "
                        "one run measured 522,614 to 662,976 words/s on the same code)")
    parser.add_argument("--sender", default="producer", choices=SENDERS,
                        help="producer (default): due records go to a gridstream Producer, "
                             "which sends them as its send before is acknowledged; ticks: "
                             "every --tick-ms the due records go to Client.send")
    parser.add_argument("--tick-ms", type=float, default=0.0,
                        help="how often due records are handed over (default 0: 1 ms to "
                             "the producer, 50 ms as ticks)")
    parser.add_argument("--spread", type=int, default=1,
                        help="wordcount: split each tick's lines over this many partitions "
                             "(default 1: a tick's lines go as one batch to the next "
                             "partition in turn, as a sticky partitioner does)")
    parser.add_argument("--partitions", type=int, default=0,
                        help="the job's partitions (default 0: the cluster's, 12)")
    parser.add_argument("--tracking-flush-s", type=float, default=0.0,
                        help="the cluster's cluster.tracking_flush_s (default 0: its "
                             "default, 1 s)")
    parser.add_argument("--in-flight", type=int, default=0,
                        help="most sends in flight at once (default 0: the producer's 1, "
                             "32 as ticks)")
    parser.add_argument("--batch-size", type=int, default=5_000,
                        help="largest batch the client pushes (default 5,000)")
    parser.add_argument("--replot", type=Path, default=None,
                        help="draw the table and plot again from a latency.json; run nothing")
    add_out_argument(parser)
    args = parser.parse_args()
    if args.peak_runs < 1:
        parser.error("--peak-runs must be at least 1 (the peak is the median of the runs)")
    if args.partitions < 0 or args.tracking_flush_s < 0:
        parser.error("--partitions and --tracking-flush-s must be 0 (the default) or more")
    if args.sender == "producer" and args.spread != 1:
        parser.error("--spread is for --sender ticks: the producer's sends go as "
                     "Client.send spreads them")
    if args.tick_ms < 0 or args.in_flight < 0:
        parser.error("--tick-ms and --in-flight must be 0 (the sender's default) or more")
    args.tick_ms = args.tick_ms or SENDERS[args.sender][0]
    args.in_flight = args.in_flight or SENDERS[args.sender][1]
    out = out_dir(args.out)
    if args.replot is not None:
        figures = json.loads(args.replot.read_text())
    else:
        figures = asyncio.run(run(args))
        (out / "latency.json").write_text(json.dumps(figures, indent=1) + "\n")
    text = table(figures)
    print("\n" + text)
    (out / "latency.txt").write_text(text + "\n")
    plot(figures, out / "latency.png")
    if figures["problems"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
