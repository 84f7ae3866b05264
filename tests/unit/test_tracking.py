"""XOR tuple tracking: completion exactly when a tree is done, timeouts,
agreement of the compact table with the plain-dict tracker, its memory, and
the tracker ring's movement on resize."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridstream.tracking import NaiveTracker, TrackerRing, TrackingTable
from gridstream.tracking.ring import position
from gridstream.tracking.table import U64
from gridstream.tracking.trees import (
    complete_tree_stages,
    random_ids,
    random_tree,
    tree_reports,
)

SEEDS = st.integers(0, 2**32 - 1)
FAST = settings(max_examples=60, deadline=None)


def ids_set(ids: U64) -> set[int]:
    return {int(i) for i in ids}


def shuffled_forest(rng: np.random.Generator, trees: int) -> tuple[U64, U64, Any]:
    """The reports of ``trees`` random trees (depth 3, fan-out up to 3), and a
    random order to apply them in."""
    reports = [tree_reports(random_tree(rng, 3, 3)) for _ in range(trees)]
    roots = np.concatenate([r for r, _ in reports])
    values = np.concatenate([v for _, v in reports])
    return roots, values, rng.permutation(values.size)


def state(tracker: TrackingTable | NaiveTracker) -> dict[int, int]:
    ids, values = tracker.items()
    return dict(zip(ids.tolist(), values.tolist(), strict=True))


# -- completion ----------------------------------------------------------------


@FAST
@given(seed=SEEDS, depth=st.integers(0, 4), fanout=st.integers(0, 4))
def test_a_root_completes_exactly_when_every_tuple_is_processed(
    seed: int, depth: int, fanout: int
) -> None:
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, depth, fanout)
    roots, values = tree_reports(tree)
    order = rng.permutation(values.size)
    table = TrackingTable(60.0, now=0.0)
    for step, report in enumerate(order, start=1):
        done = table.xor(roots[report : report + 1], values[report : report + 1])
        if step < order.size:
            assert done.size == 0 and len(table) == 1
        else:
            assert ids_set(done) == {tree.root}
    assert len(table) == 0 and table.nbytes == 0


@FAST
@given(seed=SEEDS, depth=st.integers(1, 4), fanout=st.integers(1, 4))
def test_no_strict_subset_of_the_reports_completes(seed: int, depth: int, fanout: int) -> None:
    rng = np.random.default_rng(seed)
    roots, values = tree_reports(random_tree(rng, depth, fanout))
    for _ in range(20):
        keep = rng.random(values.size) < rng.random()
        if keep.all():
            keep[rng.integers(values.size)] = False
        table = TrackingTable(60.0, now=0.0)
        assert table.xor(roots[keep], values[keep]).size == 0
        assert len(table) == int(keep.any())


@FAST
@given(seed=SEEDS, trees=st.integers(1, 30), batches=st.integers(1, 12))
def test_interleaved_trees_complete_in_the_batch_of_their_last_report(
    seed: int, trees: int, batches: int
) -> None:
    rng = np.random.default_rng(seed)
    roots, values, order = shuffled_forest(rng, trees)
    cuts = np.sort(rng.integers(0, values.size + 1, size=batches - 1))
    split = np.split(order, cuts)
    last_batch: dict[int, int] = {}
    for number, batch in enumerate(split):
        last_batch.update((int(r), number) for r in roots[batch])
    table = TrackingTable(60.0, now=0.0)
    naive = NaiveTracker(60.0, now=0.0)
    seen: set[int] = set()
    for number, batch in enumerate(split):
        done = table.xor(roots[batch], values[batch])
        assert ids_set(done) == {r for r, b in last_batch.items() if b == number}
        assert ids_set(done) == ids_set(naive.xor(roots[batch], values[batch]))
        assert state(table) == state(naive)
        seen |= ids_set(roots[batch])
        assert ids_set(table.pending_ids()) == {r for r in seen if last_batch[r] > number}
    assert len(table) == 0 and table.nbytes == 0


def test_a_root_registered_and_completed_in_one_call_is_never_stored() -> None:
    table = TrackingTable(60.0, now=0.0)
    root = np.uint64(0xDEADBEEF12345678)
    done = table.xor(np.array([root, root], dtype=np.uint64),
                     np.array([root, root], dtype=np.uint64))
    assert done.tolist() == [int(root)]
    assert len(table) == 0 and table.nbytes == 0
    assert not table.contains([int(root)])[0]


def test_values_for_one_root_in_one_call_combine() -> None:
    table = TrackingTable(60.0, now=0.0)
    assert table.xor([7, 7, 7], [1, 2, 4]).size == 0
    assert table.values_of([7]).tolist() == [7]
    assert table.xor([7, 8, 7], [3, 5, 4]).tolist() == [7]
    assert state(table) == {8: 5}


# -- timeouts --------------------------------------------------------------------


@FAST
@given(seed=SEEDS, generations=st.integers(2, 5), created=st.floats(0.0, 50.0),
       step=st.floats(0.05, 3.0))
def test_a_dropped_report_fails_after_the_timeout_and_not_before(
    seed: int, generations: int, created: float, step: float
) -> None:
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, 3, 3)
    roots, values = tree_reports(tree)
    keep = np.ones(values.size, dtype=bool)
    keep[rng.integers(values.size)] = False
    timeout = 10.0
    table = TrackingTable(timeout, generations=generations, now=0.0)
    naive = NaiveTracker(timeout, generations=generations, now=0.0)
    now = 0.0
    while now < created:  # the clock ticks until the root is created
        assert table.expire(now).size == 0 and naive.expire(now).size == 0
        now += step
    assert table.xor(roots[keep], values[keep], now=now).size == 0
    naive.xor(roots[keep], values[keep], now=now)
    born = now
    latest = born + timeout * generations / (generations - 1)
    while True:
        now += step
        failed, naive_failed = table.expire(now), naive.expire(now)
        assert failed.tolist() == naive_failed.tolist()
        if failed.size:
            assert failed.tolist() == [tree.root]
            assert now - born >= timeout
            assert now < latest + step
            break
        assert now < latest + 1e-9, "the root never failed"
        assert len(table) == 1
    assert len(table) == 0 and table.expire(now + 100.0).size == 0


def test_expire_after_a_long_pause_rotates_at_most_every_generation() -> None:
    table = TrackingTable(5.0, generations=3, now=0.0)
    table.xor([1, 2], [1, 2])
    assert ids_set(table.expire(1e12)) == {1, 2}
    table.xor([3], [3])
    assert table.expire(1e12 + 4.9).size == 0
    assert table.expire(1e12 + 7.5).tolist() == [3]


# -- agreement with the plain-dict tracker ----------------------------------------

ROOTS = st.integers(1, 12)
OPS = st.one_of(
    st.tuples(st.just("xor"), st.lists(st.tuples(ROOTS, st.integers(0, 3)), max_size=12)),
    st.tuples(st.just("expire"), st.floats(0.0, 4.0)),
    st.tuples(st.just("remove"), st.lists(ROOTS, max_size=4)),
    st.tuples(st.just("export"), st.integers(2, 4)),
    st.tuples(st.just("compact"), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, max_size=40), generations=st.integers(2, 4))
def test_the_compact_table_agrees_with_the_naive_tracker(
    ops: list[tuple[str, Any]], generations: int
) -> None:
    table = TrackingTable(6.0, generations=generations, now=0.0)
    naive = NaiveTracker(6.0, generations=generations, now=0.0)
    now = 0.0
    for op, arg in ops:
        if op == "xor":
            ids = np.asarray([r for r, _ in arg], dtype=np.uint64)
            values = np.asarray([v for _, v in arg], dtype=np.uint64)
            done = table.xor(ids, values)
            assert sorted(done.tolist()) == sorted(naive.xor(ids, values).tolist())
        elif op == "expire":
            now += arg
            assert sorted(table.expire(now).tolist()) == sorted(naive.expire(now).tolist())
        elif op == "remove":
            assert table.remove(arg) == naive.remove(arg)
        elif op == "export":
            def pick(ids: U64, k: int = arg) -> npt.NDArray[np.bool_]:
                return np.asarray(ids % np.uint64(k) == 0)
            mine, theirs = table.export(pick), naive.export(pick)
            assert dict(zip(*(a.tolist() for a in mine), strict=True)) == dict(
                zip(*(a.tolist() for a in theirs), strict=True))
        else:
            table.compact()
        assert state(table) == state(naive)
        assert len(table) == len(naive) == table.pending_ids().size
        probe = np.arange(0, 14, dtype=np.uint64)
        assert table.contains(probe).tolist() == naive.contains(probe).tolist()
        assert table.values_of(probe).tolist() == naive.values_of(probe).tolist()


# -- memory ------------------------------------------------------------------------


def test_at_most_16_bytes_per_in_flight_root() -> None:
    rng = np.random.default_rng(1)
    table = TrackingTable(60.0, now=0.0)
    for _ in range(20):  # 100k in-flight roots, each registered and its root tuple processed
        stages = complete_tree_stages(rng, 5_000, fanout=2, levels=3)
        roots = np.concatenate([stages[0][0], stages[1][0]])
        values = np.concatenate([stages[0][1], stages[1][1]])
        assert table.xor(roots, values).size == 0
        # Short-lived roots complete within two calls and leave dead entries behind.
        short = complete_tree_stages(rng, 1_000, fanout=2, levels=2)
        table.xor(*short[0])
        done = table.xor(np.concatenate([s[0] for s in short[1:]]),
                         np.concatenate([s[1] for s in short[1:]]))
        assert done.size == 1_000
    assert len(table) == 100_000
    assert table.nbytes <= 16 * 100_000 * 8 / 7  # bounded dead entries between compactions
    table.compact()
    assert table.nbytes <= 16 * len(table)
    assert table.run_count == 1
    # Completions scattered over a big run: it is rewritten before zeros pile up.
    pending = table.pending_ids()
    for part in np.array_split(pending[rng.permutation(pending.size)][:60_000], 30):
        assert table.remove(part) == part.size
        assert table.nbytes <= 16 * len(table) * 8 / 7
    assert len(table) == 40_000


# -- the ring --------------------------------------------------------------------


def trackers(n: int) -> list[str]:
    return [f"tracker-{i}" for i in range(1, n + 1)]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 7), names=st.lists(st.text(min_size=1, max_size=8), min_size=1,
                                           max_size=8, unique=True), seed=SEEDS)
def test_a_resize_moves_only_roots_of_the_tracker_that_comes_or_goes(
    n: int, names: list[str], seed: int
) -> None:
    roots = random_ids(np.random.default_rng(seed), 2_000)
    old = TrackerRing(names, 16)
    newcomer = "new-" + "".join(names)
    grown = old.with_trackers([*names, newcomer])
    moved = old.moved_mask(grown, roots)
    assert (grown.owner_index(roots)[moved] == len(names)).all()  # only to the newcomer
    assert not (grown.owner_index(roots)[~moved] == len(names)).any()
    if len(names) > 1:
        gone = names[0]
        shrunk = old.with_trackers(names[1:])
        moved = old.moved_mask(shrunk, roots)
        assert (moved == (old.owner_index(roots) == 0)).all()  # exactly the leaver's roots
        assert gone not in shrunk.trackers


@pytest.mark.parametrize("n", range(1, 8))
def test_adding_a_tracker_moves_about_one_in_n_plus_one(n: int) -> None:
    roots = random_ids(np.random.default_rng(n), 50_000)
    old = TrackerRing(trackers(n), 64)
    new = old.with_trackers([*trackers(n), "tracker-new"])
    share = float(old.moved_mask(new, roots).mean())
    assert 0.6 / (n + 1) <= share <= 1.4 / (n + 1), share
    assert (np.asarray([new.owner(int(r)) for r in roots[:200]])
            == np.asarray(new.trackers)[new.owner_index(roots[:200])]).all()


def test_the_owner_is_the_first_position_clockwise_wrapping_around() -> None:
    names = ["a", "b", "c"]
    ring = TrackerRing(names, 4)
    owner_of = {position(t, i): t for t in names for i in range(1, 5)}
    points = sorted(owner_of)
    probes, expected = [], []
    for k, point in enumerate(points):
        probes.append(point << 32)  # exactly at a position: that position's tracker
        expected.append(owner_of[point])
        probes.append(((point + 1) << 32) - 1 if point < 2**32 - 1 else 0)
        expected.append(owner_of[point] if point < 2**32 - 1 else owner_of[points[0]])
        if k + 1 < len(points) and point + 1 < points[k + 1]:
            probes.append((point + 1) << 32)  # just after it: the next position's
            expected.append(owner_of[points[k + 1]])
    probes.append(min((points[-1] + 1) << 32, 2**64 - 1))  # past the last: wraps
    expected.append(owner_of[points[0]] if points[-1] < 2**32 - 1 else owner_of[points[-1]])
    got = np.asarray(ring.trackers)[ring.owner_index(np.asarray(probes, dtype=np.uint64))]
    assert got.tolist() == expected
    assert [ring.owner(p) for p in probes] == expected


def test_tracker_order_does_not_change_owners() -> None:
    roots = random_ids(np.random.default_rng(3), 5_000)
    a = TrackerRing(trackers(5), 32)
    b = TrackerRing(list(reversed(trackers(5))), 32)
    assert not a.moved_mask(b, roots).any()


# -- moving records between trackers ---------------------------------------------


@FAST
@given(seed=SEEDS, trees=st.integers(1, 60), n=st.integers(1, 5))
def test_export_then_import_moves_records_without_losing_a_bit(
    seed: int, trees: int, n: int
) -> None:
    rng = np.random.default_rng(seed)
    roots, values, order = shuffled_forest(rng, trees)
    first, rest = np.split(order, [order.size // 2])
    old = TrackerRing(trackers(n), 16)
    new = old.with_trackers([*trackers(n), "tracker-new"])
    source = TrackingTable(60.0, now=0.0)
    target = TrackingTable(60.0, now=0.0)
    before_done = ids_set(source.xor(roots[first], values[first]))
    before = state(source)
    ids, vals = source.export(lambda ids: old.moved_mask(new, ids))
    assert ids_set(ids) == {r for r in before if old.moved_mask(new, np.asarray([r], np.uint64))[0]}
    assert not source.contains(ids).any()
    assert target.import_entries(ids, vals).size == 0
    assert {**state(source), **state(target)} == before
    assert not set(state(source)) & set(state(target))
    # The rest of the reports go to each root's new tracker; every tree completes.
    owner = new.owner_index(roots[rest]) == n
    done = ids_set(target.xor(roots[rest][owner], values[rest][owner]))
    done |= ids_set(source.xor(roots[rest][~owner], values[rest][~owner]))
    assert done | before_done == ids_set(roots)
    assert len(source) == len(target) == 0
