"""Percentiles the latency bench reports: exact ones from per-value counts,
and interpolated ones from a Prometheus histogram's buckets."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def exact_percentile(counts: Mapping[int, int], q: float) -> int:
    """The nearest-rank ``q`` quantile of observations given as ``value ->
    how many``: the smallest value with at least ``ceil(q * n)`` observations
    at or below it (0 when there are none)."""
    total = sum(counts.values())
    if total == 0:
        return 0
    rank = max(1, math.ceil(q * total))
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return value
    raise AssertionError("unreachable: the ranks add up to the total")


def bucket_percentile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float:
    """The ``q`` quantile of a histogram, interpolated linearly inside the
    bucket that holds it, as Prometheus's ``histogram_quantile`` does.
    ``counts`` are per bucket (not cumulative), one more than ``bounds``: the
    last is above every bound, where the quantile is ``math.inf`` (only
    known to exceed ``bounds[-1]``). The first bucket starts at 0. NaN when
    the histogram is empty."""
    if len(counts) != len(bounds) + 1:
        raise ValueError("counts needs one bucket more than bounds (the overflow)")
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    below = 0.0
    for i, n in enumerate(counts):
        if n > 0 and below + n >= rank:
            if i == len(bounds):
                return math.inf
            low = bounds[i - 1] if i else 0.0
            return low + (bounds[i] - low) * (rank - below) / n
        below += n
    return math.inf if counts[-1] else bounds[-1]
