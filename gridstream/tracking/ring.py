"""The 32-bit consistent-hash ring that spreads roots over trackers.

Each tracker sits at ``virtual_positions`` points: the xxh32 (seed 0) of the
UTF-8 text "<trackerId>#1" .. "<trackerId>#N". A root's point is the top 32
bits of its 64-bit id: root ids are already uniform hashes (blake2b of the
record's name, see :func:`gridstream.ids.record_id`), so hashing them again
would only cost time. A root goes to the first tracker point clockwise from
its own (the first point >= it, wrapping past 2**32 - 1 to the smallest).

Adding a tracker takes over only the arcs that end at its new points; removing
one hands only its arcs to the next points clockwise: no other root moves.
With N trackers of V points each, a tracker's share deviates from 1/N by about
1/sqrt(V) relative.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import xxhash

from gridstream.ring import HashRing
from gridstream.tracking.table import U64, Mask, as_u64

Index = npt.NDArray[np.int64]


def position(tracker_id: str, i: int) -> int:
    """The ring point of a tracker's i-th virtual position (1-based)."""
    return int(xxhash.xxh32_intdigest(f"{tracker_id}#{i}".encode(), seed=0))


def tracker_hosts(count: int, workers: Sequence[str], virtual_nodes: int = 100) -> tuple[str, ...]:
    """The worker hosting each of ``count`` trackers: tracker k goes to the
    owner of the key "tracker/<k>" on the worker ring ("" with no workers)."""
    ring = HashRing(list(workers), virtual_nodes)
    return tuple(ring.owner(f"tracker/{k}") if workers else "" for k in range(count))


def ring_point(root_ids: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """A root's ring point: the top 32 bits of its (uniform) 64-bit id."""
    return (as_u64(root_ids) >> np.uint64(32)).astype(np.uint32)


class TrackerRing:
    """Trackers on a 32-bit ring at virtual positions; immutable, and every
    lookup takes a whole array of root ids."""

    def __init__(self, tracker_ids: Sequence[str], virtual_positions: int) -> None:
        trackers = tuple(tracker_ids)
        if not trackers:
            raise ValueError("a tracker ring needs at least one tracker")
        if len(set(trackers)) != len(trackers):
            raise ValueError(f"duplicate tracker ids in {trackers}")
        if virtual_positions < 1:
            raise ValueError("virtual_positions must be >= 1")
        self._trackers = trackers
        self.virtual_positions = virtual_positions
        count = len(trackers) * virtual_positions
        points = np.fromiter(
            (position(t, i) for t in trackers for i in range(1, virtual_positions + 1)),
            dtype=np.uint32, count=count)
        owners = np.repeat(np.arange(len(trackers), dtype=np.int64), virtual_positions)
        # Two trackers on one point (rare) is settled by tracker id, not list order,
        # so every process agrees whatever order it lists the trackers in.
        rank = {t: r for r, t in enumerate(sorted(trackers))}
        ranks = np.asarray([rank[t] for t in trackers], dtype=np.int64)[owners]
        order = np.lexsort((ranks, points))
        self._points = points[order]
        self._owners = owners[order]

    @property
    def trackers(self) -> tuple[str, ...]:
        """The tracker ids, in the order :meth:`owner_index` refers to."""
        return self._trackers

    def owner_index(self, root_ids: npt.ArrayLike) -> Index:
        """For each root, the index in :attr:`trackers` of its tracker."""
        slot = np.searchsorted(self._points, ring_point(root_ids), side="left")
        slot[slot == self._points.size] = 0  # past the last point: wrap around
        return self._owners[slot]

    def owner(self, root_id: int) -> str:
        """The tracker of one root."""
        return self._trackers[int(self.owner_index([root_id])[0])]

    def with_trackers(self, tracker_ids: Sequence[str]) -> TrackerRing:
        """The ring with another set of trackers and the same virtual positions
        (what a resize produces)."""
        return TrackerRing(tracker_ids, self.virtual_positions)

    def moved_mask(self, other: TrackerRing, root_ids: U64) -> Mask:
        """For each root, whether its tracker (by id) differs on ``other``: the
        records a change from this ring to ``other`` must move."""
        where = {t: i for i, t in enumerate(other.trackers)}
        to_other = np.asarray([where.get(t, -1) for t in self._trackers], dtype=np.int64)
        return np.asarray(to_other[self.owner_index(root_ids)] != other.owner_index(root_ids))
