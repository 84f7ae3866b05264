"""TrackingTable: root id -> 64-bit checkValue in 16 bytes per in-flight root.

A Python dict of int to int costs well over 100 bytes per root (the dict slot
plus two int objects). Here a root is one uint64 key and one uint64 value in
numpy arrays and nothing else, so a compacted table holds exactly 16 bytes per
in-flight root:

- **Sorted runs (log-structured).** Each generation keeps a few sorted runs of
  exactly sized arrays, oldest and largest first. New roots of one call become
  a new small run; a run is merged into the one before it once it holds more
  than ``1/RUN_RATIO`` of that one's entries, so runs grow geometrically, an
  insert costs amortized O(log n) copies and lookups are a ``searchsorted`` per
  run (a handful of runs).
- **Zero means gone.** A live root never has checkValue 0 (zero is
  completion), so a completed or removed root stays as a zero in place and is
  dropped at the next merge, or when more than ``1/DEAD_FRACTION`` of its run
  is dead; :meth:`TrackingTable.compact` drops them all at once.
- **Timeouts without timestamps.** Like Storm's RotatingMap, roots live in G
  generations and new roots go to the newest one. Every ``timeout/(G-1)``
  seconds the oldest generation is dropped and its live roots are the failed
  ones, so a root fails between ``timeout`` and ``timeout * G/(G-1)`` after it
  was created (provided the clock is advanced, by :meth:`TrackingTable.expire`
  or by ``now=`` on :meth:`TrackingTable.xor`, at least once per period). An
  update does not refresh a root's age: the timeout counts from creation.

Every operation takes whole arrays (a batch of reports), never one root in a
Python loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
Mask = npt.NDArray[np.bool_]
Selector = Callable[[U64], Mask]

RUN_RATIO = 4
"""A run is merged into the run before it once it holds more than a quarter of
that run's live entries: fewer runs to search, at the cost of more copying."""

DEAD_FRACTION = 8
"""A run is rewritten without its zeros once more than an eighth of its entries
are dead, which bounds the table at 16 * 8/7 (about 18.3) bytes per in-flight
root between compactions."""


def empty() -> U64:
    """A new empty id or value array."""
    return np.zeros(0, dtype=np.uint64)


def as_u64(data: npt.ArrayLike) -> U64:
    """A flat uint64 array of ids or values, so callers may pass lists."""
    return np.ascontiguousarray(np.asarray(data, dtype=np.uint64).ravel())


