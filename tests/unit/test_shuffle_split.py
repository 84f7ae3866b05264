"""The shuffle's split gives the segments the record-by-record split gave:
the same partitions (xxh64 of the key's text mod P), sequences, keys and
values in record order, and the same dead letters for bad keys."""

from __future__ import annotations

import random
from typing import Any

import xxhash

from gridstream.builtins import identity
from gridstream.combiners import count_partials
from gridstream.ids import key_text
from services.worker.operators import check_key
from services.worker.shuffle import Shuffle


def key_of(value: Any) -> Any:
    return value[0]


def reference(values: list[Any], partitions: int, size: int,
              sequences: dict[int, int]) -> list[tuple[int, int, list[Any], list[Any]]]:
    """The split as it was: record by record, a dict of buckets."""
    buckets: dict[int, tuple[list[Any], list[Any]]] = {}
    for v in values:
        k = key_of(v)
        if not check_key(k):
            continue
        text = k if type(k) is str else key_text(k)
        p = xxhash.xxh64_intdigest(text.encode()) % partitions
        bucket = buckets.setdefault(p, ([], []))
        bucket[0].append(k)
        bucket[1].append(v)
    out = []
    for p in sorted(buckets):
        bk, bv = buckets[p]
        for start in range(0, len(bv), size):
            sequences[p] = sequences.get(p, 0) + 1
            out.append((p, sequences[p], bk[start:start + size], bv[start:start + size]))
    return out


def test_split_matches_the_record_by_record_split() -> None:
    rng = random.Random(3)
    keys: list[Any] = [f"k{i}" for i in range(300)] + list(range(50)) + [b"b1", b"b2"]
    for partitions in (1, 7, 12):
        shuffle = Shuffle("job", 1, "next", partitions, key_of, "t0/p0",
                          router=None, batch_records=40)  # type: ignore[arg-type]
        sequences: dict[int, int] = {}
        for n in range(60):
            values: list[Any] = [[rng.choice(keys), rng.random()]
                                 for _ in range(rng.randrange(0, 200))]
            if n % 5 == 0 and values:
                values.insert(rng.randrange(len(values)), [None, 1.0])  # a bad key
            dead: list[Any] = []
            segments = shuffle.split(values, f"b#{n}", dead)
            expected = reference(values, partitions, 40, sequences)
            assert [(s.partition, s.sequence, s.keys, s.values) for s in segments] == expected
            assert all(s.previous_sequence == s.sequence - 1 for s in segments)
            assert len(dead) == (1 if n % 5 == 0 and values else 0)
        assert shuffle.sequences == sequences


def split_alike(fast: Shuffle, slow: Shuffle, values: list[Any], batch_id: str) -> list[Any]:
    """Splits ``values`` with both shuffles; asserts the same segments and
    dead letters (id, stage, record) and returns the dead letters."""
    dead_fast: list[Any] = []
    dead_slow: list[Any] = []
    a = fast.split(list(values), batch_id, dead_fast)
    b = slow.split(list(values), batch_id, dead_slow)
    assert ([(s.partition, s.sequence, s.keys, s.values) for s in a]
            == [(s.partition, s.sequence, s.keys, s.values) for s in b])
    assert [d[:3] for d in dead_fast] == [d[:3] for d in dead_slow]
    return dead_fast


def test_records_keyed_by_themselves_split_as_with_a_key_call_per_record() -> None:
    # The identity key is not called per record (the shuffle takes the values
    # as their keys); the segments and dead letters must be the same as with
    # an equal function that is called, bad keys included.
    rng = random.Random(4)
    words: list[Any] = [f"w{i}" for i in range(200)] + [7, b"x"]
    for partitions in (1, 12):
        shortcut = Shuffle("job", 1, "next", partitions, identity, "t0/p0",
                           router=None, batch_records=30)  # type: ignore[arg-type]
        called = Shuffle("job", 1, "next", partitions, lambda value: value, "t0/p0",
                         router=None, batch_records=30)  # type: ignore[arg-type]
        for n in range(20):
            values: list[Any] = [rng.choice(words) for _ in range(rng.randrange(0, 150))]
            if n % 4 == 0:
                values.append(["not", "a", "key"])
            dead = split_alike(shortcut, called, values, f"b#{n}")
            assert len(dead) == (1 if n % 4 == 0 else 0)


class Loud(str):
    """A str subclass whose own hashing fails: routing must not depend on it."""

    def __hash__(self) -> int:
        raise RuntimeError("no hashing here")


def test_combined_records_keyed_by_themselves_split_as_record_by_record() -> None:
    # Words into a combined count: combined before the key types are checked
    # (once per distinct word), without the per-record keying. Bad records
    # (unhashable, a subclass whose hashing fails, a float) must come out as
    # the record-by-record path gives them: the same segments and the same
    # dead letters.
    rng = random.Random(5)
    words: list[Any] = [f"w{i}" for i in range(300)] + [7, b"x"]
    odd: list[Any] = [["a", "list"], Loud("w1"), 2.5]
    for partitions in (1, 12):
        fast = Shuffle("job", 1, "next", partitions, identity, "t0/p0", router=None,
                       batch_records=25, combine=count_partials)  # type: ignore[arg-type]
        slow = Shuffle("job", 1, "next", partitions, lambda value: value, "t0/p0",
                       router=None, batch_records=25,  # type: ignore[arg-type]
                       combine=count_partials)
        keyed: list[str] = []  # batches the fast shuffle keyed record by record
        per_record = fast._keys

        def spy(values: list[Any], batch_id: str, dead: list[Any],
                per_record: Any = per_record, keyed: list[str] = keyed) -> Any:
            keyed.append(batch_id)
            return per_record(values, batch_id, dead)

        fast._keys = spy  # type: ignore[method-assign]
        odd_batches = []
        for n in range(30):
            values: list[Any] = [rng.choice(words) for _ in range(rng.randrange(1, 400))]
            if n % 3 == 0:
                values.insert(rng.randrange(len(values) + 1), odd[n // 3 % len(odd)])
                odd_batches.append(f"b#{n}")
            split_alike(fast, slow, values, f"b#{n}")
        assert keyed == odd_batches  # plain words never took the per-record path


def test_a_batch_keyed_for_one_partition_goes_whole_and_in_order() -> None:
    """The source sent these records to the partition their key belongs to
    (taxi by device): the split's fast path, checked against the reference."""
    partitions = 12
    same = [k for k in (f"dev{i}" for i in range(2_000))
            if xxhash.xxh64_intdigest(k.encode()) % partitions == 5]
    rng = random.Random(4)
    shuffle = Shuffle("job", 1, "next", partitions, key_of, "t0/p0",
                      router=None, batch_records=40)  # type: ignore[arg-type]
    sequences: dict[int, int] = {}
    for n in range(20):
        values: list[Any] = [[rng.choice(same), i] for i in range(rng.randrange(1, 150))]
        segments = shuffle.split(values, f"b#{n}", [])
        assert {s.partition for s in segments} == {5}
        expected = reference(values, partitions, 40, sequences)
        assert [(s.partition, s.sequence, s.keys, s.values) for s in segments] == expected
