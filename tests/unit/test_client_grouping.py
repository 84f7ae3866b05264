"""The SDK groups keyed records by partition as record-by-record
``partition_for_key`` would: same partitions, record order kept, and keys
that are equal as dict keys but not as partition keys (1, 1.0, True) apart;
it hands batches over as it packs them only when no record can fail to pack."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gridstream.codec import PayloadError, decode_batch, encode_batch
from gridstream.ids import partition_for_key
from gridstream.sendbatches import (
    PACK_CHUNK,
    Batch,
    group_by_partition,
    halves,
    packed_steps,
    packs_surely,
)


def test_grouping_matches_partition_for_key() -> None:
    rng = random.Random(5)
    choices: list[Any] = [f"dev{i}" for i in range(200)] + [1, 1.0, True, "1", b"1", [1, 2],
                                                            ("a",), None, 2**80]
    for partitions in (1, 5, 12):
        for _ in range(50):
            keys = [rng.choice(choices) for _ in range(rng.randrange(0, 300))]
            values = list(range(len(keys)))
            expected: dict[int, tuple[list[Any], list[Any]]] = {}
            for k, v in zip(keys, values, strict=True):
                bucket = expected.setdefault(partition_for_key(k, partitions), ([], []))
                bucket[0].append(k)
                bucket[1].append(v)
            got = group_by_partition(keys, values, partitions)
            assert sorted(got.items()) == sorted(expected.items())
            assert list(got) == sorted(got)


def test_grouping_with_remembered_partitions_matches_partition_for_key() -> None:
    # One ``known`` across sends, as a client keeps it: a remembered str key
    # must never hand its partition to a key equal to it as a dict key but of
    # another type, nor a key remembered in one send change in the next.
    rng = random.Random(7)
    choices: list[Any] = [f"dev{i}" for i in range(50)] + ["1", 1, 1.0, True, "True",
                                                           b"1", [1], None]
    for partitions in (5, 12):
        known: dict[str, int] = {}
        for _ in range(40):
            keys = [rng.choice(choices) for _ in range(rng.randrange(1, 200))]
            values = list(range(len(keys)))
            got = group_by_partition(keys, values, partitions, known)
            for p, (bucket_keys, _) in got.items():
                assert all(partition_for_key(k, partitions) == p for k in bucket_keys)
            assert sum(len(v) for _, v in got.values()) == len(values)
        assert all(type(k) is str for k in known)


def _per_partition(steps: list[list[tuple[int, Batch]]]) -> dict[int, list[Batch]]:
    batches: dict[int, list[Batch]] = {}
    for step in steps:
        for p, batch in step:
            batches.setdefault(p, []).append(batch)
    return batches


def test_packed_batches_are_the_grouped_records_cut_and_packed_in_order() -> None:
    rng = random.Random(6)
    for partitions, batch_size, count in ((1, 7, 100), (5, 1_000, 3_000), (12, 20_000, 70_000),
                                          (3, 40_000, 100_000)):
        keys = [f"dev{rng.randrange(500)}" for _ in range(count)]
        values: list[Any] = [[k, i, "x" * (i % 9)] for i, k in enumerate(keys)]
        steps = list(packed_steps(keys, values, partitions, batch_size))
        batches = _per_partition(steps)
        for p, (bk, bv) in group_by_partition(keys, values, partitions).items():
            assert all(0 < b.count == len(b.values) <= batch_size for b in batches[p])
            assert [k for b in batches[p] for k in b.keys or []] == bk
            assert [v for b in batches[p] for v in b.values] == bv
            for batch in batches[p]:  # the wire form is what the batch holds
                assert batch.encoded is not None
                assert batch.encoded.payload == encode_batch(batch.values, batch.keys).payload
                assert decode_batch(batch.encoded) == (batch.keys, batch.values)


def test_a_packed_batch_cut_in_two_keeps_its_records_in_order() -> None:
    """A packed batch holds its records as the runs grouping made; cut in two
    (a push refused it as too large) its halves hold them joined, in order,
    keys with their values, and are packed again when pushed."""
    keys = [f"dev{i % 7}" for i in range(3 * PACK_CHUNK)]
    values = [f"record {i}" for i in range(len(keys))]
    steps = list(packed_steps(keys, values, 2, 3 * PACK_CHUNK))
    for p, batch in steps[-1]:  # one batch a partition, joined from three runs
        expected_keys, expected_values = group_by_partition(keys, values, 2)[p]
        assert batch.count == len(expected_values)
        first, second = halves(batch)
        assert first.encoded is None and second.encoded is None
        assert first.keys is not None and second.keys is not None
        assert first.keys + second.keys == expected_keys
        assert first.values + second.values == expected_values
        assert first.count + second.count == batch.count
        assert abs(first.count - second.count) <= 1


def test_full_batches_are_handed_over_at_the_step_that_filled_them() -> None:
    """A batch leaves as soon as a chunk fills it, so pushes can begin while
    the rest of the send is packed; only the last step holds partial ones."""
    keys = [f"dev{i % 300}" for i in range(10 * PACK_CHUNK)]
    values = [f"record {i}" for i in range(len(keys))]
    steps = list(packed_steps(keys, values, 4, PACK_CHUNK))
    assert len(steps) == 11  # one per chunk, then the partly filled batches
    handed_early = [batch for step in steps[:-1] for _, batch in step]
    assert any(steps[:4]) and steps[-1]  # about a quarter of each chunk per partition
    assert sum(len(batch.values) for batch in handed_early) > len(values) * 3 // 4
    assert [p for p, _ in steps[-1]] == sorted(p for p, _ in steps[-1])


def test_only_ascii_text_is_certain_to_pack() -> None:
    assert packs_surely(["a", "b"], ["line one", '{"lat": 1}'])
    assert packs_surely([], [])
    assert not packs_surely(["a"], ["caf\u00e9"])  # UTF-8 could still refuse some text
    assert not packs_surely(["a"], ["\ud800"])  # a lone surrogate: msgpack refuses it
    assert not packs_surely([1], ["x"])
    assert not packs_surely(["a"], [b"bytes"])
    assert not packs_surely(["a"], [{"a": 1}])


def test_a_keyed_send_that_msgpack_cannot_carry_fails_while_packing() -> None:
    with pytest.raises(PayloadError, match="msgpack-serialisable"):
        list(packed_steps(["a", "b"], ["fine", {1, 2}], 3, 100))
    with pytest.raises(PayloadError, match="msgpack-serialisable"):
        list(packed_steps(["a"], ["\ud800"], 3, 100))