def combine(ids: U64, values: U64) -> tuple[U64, U64]:
    """Sorted unique ids with the XOR of each id's values: several reports for
    one root in one call act as one report."""
    if ids.shape != values.shape:
        raise ValueError(f"{ids.size} ids but {values.size} values")
    if ids.size == 0:
        return empty(), empty()
    order = np.argsort(ids, kind="stable")
    ids, values = ids[order], values[order]
    first = np.empty(ids.size, dtype=bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return ids[starts], np.bitwise_xor.reduceat(values, starts)


def _concat(parts: list[U64]) -> U64:
    return np.concatenate(parts) if parts else empty()


class RotationClock:
    """When the generations of a tracker rotate; shared by the compact and the
    naive tracker so both expire exactly the same roots."""

    def __init__(self, timeout_s: float, generations: int, now: float) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        if generations < 2:
            raise ValueError("generations must be >= 2")
        self.timeout_s = timeout_s
        self.generations = generations
        self.period_s = timeout_s / (generations - 1)
        self.next_at = now + self.period_s

    def due(self, now: float) -> int:
        """How many rotations to perform at ``now`` (at most ``generations``:
        more would only drop empty generations); advances the schedule."""
        if now < self.next_at:
            return 0
        steps = math.floor((now - self.next_at) / self.period_s) + 1
        self.next_at += steps * self.period_s
        while self.next_at <= now:  # floating-point rounding
            self.next_at += self.period_s
            steps += 1
        return min(steps, self.generations)


class _Run:
    """One sorted run: unique keys, their values, and how many values are 0."""

    __slots__ = ("dead", "keys", "values")

    def __init__(self, keys: U64, values: U64) -> None:
        self.keys = keys
        self.values = values
        self.dead = 0

    @property
    def live(self) -> int:
        return int(self.keys.size) - self.dead

    def locate(self, ids: U64) -> tuple[Mask, npt.NDArray[np.intp]]:
        """For each id: whether it is live here, and its position if so."""
        pos = np.searchsorted(self.keys, ids)
        np.minimum(pos, self.keys.size - 1, out=pos)
        hit = self.keys[pos] == ids
        hit &= self.values[pos] != 0
        return hit, pos

    def live_part(self) -> tuple[U64, U64]:
        """Keys and values without the dead entries."""
        if self.dead == 0:
            return self.keys, self.values
        keep = self.values != 0
        return self.keys[keep], self.values[keep]

    def kill(self, pos: npt.NDArray[np.intp]) -> None:
        """Marks live entries dead (their value becomes 0)."""
        self.values[pos] = 0
        self.dead += int(pos.size)


def _merge(a: _Run, b: _Run) -> _Run:
    """One sorted run of the live entries of two runs (their live keys are
    disjoint): a linear merge by insertion positions, no re-sort."""
    a_keys, a_values = a.live_part()
    b_keys, b_values = b.live_part()
    total = a_keys.size + b_keys.size
    keys = np.empty(total, dtype=np.uint64)
    values = np.empty(total, dtype=np.uint64)
    at = np.searchsorted(a_keys, b_keys)
    at += np.arange(b_keys.size, dtype=at.dtype)
    keys[at] = b_keys
    values[at] = b_values
    rest = np.ones(total, dtype=bool)
    rest[at] = False
    keys[rest] = a_keys
    values[rest] = a_values
    return _Run(keys, values)


def _settle(runs: list[_Run]) -> None:
    """Restores the run invariants in place: no run mostly dead, none empty,
    each run at most 1/RUN_RATIO of the one before it."""
    for i, run in enumerate(runs):
        if run.dead and run.dead * DEAD_FRACTION > run.keys.size:
            runs[i] = _Run(*run.live_part())
    runs[:] = [run for run in runs if run.live]
    merged = True
    while merged:
        merged = False
        for i in range(len(runs) - 1, 0, -1):
            if runs[i].live * RUN_RATIO > runs[i - 1].live:
                runs[i - 1 : i + 1] = [_merge(runs[i - 1], runs[i])]
                merged = True
                break


class TrackingTable:
    """The in-flight roots of one tracker and their checkValues, in 16 bytes a
    root once compacted (see the module docstring for the layout)."""

    def __init__(self, timeout_s: float, generations: int = 3, now: float | None = None) -> None:
        self._clock = RotationClock(timeout_s, generations,
                                    time.monotonic() if now is None else now)
        self._generations: list[list[_Run]] = [[] for _ in range(generations)]
        self._overdue: list[U64] = []
        self._live = 0

    @property
    def timeout_s(self) -> float:
        """A root fails no earlier than this many seconds after its creation."""
        return self._clock.timeout_s

    @property
    def generations(self) -> int:
        """G: roots fail at most ``timeout * G/(G-1)`` after creation."""
        return self._clock.generations

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of every array the table holds (the tracker's memory)."""
        return sum(run.keys.nbytes + run.values.nbytes
                   for runs in self._generations for run in runs)

    @property
    def run_count(self) -> int:
        """Sorted runs over all generations: the searches one lookup costs."""
        return sum(len(runs) for runs in self._generations)

    def xor(self, root_ids: npt.ArrayLike, values: npt.ArrayLike,
            now: float | None = None) -> U64:
        """XORs ``values`` into the checkValues of ``root_ids`` and returns the
        roots whose checkValue became 0 (completed); they are removed.

        Several values for one root combine. A root not held here is created
        with its value (first touch registers it), in the newest generation; a
        root whose combined value is 0 on creation is reported completed and
        never stored. With ``now``, the generations rotate first, so no root is
        created in a stale generation; roots that fail then are returned by the
        next :meth:`expire`.
        """
        if now is not None:
            self._rotate(now)
        ids, vals = combine(as_u64(root_ids), as_u64(values))
        if ids.size == 0:
            return empty()
        completed: list[U64] = []
        todo = np.arange(ids.size)
        for runs in reversed(self._generations):  # recent roots get most reports
            touched = False
            for run in runs:
                if todo.size == 0:
                    break
                hit, pos = run.locate(ids[todo])
                if not hit.any():
                    continue
                where = pos[hit]
                after = run.values[where] ^ vals[todo[hit]]
                run.values[where] = after
                done = where[after == 0]
                if done.size:
                    completed.append(run.keys[done])
                    run.dead += int(done.size)
                    self._live -= int(done.size)
                    touched = True
                todo = todo[~hit]
            if touched:
                _settle(runs)
        if todo.size:
            new_ids, new_vals = ids[todo], vals[todo]
            born_done = new_vals == 0
            if born_done.any():
                completed.append(new_ids[born_done])
                new_ids, new_vals = new_ids[~born_done], new_vals[~born_done]
            if new_ids.size:
                self._generations[-1].append(_Run(new_ids, new_vals))
                self._live += int(new_ids.size)
                _settle(self._generations[-1])
        return _concat(completed)

    def expire(self, now: float) -> U64:
        """Rotates the generations due by ``now`` and returns the roots that
        failed (older than the timeout, still non-zero); they are removed."""
        self._rotate(now)
        failed = _concat(self._overdue)
        self._overdue = []
        return failed

    def _rotate(self, now: float) -> None:
        for _ in range(self._clock.due(now)):
            for run in self._generations.pop(0):
                keys, _ = run.live_part()
                if keys.size:
                    self._overdue.append(keys)
                    self._live -= int(keys.size)
            self._generations.append([])

    def contains(self, root_ids: npt.ArrayLike) -> Mask:
        """Whether each root is in flight here."""
        ids = as_u64(root_ids)
        out = np.zeros(ids.size, dtype=bool)
        for runs in self._generations:
            for run in runs:
                out |= run.locate(ids)[0]
        return out

    def values_of(self, root_ids: npt.ArrayLike) -> U64:
        """The checkValue of each root (0 when not in flight here)."""
        ids = as_u64(root_ids)
        out = np.zeros(ids.size, dtype=np.uint64)
        for runs in self._generations:
            for run in runs:
                hit, pos = run.locate(ids)
                out[hit] = run.values[pos[hit]]
        return out

    def items(self) -> tuple[U64, U64]:
        """Every in-flight root and its checkValue, in no particular order."""
        parts = [run.live_part() for runs in self._generations for run in runs]
        return _concat([k for k, _ in parts]), _concat([v for _, v in parts])

    def pending_ids(self) -> U64:
        """Every in-flight root, in no particular order."""
        return _concat([run.live_part()[0] for runs in self._generations for run in runs])

    def remove(self, root_ids: npt.ArrayLike) -> int:
        """Forgets roots (moved to another tracker, or about to be rebuilt);
        returns how many were held."""
        ids = np.unique(as_u64(root_ids))
        removed = 0
        for runs in self._generations:
            touched = False
            for run in runs:
                if ids.size == 0:
                    break
                hit, pos = run.locate(ids)
                if hit.any():
                    run.kill(pos[hit])
                    removed += int(np.count_nonzero(hit))
                    ids = ids[~hit]
                    touched = True
            if touched:
                _settle(runs)
        self._live -= removed
        return removed

    def export(self, select: Selector) -> tuple[U64, U64]:
        """Removes and returns (ids, values) of the in-flight roots that
        ``select`` (a vectorized predicate over an id array) picks, e.g. the
        roots a resized ring gives to another tracker."""
        out_ids: list[U64] = []
        out_values: list[U64] = []
        for runs in self._generations:
            kept: list[_Run] = []
            for run in runs:
                keys, values = run.live_part()
                chosen = np.asarray(select(keys), dtype=bool)
                if chosen.shape != keys.shape:
                    raise ValueError("select must return one bool per id")
                if not chosen.any():
                    kept.append(run)
                    continue
                out_ids.append(keys[chosen])
                out_values.append(values[chosen])
                self._live -= int(np.count_nonzero(chosen))
                kept.append(_Run(keys[~chosen], values[~chosen]))
            runs[:] = kept
            _settle(runs)
        return _concat(out_ids), _concat(out_values)

    def import_entries(self, root_ids: npt.ArrayLike, values: npt.ArrayLike) -> U64:
        """Takes over roots exported by another tracker. They are XORed in, so
        reports that reached this tracker first combine with them; returns the
        roots that thereby completed. Imported roots start a new timeout."""
        return self.xor(root_ids, values)

    def compact(self) -> None:
        """Merges each generation into one run without dead entries, so the
        table holds exactly 16 bytes per in-flight root."""
        for runs in self._generations:
            while len(runs) > 1:
                runs[-2:] = [_merge(runs[-2], runs[-1])]
            if runs and runs[0].dead:
                runs[0] = _Run(*runs[0].live_part())
            runs[:] = [run for run in runs if run.live]
