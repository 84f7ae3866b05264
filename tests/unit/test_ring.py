"""The partition ring: even shares and minimal movement."""

from __future__ import annotations

import pytest

from gridstream.ring import HashRing, assign_partitions, shares

PARTITIONS = 1000


def workers(n: int) -> list[str]:
    return [f"worker-{i}" for i in range(1, n + 1)]


@pytest.mark.parametrize("n", range(3, 11))
def test_shares_within_15_percent_of_even(n: int) -> None:
    owners = assign_partitions(HashRing(workers(n), 100), "job-a", PARTITIONS)
    even = PARTITIONS / n
    counts = shares(owners)
    assert set(counts) == set(workers(n))
    for member, count in counts.items():
        assert abs(count - even) <= 0.15 * even, (member, count, even)


@pytest.mark.parametrize("n", range(3, 11))
def test_adding_a_worker_moves_about_one_in_n_plus_one(n: int) -> None:
    before = assign_partitions(HashRing(workers(n), 100), "job-a", PARTITIONS)
    after = assign_partitions(HashRing([*workers(n), "worker-new"], 100), "job-a", PARTITIONS)
    moved = sum(a != b for a, b in zip(before, after, strict=True))
    ideal = PARTITIONS / (n + 1)
    assert 0.8 * ideal <= moved <= 1.5 * ideal, (moved, ideal)
    # Most partitions that move go to the newcomer.
    to_new = sum(1 for a, b in zip(before, after, strict=True) if a != b and b == "worker-new")
    assert to_new >= 0.6 * moved


def test_removing_a_worker_moves_mostly_its_own_partitions() -> None:
    before = assign_partitions(HashRing(workers(5), 100), "job-a", PARTITIONS)
    after = assign_partitions(HashRing(workers(5)[:-1], 100), "job-a", PARTITIONS)
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    owned_by_removed = [i for i, a in enumerate(before) if a == "worker-5"]
    assert set(owned_by_removed) <= set(moved)
    assert len(moved) <= 1.5 * len(owned_by_removed)


def test_assignment_is_deterministic_and_order_free() -> None:
    a = assign_partitions(HashRing(["w1", "w2", "w3"], 100), "job", 64)
    b = assign_partitions(HashRing(["w3", "w1", "w2"], 100), "job", 64)
    assert a == b


def test_walk_lists_distinct_successors() -> None:
    ring = HashRing(workers(4), 10)
    walk = ring.walk("some-key")
    assert sorted(walk) == sorted(workers(4))
    assert walk[0] == ring.owner("some-key")
    assert ring.successors("some-key", 2) == walk[1:3]


def test_empty_ring_refuses() -> None:
    with pytest.raises(LookupError):
        assign_partitions(HashRing([], 100), "job", 4)


def test_a_partition_avoids_the_workers_its_task_failed_on() -> None:
    ring = HashRing(workers(3), 100)
    before = assign_partitions(ring, "job-a", 12)
    victim = before[5]
    after = assign_partitions(ring, "job-a", 12, avoid={5: {victim}})
    assert after[5] != victim
    # Others keep their owners, but for the few the load bound pushes along
    # (the new owner of partition 5 has one partition more).
    assert sum(a != b for a, b in zip(after, before, strict=True)) <= 3
    # Avoided everywhere: it keeps an owner rather than having none.
    everywhere = assign_partitions(ring, "job-a", 12, avoid={5: set(workers(3))})
    assert everywhere == before
