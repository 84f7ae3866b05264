"""Windowed aggregation: throughput and the latency from an event to its
window's result, next to the keyed reduce's throughput on the same cluster.

Starts a local cluster shaped like ``bench/throughput.py``'s (1 scheduler,
3 workers, 2 state servers, on this machine), then, ``--runs`` rounds of:

- **throughput, closed loop** (submit to drain, as ``bench/throughput.py``):
  ``--records`` trip events of 50 devices, up to 20 s out of order, summed
  per device in 5-minute tumbling windows (``bench/windows_job.py``), every
  window checked against the in-process reference; and the keyed-reduce taxi
  job on as many records, exactly once both;
- **latency, paced**: ``--rate`` events/s (default half the round's windowed
  throughput) for ``--seconds``, each event's time the wall-clock second it
  was due to be sent, 1 s windows, ``max_delay`` 0.1 s. A window's result
  carries the time it came out of the window stage (``stamp_out``), so
  *close to result* is out - end (the watermark's wait for ``max_delay`` and
  for every input partition, then firing), and *event to result* is each
  event's out - t, which adds the rest of its window (half a window on
  average: what windowing costs by design). Windows of the first and last
  two seconds are left out.

Prints medians over the rounds and writes ``windows.txt``, ``windows.json``
and ``windows.png`` to ``--out`` (default ``~/.cache/gridstream-bench/out``).

    .venv/bin/python bench/windows.py [--runs 3] [--records 300000] [--seconds 20]
                                      [--rate EVENTS_PER_S] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import windows_job
from bench.percentiles import exact_percentile
from bench.plots import add_out_argument, bars, out_dir, pyplot
from bench.throughput import timed_run
from gridstream.client import Client
from gridstream.config import Config
from gridstream.examples import trips
from gridstream.local import LocalCluster

JOB_MODULE = "bench.windows_job"
PARTITIONS = 8
MS = 1000.0


async def windowed_run(cluster: LocalCluster, records: int) -> float:
    """Closed-loop records/s of the windowed sums, checked against the
    in-process reference."""
    keys, values = trips.generate(records, drivers_every=0)
    events = [json.loads(v) for v in values]
    closing_keys, closing = trips.closing(PARTITIONS)
    events += [json.loads(v) for v in closing]
    job = windows_job.flow(PARTITIONS, trips.WINDOW_S, trips.JITTER_S, latency=False).job()
    async with Client(cluster.scheduler_address, batch_size=5_000,
                      security=cluster.config.security) as client:
        started = time.monotonic()
        job_id = await client.submit(job)
        await client.send(job_id, events, keys + closing_keys)
        await client.drain(job_id)
        seconds = time.monotonic() - started
        rows = list((await client.results(job_id, sink="windows")).values())
    got = {(r["key"], r["start"]): r["value"][:2] for r in rows if r["start"] < trips.CLOSING_T}
    want = trips.reference(values)
    if len(got) != len(rows) or got != want:  # a window twice, or one wrong
        raise SystemExit("the windowed sums did not match the reference")
    return records / seconds


async def paced_run(cluster: LocalCluster, rate: float, seconds: float) -> dict[str, Any]:
    """Sends ``rate`` events/s for ``seconds`` (each event's time its due
    time) and returns the latencies of the steady windows, in ms."""
    size, delay = 1.0, 0.1
    job = windows_job.flow(PARTITIONS, size, delay, latency=True).job()
    closing_keys, _ = trips.closing(PARTITIONS)
    total = int(rate * seconds)
    async with Client(cluster.scheduler_address, batch_size=1_000,
                      security=cluster.config.security) as client:
        job_id = await client.submit(job)
        t0 = time.time() + 0.5
        sent = 0
        behind = 0.0
        while sent < total:
            now = time.time()
            due = min(total, int((now - t0) * rate) + 1)
            if due > sent:
                keys = [str(1000 + i % 50) for i in range(sent, due)]
                events = [{"device": k, "t": t0 + i / rate, "m": 1}
                          for k, i in zip(keys, range(sent, due), strict=True)]
                await client.send(job_id, events, keys)
                behind = max(behind, time.time() - (t0 + (due - 1) / rate))
                sent = due
            await asyncio.sleep(0.01)
        end = t0 + total / rate
        await client.send(job_id, [{"device": k, "t": end + 10 * size, "m": 0}
                                   for k in closing_keys], closing_keys)
        await client.drain(job_id)
        rows = list((await client.results(job_id, sink="windows")).values())
        late = len(await client.results(job_id, sink="late"))
    steady = [r for r in rows if t0 + 2 <= r["start"] and r["end"] <= end - 2]
    close: Counter[int] = Counter()
    event: Counter[int] = Counter()
    for r in steady:
        wait = r["out"] - r["end"]
        close[round(wait * MS)] += 1
        for ahead, n in r["value"][2].items():
            event[round((wait + int(ahead) * windows_job.STEP_S) * MS)] += n
    return {"rate": rate, "events": sum(event.values()), "windows": len(steady), "late": late,
            "sender_behind_ms": behind * MS,
            **{f"close_p{q}": exact_percentile(close, q / 100) for q in (50, 99)},
            **{f"event_p{q}": exact_percentile(event, q / 100) for q in (50, 99)}}


async def rounds(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = Config()
    config = replace(base, cluster=replace(base.cluster, partitions=PARTITIONS, job_modules=(
        *base.cluster.job_modules, JOB_MODULE)))
    out = []
    with tempfile.TemporaryDirectory(prefix="gridstream-windows-") as run_dir:
        async with LocalCluster(run_dir, config, workers=3, state_servers=2) as cluster:
            for i in range(args.runs):
                windows = await windowed_run(cluster, args.records)
                reduce = (await timed_run(cluster, "taxi", args.records, "exactly_once")).rate
                paced = await paced_run(cluster, args.rate or windows / 2, args.seconds)
                out.append({"windows_per_s": windows, "reduce_per_s": reduce, **paced})
                print(f"  round {i + 1}: " + ", ".join(
                    f"{k} {v:,.0f}" for k, v in out[-1].items()), flush=True)
    return out


def table(f: dict[str, Any]) -> str:
    """The medians as a table."""
    return "\n".join([
        f"windowed aggregation, {f['runs']} rounds (medians), {f['when']}",
        f"{'throughput, closed loop':<34}{'records/s':>12}",
        f"{'  windows (5 min, 50 keys)':<34}{f['windows_per_s']:>12,.0f}",
        f"{'  keyed reduce (taxi)':<34}{f['reduce_per_s']:>12,.0f}",
        f"latency at {f['rate']:,.0f} events/s (1 s windows, max_delay 100 ms), ms:",
        f"{'  window close to result':<34}{'p50':>8}{f['close_p50']:>8.0f}{'p99':>6}"
        f"{f['close_p99']:>8.0f}",
        f"{'  event to its window result':<34}{'p50':>8}{f['event_p50']:>8.0f}{'p99':>6}"
        f"{f['event_p99']:>8.0f}",
        f"  ({f['windows']:,.0f} windows, {f['events']:,.0f} events per round; "
        f"{f['late']:.0f} late; the sender at most {f['sender_behind_ms']:.0f} ms behind)"])


def plot(f: dict[str, Any], path: Path) -> None:
    """Throughput bars beside the keyed reduce's; latency bars, p50 and p99."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    bars(left, ["windows", "keyed reduce"], [f["windows_per_s"], f["reduce_per_s"]],
         ["C0", "C1"])
    left.set_title("throughput, exactly once")
    left.set_ylabel("records/s")
    bars(right, ["close p50", "close p99", "event p50", "event p99"],
         [f["close_p50"], f["close_p99"], f["event_p50"], f["event_p99"]],
         ["C2", "C3", "C2", "C3"], fmt=lambda v: f"{v:.0f} ms")
    right.set_title(f"to the window's result at {f['rate']:,.0f}/s, 1 s windows")
    right.set_ylabel("ms")
    fig.suptitle("Windowed aggregation, 3 workers + 2 state servers on 2 cores (median)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=0.0)
    add_out_argument(parser)
    args = parser.parse_args()
    out = out_dir(args.out)
    runs = asyncio.run(rounds(args))
    figures: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    figures.update(runs=len(runs), when=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    text = table(figures)
    print("\n" + text)
    (out / "windows.txt").write_text(text + "\n")
    (out / "windows.json").write_text(json.dumps({"medians": figures, "runs": runs},
                                                 indent=1) + "\n")
    plot(figures, out / "windows.png")


if __name__ == "__main__":
    main()
