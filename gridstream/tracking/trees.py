"""Deterministic random tuple trees and the reports processing them produces,
for the property tests and ``bench/tracking.py``.

A tree's tuple 0 is the root tuple; its id is the root id. Processing yields
one report per tuple, ``(root, own id XOR the ids of the tuples it emitted)``,
plus the registration ``(root, root)``. Every id then enters the XOR exactly
twice (when created, when processed), so the checkValue is 0 once every
report is in, and, ids being independent random 64-bit numbers, not before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gridstream.tracking.table import U64

Reports = tuple[U64, U64]
"""(root ids, values): what a batch of reports hands to ``xor``."""


def random_ids(rng: np.random.Generator, count: int) -> U64:
    """Uniform non-zero 64-bit ids, like :func:`gridstream.ids.record_id` gives."""
    return rng.integers(1, 2**64, size=count, dtype=np.uint64)


@dataclass(frozen=True)
class TupleTree:
    """One root's tuple tree: ids in breadth-first order and each tuple's
    parent index (-1 for the root tuple)."""

    ids: U64
    parents: npt.NDArray[np.int64]

    @property
    def root(self) -> int:
        """The root id (the root tuple's id)."""
        return int(self.ids[0])

    def __len__(self) -> int:
        return int(self.ids.size)


def random_tree(rng: np.random.Generator, max_depth: int, max_fanout: int) -> TupleTree:
    """A tree whose every tuple above ``max_depth`` emits 0..max_fanout
    children (depth 0 is the root tuple alone)."""
    parents = [np.full(1, -1, dtype=np.int64)]
    level = np.zeros(1, dtype=np.int64)
    count = 1
    for _ in range(max_depth):
        fanout = rng.integers(0, max_fanout + 1, size=level.size)
        children = np.repeat(level, fanout)
        if children.size == 0:
            break
        parents.append(children)
        level = np.arange(count, count + children.size, dtype=np.int64)
        count += int(children.size)
    return TupleTree(random_ids(rng, count), np.concatenate(parents))


def tree_reports(tree: TupleTree) -> Reports:
    """Registration first, then one report per processed tuple (in id order)."""
    emitted = np.zeros(len(tree), dtype=np.uint64)
    np.bitwise_xor.at(emitted, tree.parents[1:], tree.ids[1:])
    values = np.concatenate([tree.ids[:1], tree.ids ^ emitted])
    return np.full(values.size, tree.ids[0], dtype=np.uint64), values


def complete_tree_stages(rng: np.random.Generator, count: int, fanout: int,
                         levels: int) -> list[Reports]:
    """Reports of ``count`` complete trees (``levels`` levels of tuples,
    ``fanout`` children each), vectorized, stage by stage: stage 0 registers
    the roots, stage k processes the tuples of level k-1. A pipeline delivers
    stage k of a batch together with stage k+1 of the batch before it."""
    if fanout < 1 or levels < 1:
        raise ValueError("fanout and levels must be >= 1")
    roots = random_ids(rng, count)
    stages: list[Reports] = [(roots, roots.copy())]
    level_ids = roots.reshape(count, 1)
    for depth in range(levels):
        width = level_ids.shape[1]
        if depth + 1 < levels:
            child_ids = random_ids(rng, count * width * fanout).reshape(count, width * fanout)
            emitted = np.bitwise_xor.reduce(child_ids.reshape(count, width, fanout), axis=2)
        else:
            child_ids = np.zeros((count, 0), dtype=np.uint64)
            emitted = np.zeros((count, width), dtype=np.uint64)
        values = (level_ids ^ emitted).ravel()
        stages.append((np.repeat(roots, width), values))
        level_ids = child_ids
    return stages
