"""The history checker: tells loss, duplication and reordering apart, per key.

Run the order-sensitive job of :mod:`gridstream.examples.history` (each key's
records carry sequences 1..n, sent in order), then hand its results and the
number of records sent per key to :func:`check_history`. A run is exactly
once only if every key's summary equals the fault-free fold of 1..n; anything
else is classified:

- **lost**: the key's sequences are strictly increasing but fewer than sent
  (records missing, none repeated), or the key is absent;
- **duplicated**: more records were applied than sent;
- **reordered**: as many applied as sent, with the same sum and sum of
  squares as 1..n (the same records), but not in increasing order;
- **corrupt**: any other summary (a mix of the above, or a bad value).

Users can run it against their own cluster (``gridstream chaos --workload
history``); the project's chaos tests use it under every fault sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gridstream.examples.history_graph import reference


@dataclass
class HistoryVerdict:
    """Per-key findings of one run; ``ok`` only when every key is exact."""

    keys: int = 0
    exact: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    """key -> records missing."""
    duplicated: dict[str, int] = field(default_factory=dict)
    """key -> records applied more than once (at least)."""
    reordered: dict[str, int] = field(default_factory=dict)
    """key -> inversions seen."""
    corrupt: dict[str, Any] = field(default_factory=dict)
    """key -> the summary that fits none of the above."""
    unexpected: list[str] = field(default_factory=list)
    """Keys in the results that were never sent."""

    @property
    def ok(self) -> bool:
        """Zero loss, zero duplicates, zero reorders, nothing unexpected."""
        return not (self.lost or self.duplicated or self.reordered or self.corrupt
                    or self.unexpected)

    def summary(self) -> str:
        """One line for logs, reports and assertion messages."""
        if self.ok:
            return f"history: all {self.keys} keys exact (no loss, duplicate or reorder)"
        parts = [
            f"{len(self.lost)} keys lost {sum(self.lost.values())} records",
            f"{len(self.duplicated)} keys duplicated {sum(self.duplicated.values())}",
            f"{len(self.reordered)} keys reordered",
            f"{len(self.corrupt)} keys corrupt",
            f"{len(self.unexpected)} unexpected keys",
        ]
        example = next(iter({**self.lost, **self.duplicated, **self.reordered,
                             **self.corrupt}.items()), None)
        return (f"history: {self.exact} of {self.keys} keys exact; " + ", ".join(parts)
                + (f" (e.g. {example[0]}: {example[1]})" if example else ""))


def _expected(n: int) -> list[int]:
    return [n, n, 0, n * (n + 1) // 2, n * (n + 1) * (2 * n + 1) // 6]


def check_history(actual: dict[str, Any], sent: dict[str, int]) -> HistoryVerdict:
    """Compares a history job's results with the records sent per key."""
    verdict = HistoryVerdict(keys=len(sent))
    verdict.unexpected = sorted(k for k in actual if k not in sent)
    for key, n in sent.items():
        summary = actual.get(key)
        if summary is None:
            verdict.lost[key] = n
            continue
        try:
            count, last, inversions, total, squares = (int(x) for x in summary)
        except (TypeError, ValueError):
            verdict.corrupt[key] = summary
            continue
        expected = _expected(n)
        if [count, last, inversions, total, squares] == expected:
            verdict.exact += 1
        elif inversions == 0 and count < n and last <= n:
            verdict.lost[key] = n - count
        elif count > n:
            verdict.duplicated[key] = count - n
        elif count == n and total == expected[3] and squares == expected[4]:
            verdict.reordered[key] = inversions
        else:
            verdict.corrupt[key] = summary
    return verdict


def check_graph_branches(tallies: dict[str, Any], raw: list[Any],
                         values: list[Any]) -> list[str]:
    """The other branches of the graph history job
    (:mod:`gridstream.examples.history_graph`), compared per key with the
    fault-free reference: every key's tally of the union of its odd and even
    records, and every record once in the append sink. Returns one line per
    problem (empty when both are exact); the fold branch is judged by
    :func:`check_history`."""
    expected = reference(values)
    problems: list[str] = []
    wrong = {k: (tallies.get(k), want) for k, want in expected["tallies"].items()
             if tallies.get(k) != want}
    extra = sorted(set(tallies) - set(expected["tallies"]))
    if wrong or extra:
        example = next(iter(wrong.items()), None)
        problems.append(f"tallies: {len(wrong)} of {len(expected['tallies'])} keys differ "
                        f"from the reference, {len(extra)} unexpected"
                        + (f" (e.g. {example[0]}: {example[1][0]} instead of {example[1][1]})"
                           if example else ""))
    got = sorted(raw)
    if got != expected["raw"]:
        counts: dict[str, int] = {}
        for record in got:
            counts[str(record)] = counts.get(str(record), 0) + 1
        doubled = sum(1 for n in counts.values() if n > 1)
        missing = sum(1 for r in expected["raw"] if str(r) not in counts)
        problems.append(f"raw: {len(got)} records instead of {len(expected['raw'])} "
                        f"({missing} missing, {doubled} more than once)")
    return problems
