"""Map-side combining: a reduce whose partial results merge is folded per
batch on the sending side of its shuffle, so the shuffle, the replicas and
the reduce handle one record per key per batch instead of one per record.

Wordcount's batches of 50,000 words hold a few thousand distinct words: the
shuffle into its ``count`` sends each word once per batch with the number of
times it occurred, and the reduce adds those numbers. The result rows are the
same as record by record.

Combining applies only where no one can tell the difference:

- the reduce's function is one whose partials gridstream knows how to merge
  (:data:`COMBINERS`, keyed by the function's import path);
- the reduce's task is the reduce followed by a ``latest`` sink and nothing
  else: a latest sink keeps one row per key per window, so the per-record
  running values the combined reduce no longer produces were never visible;
- the partials are exact (counts are integers: no rounding changes with the
  grouping).

The combining is deterministic (the same batch gives the same partials, in
the order of each key's first record), so a replay sends the same segments
with the same sequences and the idempotence rule holds as it did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gridstream.jobspec import Stage

Partials = Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]]
"""(keys, values) of one batch -> (each key once, its partial result)."""


def count_partials(keys: list[Any], _values: list[Any]) -> tuple[list[Any], list[Any]]:
    """How many records each key has in the batch (one C pass: ``Counter``)."""
    counts = Counter(keys)
    return list(counts), list(counts.values())


@dataclass(frozen=True)
class Combiner:
    """How one reduce function combines: the partials of a batch, and the
    reduce function that folds a partial into the accumulator."""

    partials: Partials
    merge: str
    """Import path of the reduce function that adds a partial to an accumulator."""


COMBINERS: dict[str, Combiner] = {
    "gridstream.builtins:count": Combiner(count_partials, "gridstream.builtins:sum_values"),
}
"""Reduce functions that combine, by import path."""


def combiner_of(stages: Sequence[Stage]) -> Combiner | None:
    """The combiner of a task's stages: one when they are a combinable reduce
    into a latest sink (see the module docstring), else None."""
    if len(stages) != 2:
        return None
    reduce, sink = stages
    if reduce.kind != "reduce" or reduce.params or sink.kind != "sink" or sink.mode != "latest":
        return None
    return COMBINERS.get(reduce.function)


def merging(stages: Sequence[Stage]) -> tuple[Stage, ...]:
    """A combined task's stages as it runs them: the reduce folds partials
    with the combiner's merge function (unchanged for any other task)."""
    combiner = combiner_of(stages)
    if combiner is None:
        return tuple(stages)
    return (replace(stages[0], function=combiner.merge), *stages[1:])
