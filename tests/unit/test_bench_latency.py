"""The latency bench's arithmetic: exact percentiles from counted
observations, percentiles interpolated from histogram buckets (as
Prometheus's histogram_quantile does), and the workers' observation files
read back per interval."""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import latency_job
from bench.latency import steps_between
from bench.latency_report import table
from bench.percentiles import bucket_percentile, exact_percentile


def nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_exact_percentiles_equal_the_nearest_rank_of_the_sorted_values() -> None:
    rng = random.Random(3)
    for _ in range(200):
        values = [int(rng.expovariate(0.01)) for _ in range(rng.randint(1, 3_000))]
        counts = Counter(values)
        for q in (0.0, 0.5, 0.9, 0.99, 0.999, 1.0):
            assert exact_percentile(counts, q) == nearest_rank(values, q), (q, len(values))
    assert exact_percentile({}, 0.99) == 0


def test_bucket_percentiles_interpolate_inside_the_bucket() -> None:
    bounds = (0.005, 0.01, 0.025, 0.05, 0.1)
    # 100 observations: 40 in (0, 5 ms], 50 in (10, 25 ms], 9 in (50, 100 ms], 1 above.
    counts = [40.0, 0.0, 50.0, 0.0, 9.0, 1.0]
    assert bucket_percentile(bounds, counts, 0.2) == pytest.approx(0.0025)
    assert bucket_percentile(bounds, counts, 0.4) == pytest.approx(0.005)
    assert bucket_percentile(bounds, counts, 0.5) == pytest.approx(0.01 + 0.015 * 10 / 50)
    assert bucket_percentile(bounds, counts, 0.9) == pytest.approx(0.025)
    assert bucket_percentile(bounds, counts, 0.95) == pytest.approx(0.05 + 0.05 * 5 / 9)
    assert bucket_percentile(bounds, counts, 0.99) == pytest.approx(0.1)
    assert bucket_percentile(bounds, counts, 0.999) == math.inf  # only known to be > 100 ms
    assert math.isnan(bucket_percentile(bounds, [0.0] * 6, 0.99))
    with pytest.raises(ValueError):
        bucket_percentile(bounds, counts[:-1], 0.5)


def test_bucket_percentiles_bracket_the_exact_ones() -> None:
    rng = random.Random(7)
    bounds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
    values = [rng.lognormvariate(-3.5, 0.8) for _ in range(20_000)]
    counts = [0.0] * (len(bounds) + 1)
    for v in values:
        counts[sum(v > b for b in bounds)] += 1
    for q in (0.5, 0.99):
        exact = sorted(values)[math.ceil(q * len(values)) - 1]
        i = sum(exact > b for b in bounds)
        low, high = (bounds[i - 1] if i else 0.0), bounds[i]
        assert low <= bucket_percentile(bounds, counts, q) <= high


def test_observations_are_counted_by_due_second_and_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(latency_job.ENV, str(tmp_path))
    monkeypatch.setattr(latency_job, "FLUSH_S", 0.01)
    now = 1_800_000_000.0
    with contextlib.closing(latency_job.Recorder("sink")) as recorder:
        # 15.625 ms twice (due in the second before), 1.5 s once, and an unstamped record.
        recorder.observe([now - 0.015625, now - 0.015625, now - 1.5, 0.0], now=now)
        expected = {(1_799_999_999, 156): 2, (1_799_999_998, 15_000): 1}
        deadline = time.monotonic() + 10
        while latency_job.read_observations(tmp_path, "sink").total() < 3:
            assert time.monotonic() < deadline, "the recorder's thread wrote nothing"
            time.sleep(0.01)
        flushing = recorder._thread
    assert flushing is not None and not flushing.is_alive()  # closed: no thread outlives it
    observed = latency_job.read_observations(tmp_path, "sink")
    assert observed == expected
    assert steps_between(observed, 1_799_999_999, 1_800_000_004) == {156: 2}
    assert steps_between(observed, 0, 2**62) == {156: 2, 15_000: 1}


