"""Where tuple-tracking state lives, and its wire form: which tracker holds
a root and which worker hosts each tracker at one epoch (both from the routing
table), and root ids and values as packed little-endian uint64s. Shared by the
trackers, the tasks' reporters and the answers workers give to rebuilds."""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from gridstream.routing import RoutingView
from gridstream.tracking import TrackerRing
from gridstream.tracking.ring import tracker_hosts

U64 = npt.NDArray[np.uint64]


def pack(values: U64 | list[int]) -> bytes:
    """Little-endian uint64s, the wire form of root ids and values."""
    return np.asarray(values, dtype="<u8").tobytes()


def unpack(data: bytes) -> U64:
    """The inverse of :func:`pack`."""
    return np.frombuffer(data, dtype="<u8").astype(np.uint64)


@dataclass(frozen=True)
class TrackerLayout:
    """Which tracker holds a root and which worker hosts a tracker, at one epoch."""

    count: int
    ring: TrackerRing
    hosts: tuple[str, ...]
    host_incarnations: tuple[str, ...] = ()
    """The incarnation of each host: a host that restarted (even faster than
    the detector) has lost its tables, which is a move like any other."""

    @classmethod
    def from_routing(cls, routing: RoutingView) -> TrackerLayout:
        """The layout the routing table describes (built once per distinct
        table: every report and every tick asks for it)."""
        table = routing.table
        count = max(1, table.tracker_count or 1)
        positions = max(1, table.tracker_virtual_positions or 64)
        layout = _layout(count, positions, tuple(routing.workers))
        incarnations = tuple(routing.incarnations.get(h, "") for h in layout.hosts)
        return replace(layout, host_incarnations=incarnations)

    def trackers_of(self, roots: U64) -> npt.NDArray[np.int64]:
        """Tracker index of each root."""
        return np.asarray(self.ring.owner_index(roots), dtype=np.int64)

    def same_hosts(self, other: TrackerLayout) -> bool:
        """Whether ``other`` places every root on the same tracker and host
        process (a host that restarted under its own name is another one)."""
        return (self.count == other.count and self.hosts == other.hosts
                and self.host_incarnations == other.host_incarnations)

    def moved(self, new: TrackerLayout, pending: Collection[int]) -> set[int]:
        """The roots of ``pending`` whose tracker, or its host process, is not
        the same in ``new``: their new trackers must rebuild them."""
        roots = np.fromiter(pending, dtype=np.uint64, count=len(pending))
        before, after = self.trackers_of(roots), new.trackers_of(roots)
        moved = (before != after) | (
            np.asarray(self.hosts, dtype=object)[before]
            != np.asarray(new.hosts, dtype=object)[after]) | (
            np.asarray(self.host_incarnations, dtype=object)[before]
            != np.asarray(new.host_incarnations, dtype=object)[after])
        return {int(r) for r in roots[moved]}


@functools.lru_cache(maxsize=16)
def _layout(count: int, positions: int, workers: tuple[str, ...]) -> TrackerLayout:
    ring = TrackerRing([f"tracker-{k}" for k in range(count)], positions)
    return TrackerLayout(count, ring, tracker_hosts(count, workers))


__all__ = ["TrackerLayout", "pack", "unpack"]
