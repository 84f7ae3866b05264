"""The latency bench's output: the table printed and saved as
``latency.txt``, and the plot saved as ``latency.png``, both drawn from the
figures a run returns (``bench/latency.py``), so ``--replot`` draws them
again from a saved ``latency.json`` without running anything."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.machine import IDLE_LIMIT_CORES
from bench.plots import lines, pyplot
from gridstream.metrics import LATENCY_BUCKETS_S

INTERVAL_S = 5
"""Seconds per interval of the table and the plot."""


def table(f: dict[str, Any]) -> str:
    """The run's figures as the text table, with the verdict against the target."""
    unit = f["unit"]
    out = [f"ingest -> sink latency, {f['workload']} {f['delivery']}, {f['when']}, "
           f"{f['cores']} cores, Python {f['python']}"]
    if f["peak_per_s"]:
        runs = f.get("peak_runs_per_s") or [f["peak_per_s"]]
        out.append(f"peak {f['peak_per_s']:,.0f} {unit}/s (closed loop, median of "
                   f"{len(runs)}: {', '.join(f'{r:,.0f}' for r in runs)}); paced at "
                   f"{f['fraction']:g} of it = {f['rate_per_s']:,.0f} {unit}/s for "
                   f"{f['seconds']:g} s")
    else:
        out.append(f"paced at {f['rate_per_s']:,.0f} {unit}/s (given) for {f['seconds']:g} s")
    producer = f.get("sender", "ticks") == "producer"  # runs before 07:20 sent on ticks
    if producer:
        out.append(f"open loop: due records put every {f['tick_ms']:g} ms into a Producer, "
                   f"which sends all that wait as each send is acknowledged (up to "
                   f"{f['in_flight']} in flight), batches of at most {f['batch_size']:,}; "
                   f"sending took {f['send_seconds']:.1f} s, drained at {f['wall_s']:.1f} s")
    else:
        spread = ("" if f["workload"] == "taxi" else
                  f", split over {f['spread']} partition(s)")
        out.append(f"open loop: due records handed to the client every {f['tick_ms']:g} ms"
                   f"{spread}, up to {f['in_flight']} sends in flight, batches of at most "
                   f"{f['batch_size']:,}; sending took {f['send_seconds']:.1f} s, drained at "
                   f"{f['wall_s']:.1f} s")
    if "partitions" in f:  # runs before these were recorded had 12 and 1 s
        out.append(f"job of {f['partitions']} partitions, cluster.tracking_flush_s "
                   f"{f['tracking_flush_s']:g} s")
    out.append("")
    out.append(f"{'interval':<10}{'sent/s':>10}{'sink/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
               f"{'p99.9 ms':>10}{'max ms':>9}{'send p99':>10}{'source p99':>12}{'hist. p99':>11}")

    def ms(value: float) -> str:
        if math.isinf(value):
            return f">{LATENCY_BUCKETS_S[-1] * 1e3:,.0f}"
        return "-" if math.isnan(value) else f"{value:,.1f}"

    for row in f["intervals"]:
        out.append(f"{row['start_s']:>3}-{row['start_s'] + INTERVAL_S:<3}s  "
                   f"{row['sent_per_s']:>10,.0f}{row.get('sink_per_s', math.nan):>10,.0f}"
                   f"{ms(row['p50_ms']):>9}{ms(row['p99_ms']):>9}{ms(row['p99.9_ms']):>10}"
                   f"{ms(row['max_ms']):>9}{ms(row['send_p99_ms']):>10}"
                   f"{ms(row['source_p99_ms']):>12}"
                   f"{ms(row.get('histogram_p99_ms', math.nan)):>11}")
    w = f["whole"]
    out.append(f"{'whole run':<10}{f['units'] / f['seconds']:>10,.0f}{'':>10}"
               f"{ms(w['p50_ms']):>9}{ms(w['p99_ms']):>9}{ms(w['p99.9_ms']):>10}"
               f"{ms(w['max_ms']):>9}   mean {w['mean_ms']:,.1f} ms")
    worst = max(f["intervals"], key=lambda r: r["p99_ms"])
    held = all(r["p99_ms"] <= f["target_ms"] for r in f["intervals"])
    out.append("")
    out.append(f"target p99 <= {f['target_ms']:g} ms in every {INTERVAL_S} s interval: "
               f"{'MET' if held else 'NOT MET'} (worst interval {worst['start_s']}-"
               f"{worst['start_s'] + INTERVAL_S} s: p99 {worst['p99_ms']:,.1f} ms; whole run "
               f"p99 {w['p99_ms']:,.1f} ms)")
    cpu = f["cpu_s"]
    busy = sum(cpu.values()) / f["wall_s"]
    out.append(f"CPU over the run: {busy:.2f} of {f['cores']} cores busy ("
               + ", ".join(f"{role} {seconds / f['wall_s']:.2f}"
                           for role, seconds in sorted(cpu.items()))
               + f"); worst worker event-loop lag {f['loop_lag_s'] * 1e3:,.0f} ms "
               f"({f['loop_held_s'] * 1e3:,.0f} ms of it computing)")
    if "machine_cores" in f:  # runs before 2026-12-05 13:10 did not record it
        other = f["machine_cores"] - busy
        out.append(f"the whole machine: {f['machine_cores']:.2f} cores busy, "
                   f"{other:.2f} of them outside the cluster and this client"
                   + (f"; !!! more than {IDLE_LIMIT_CORES:g}: another load ran beside "
                      "the bench, and these figures measure it too"
                      if other > IDLE_LIMIT_CORES else ""))
    waits = ("the wait for the producer's send before" if producer
             else "the tick's linger and any wait for a send slot")
    out.append(f"sent/s: {unit} due in the interval that reached the sink, per second; "
               "p50 .. max: exact (0.1 ms steps) over those records, from the time each was "
               "due to be sent to the sink task processing it; send p99: from due to handed "
               "to Client.send (" + waits + "); source p99: from due to the first task "
               "processing it.")
    out.append("sink/s and hist. p99: the workers' gridstream_ingest_to_sink_seconds scraped "
               "every interval (by sink time), from the client's encoding of a push, p99 "
               f"interpolated in buckets bounded at {', '.join(f'{b * 1e3:g}' for b in LATENCY_BUCKETS_S)} ms.")  # noqa: E501
    for problem in f["problems"]:
        out.append(f"!!! {problem}")
    return "\n".join(out)


