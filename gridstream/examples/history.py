"""The history workload: an order-sensitive job whose result tells, per key,
whether records were lost, applied twice or applied out of order.

Every input record is ``[key, sequence]``, with each key's sequences
1, 2, 3, ... sent in order (keys interleaved at random). Task 0 stamps each
record (a map); the shuffle keys it by its key; task 1 folds every key's
sequence numbers into a small summary (:func:`fold`), which the sink keeps.
The summary is order-sensitive: it counts *inversions* (a sequence at or
below the one before it), so a replay applied twice or a record overtaking
another shows up even when counts happen to agree. See
:mod:`gridstream.checker` for the verdict.
"""

from __future__ import annotations

import random
from typing import Any

from gridstream.jobspec import JobSpec, Stage

Summary = list[int]
"""[count, last sequence, inversions, sum of sequences, sum of their squares]."""

EMPTY: Summary = [0, 0, 0, 0, 0]


def stamp(record: Any) -> Any:
    """Task 0: passes the record on unchanged (a real stage, so the record
    crosses a shuffle before it is folded)."""
    return record


def key_of(record: Any) -> Any:
    """The shuffle key: the record's key."""
    return record[0]


def fold(summary: Summary, record: Any) -> Summary:
    """Folds one sequence number into a key's summary (a new list each time:
    operators replace accumulators, never mutate them)."""
    count, last, inversions, total, squares = summary
    sequence = int(record[1])
    if sequence <= last:
        inversions += 1
    return [count + 1, sequence, inversions, total + sequence, squares + sequence * sequence]


def job(partitions: int = 0, window_size: int = 0, delivery: str = "exactly_once",
        prepartitioned: bool = False) -> JobSpec:
    """The history job: stamp, shuffle by key, fold, keep the latest summary
    per key. ``prepartitioned``: records are sent keyed by their key, so the
    fold runs in stamp's task with no shuffle (one task instead of two)."""
    return JobSpec(
        name="history",
        partitions=partitions,
        window_size=window_size,
        delivery=delivery,
        stages=(
            Stage("stamp", "map", "gridstream.examples.history:stamp"),
            Stage("fold", "reduce", "gridstream.examples.history:fold",
                  key="gridstream.examples.history:key_of", initial=list(EMPTY),
                  prepartitioned=prepartitioned),
            Stage("store", "sink"),
        ),
    )


def generate(records: int, keys: int = 200, seed: int = 0) -> tuple[list[str], list[Any]]:
    """``records`` records over ``keys`` keys: (send keys, values). Each key's
    sequences run 1, 2, 3, ... in send order; keys are interleaved at random."""
    rng = random.Random(seed)
    names = [f"k{i:05d}" for i in range(keys)]
    next_sequence = dict.fromkeys(names, 0)
    out_keys: list[str] = []
    values: list[Any] = []
    for _ in range(records):
        key = names[rng.randrange(keys)]
        next_sequence[key] += 1
        out_keys.append(key)
        values.append([key, next_sequence[key]])
    return out_keys, values


def sent_counts(values: list[Any]) -> dict[str, int]:
    """Records sent per key (the reference the checker compares with)."""
    counts: dict[str, int] = {}
    for key, _ in values:
        counts[key] = counts.get(key, 0) + 1
    return counts


def reference(values: list[Any]) -> dict[str, Summary]:
    """The fault-free result: every key's sequences folded once, in order."""
    out: dict[str, Summary] = {}
    for record in values:
        out[record[0]] = fold(out.get(record[0], list(EMPTY)), record)
    return out
