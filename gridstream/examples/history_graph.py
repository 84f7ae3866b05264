"""The history workload as a graph: branches, a union and three sinks, each
judged per key after faults.

The records are those of :mod:`gridstream.examples.history` (``[key,
sequence]``, each key's sequences 1..n sent in order). Task 0 stamps them and
fans out to:

- ``fold`` → sink ``folds``: the order-sensitive fold of the history job
  (records shuffle by key straight from task 0, so each key's order holds),
  judged by :func:`gridstream.checker.check_history`;
- sink ``raw`` (append): every record, once;
- filters ``odd`` and ``even``, whose union is tallied per key (``tally`` →
  sink ``tallies``): count, sum and sum of squares of the sequences, which
  tell a lost or doubled record however the two branches interleave.
"""

from __future__ import annotations

from typing import Any

from gridstream.examples.history import EMPTY, fold
from gridstream.jobspec import JobSpec, Stage

HERE = "gridstream.examples.history_graph"
HISTORY = "gridstream.examples.history"

Tally = list[int]
"""[count, sum of sequences, sum of their squares]."""


def is_odd(record: Any) -> bool:
    """Records with an odd sequence number."""
    return int(record[1]) % 2 == 1


def is_even(record: Any) -> bool:
    """Records with an even sequence number."""
    return int(record[1]) % 2 == 0


def tally(total: Tally, record: Any) -> Tally:
    """Adds one record to a key's tally (order does not matter)."""
    count, s, squares = total
    sequence = int(record[1])
    return [count + 1, s + sequence, squares + sequence * sequence]


def job(partitions: int = 0, window_size: int = 0) -> JobSpec:
    """The graph: stamp, then fold (latest), raw (append) and the tallied
    union of the odd and even records (latest)."""
    return JobSpec(
        name="history-graph",
        partitions=partitions,
        window_size=window_size,
        stages=(
            Stage("stamp", "map", f"{HISTORY}:stamp"),
            Stage("fold", "reduce", f"{HISTORY}:fold", key=f"{HISTORY}:key_of",
                  initial=list(EMPTY)),
            Stage("folds", "sink"),
            Stage("raw", "sink", inputs=("stamp",), mode="append"),
            Stage("odd", "filter", f"{HERE}:is_odd", inputs=("stamp",)),
            Stage("even", "filter", f"{HERE}:is_even", inputs=("stamp",)),
            Stage("tally", "reduce", f"{HERE}:tally", key=f"{HISTORY}:key_of",
                  initial=[0, 0, 0], inputs=("odd", "even")),
            Stage("tallies", "sink"),
        ),
    )


def reference(values: list[Any]) -> dict[str, Any]:
    """The fault-free rows of every sink: ``folds`` and ``tallies`` per key,
    ``raw`` as the sorted list of records."""
    folds: dict[str, Any] = {}
    tallies: dict[str, Any] = {}
    for record in values:
        folds[record[0]] = fold(folds.get(record[0], list(EMPTY)), record)
        tallies[record[0]] = tally(tallies.get(record[0], [0, 0, 0]), record)
    return {"folds": folds, "tallies": tallies, "raw": sorted(values)}