@pytest.mark.parametrize("spread_s", [0.02, 1.5, 30.0, 5_000.0])
def test_a_large_batch_is_counted_as_record_by_record(spread_s: float) -> None:
    """Batches above SMALL_BATCH take the vectorised path (bincount per
    second, or a sort when spread out); its counts equal the per-record
    loop's, across second boundaries, unstamped records and future stamps."""
    rng = random.Random(7)
    now = 1_800_000_000.25
    for _ in range(50):
        count = rng.choice([latency_job.SMALL_BATCH + 1, 400, 5_000])
        start = now - rng.choice([0.01, 0.3, 2.0]) - spread_s
        stamps = [0.0 if rng.random() < 0.05 else start + rng.random() * spread_s * 1.2
                  for _ in range(count)]
        vectorised = latency_job.Recorder("sink")
        vectorised.count(stamps, now=now)
        one_by_one = latency_job.Recorder("source")
        for stamp in stamps:
            one_by_one.count([stamp], now=now)
        assert vectorised._counts == one_by_one._counts
        assert vectorised._counts.total() == sum(1 for s in stamps if s > 0)


def figures_of(sender: str | None) -> dict[str, object]:
    """A run's figures as ``bench/latency.py`` writes them (one interval);
    without ``sender`` as runs before the producer wrote them."""
    interval = {"start_s": 0, "sent_per_s": 1000.0, "p50_ms": 10.0, "p99_ms": 40.0,
                "p99.9_ms": 45.0, "max_ms": 48.0, "source_p99_ms": 20.0, "send_p99_ms": 5.0,
                "sink_per_s": 1000.0, "histogram_p99_ms": 42.0}
    figures: dict[str, object] = {
        "workload": "wordcount", "unit": "words", "delivery": "exactly_once",
        "when": "2026-12-05 07:36 UTC", "cores": 2, "python": "3.11.7", "peak_per_s": 0.0,
        "fraction": 0.5, "rate_per_s": 1000.0, "seconds": 5.0, "tick_ms": 50.0,
        "in_flight": 32, "batch_size": 5000, "spread": 1, "partitions": 3,
        "tracking_flush_s": 1.0, "records": 500, "units": 5000, "send_seconds": 5.0,
        "wall_s": 5.1,
        "cpu_s": {"worker": 1.0}, "loop_lag_s": 0.0, "loop_held_s": 0.0,
        "intervals": [interval], "whole": {"p50_ms": 10.0, "p99_ms": 40.0, "p99.9_ms": 45.0,
                                           "max_ms": 48.0, "mean_ms": 12.0},
        "target_ms": 50.0, "problems": []}
    if sender == "producer":
        figures.update(sender=sender, tick_ms=1.0, in_flight=1)
    elif sender is not None:
        figures["sender"] = sender
    return figures


def test_the_table_says_how_the_records_were_sent() -> None:
    producer = table(figures_of("producer"))
    assert "put every 1 ms into a Producer" in producer
    assert "up to 1 in flight" in producer
    assert "the wait for the producer's send before" in producer
    for older in (table(figures_of(None)), table(figures_of("ticks"))):
        assert "handed to the client every 50 ms, split over 1 partition(s)" in older
        assert "the tick's linger" in older and "Producer" not in older


def test_the_table_says_when_another_load_ran_beside_the_bench() -> None:
    figures = figures_of("producer")  # the cluster and client: 1.0 CPU-s over 5.1 s
    own = 1.0 / 5.1
    figures["machine_cores"] = own + 0.05
    quiet = table(figures)
    assert "0.05 of them outside the cluster and this client" in quiet
    assert "!!!" not in quiet
    figures["machine_cores"] = own + 0.9
    busy = table(figures)
    assert "0.90 of them outside the cluster and this client; !!! more than 0.25" in busy
    assert "the whole machine" not in table(figures_of(None))  # not recorded then
