"""NaiveTracker: Storm's acker as usually written, one Python dict per
generation (a RotatingMap of root id -> checkValue).

It has the same semantics as :class:`~gridstream.tracking.TrackingTable`
(same combining of one call's values, same rotation schedule, so the same
roots complete and fail), which makes it the reference in the property tests
and the baseline of ``bench/tracking.py``: clear, but a Python loop per report
and well over 100 bytes per root.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gridstream.tracking.table import U64, Mask, RotationClock, as_u64


def _ids(values: list[int]) -> U64:
    return np.asarray(values, dtype=np.uint64)


class NaiveTracker:
    """The plain-dict tracker: the reference the compact table must agree with
    and the baseline it is measured against."""

    def __init__(self, timeout_s: float, generations: int = 3, now: float | None = None) -> None:
        self._clock = RotationClock(timeout_s, generations,
                                    time.monotonic() if now is None else now)
        self._generations: list[dict[int, int]] = [{} for _ in range(generations)]
        self._overdue: list[int] = []

    def __len__(self) -> int:
        return sum(len(g) for g in self._generations)

    def xor(self, root_ids: npt.ArrayLike, values: npt.ArrayLike,
            now: float | None = None) -> U64:
        """As :meth:`TrackingTable.xor`, one root at a time."""
        if now is not None:
            self._rotate(now)
        combined: dict[int, int] = {}
        for root, value in zip(as_u64(root_ids).tolist(), as_u64(values).tolist(), strict=True):
            combined[root] = combined.get(root, 0) ^ value
        completed: list[int] = []
        for root, value in combined.items():
            for generation in self._generations:
                if root in generation:
                    check = generation[root] ^ value
                    if check:
                        generation[root] = check
                    else:
                        del generation[root]
                        completed.append(root)
                    break
            else:
                if value:
                    self._generations[-1][root] = value
                else:
                    completed.append(root)
        return _ids(completed)

    def expire(self, now: float) -> U64:
        """As :meth:`TrackingTable.expire`."""
        self._rotate(now)
        failed, self._overdue = self._overdue, []
        return _ids(failed)

    def _rotate(self, now: float) -> None:
        for _ in range(self._clock.due(now)):
            self._overdue.extend(self._generations.pop(0))
            self._generations.append({})

    def _find(self, root: int) -> dict[int, int] | None:
        for generation in self._generations:
            if root in generation:
                return generation
        return None

    def contains(self, root_ids: npt.ArrayLike) -> Mask:
        """As :meth:`TrackingTable.contains`."""
        return np.asarray([self._find(r) is not None for r in as_u64(root_ids).tolist()],
                          dtype=bool)

    def values_of(self, root_ids: npt.ArrayLike) -> U64:
        """As :meth:`TrackingTable.values_of`."""
        out = []
        for root in as_u64(root_ids).tolist():
            generation = self._find(root)
            out.append(0 if generation is None else generation[root])
        return _ids(out)

    def items(self) -> tuple[U64, U64]:
        """As :meth:`TrackingTable.items`."""
        pairs = [(r, v) for g in self._generations for r, v in g.items()]
        return _ids([r for r, _ in pairs]), _ids([v for _, v in pairs])

    def pending_ids(self) -> U64:
        """As :meth:`TrackingTable.pending_ids`."""
        return _ids([r for g in self._generations for r in g])

    def remove(self, root_ids: npt.ArrayLike) -> int:
        """As :meth:`TrackingTable.remove`."""
        removed = 0
        for root in set(as_u64(root_ids).tolist()):
            generation = self._find(root)
            if generation is not None:
                del generation[root]
                removed += 1
        return removed

    def export(self, select: Callable[[U64], Mask]) -> tuple[U64, U64]:
        """As :meth:`TrackingTable.export`."""
        ids, values = self.items()
        chosen = np.asarray(select(ids), dtype=bool)
        self.remove(ids[chosen])
        return ids[chosen], values[chosen]

    def import_entries(self, root_ids: npt.ArrayLike, values: npt.ArrayLike) -> U64:
        """As :meth:`TrackingTable.import_entries`."""
        return self.xor(root_ids, values)