def plot(f: dict[str, Any], path: Path) -> None:
    """Percentiles per interval with the target; the rates beside them."""
    plt = pyplot()
    rows = f["intervals"]
    x = [r["start_s"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2),
                                      gridspec_kw={"width_ratios": [2, 1]})
    lines(left, x, [("p50", [r["p50_ms"] for r in rows], "C0"),
                    ("p99", [r["p99_ms"] for r in rows], "C1"),
                    ("p99.9", [r["p99.9_ms"] for r in rows], "C3")],
          references=[(f"target p99 {f['target_ms']:g} ms", f["target_ms"], "C2")])
    left.set_xlabel(f"interval start (s), each {INTERVAL_S} s")
    left.set_ylabel("ms, due to be sent -> sink task")
    left.set_title("latency per interval (exact)", loc="left", fontsize=10)
    lines(right, x, [("sent", [r["sent_per_s"] for r in rows], "C0"),
                     ("at sink", [r.get("sink_per_s", math.nan) for r in rows], "C1")],
          references=[("paced rate", f["rate_per_s"], "C7")]
          + ([("peak", f["peak_per_s"], "C3")] if f["peak_per_s"] else []))
    right.set_xlabel("interval start (s)")
    right.set_ylabel(f"{f['unit']}/s")
    right.set_title("rate per interval", loc="left", fontsize=10)
    fig.suptitle(f"{f['workload']} {f['delivery']}, 3 workers + 2 state servers on "
                 f"{f['cores']} cores, {f['when']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")
