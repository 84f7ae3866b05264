"""The SDK groups keyed records by partition as record-by-record
``partition_for_key`` would: same partitions, record order kept, and keys
that are equal as dict keys but not as partition keys (1, 1.0, True) apart."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gridstream.client import _group_by_partition, _packed_batches
from gridstream.codec import PayloadError, decode_batch, encode_batch
from gridstream.ids import partition_for_key


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
            got = _group_by_partition(keys, values, partitions)
            assert sorted(got.items()) == sorted(expected.items())
            assert list(got) == sorted(got)


def test_packed_batches_are_the_grouped_records_cut_and_packed_in_order() -> None:
    rng = random.Random(6)
    for partitions, batch_size, count in ((1, 7, 100), (5, 1_000, 3_000), (12, 20_000, 70_000),
                                          (3, 40_000, 100_000)):
        keys = [f"dev{rng.randrange(500)}" for _ in range(count)]
        values: list[Any] = [[k, i, "x" * (i % 9)] for i, k in enumerate(keys)]
        batches = _packed_batches(keys, values, partitions, batch_size)
        assert list(batches) == sorted(batches)
        for p, (bk, bv) in _group_by_partition(keys, values, partitions).items():
            assert all(0 < len(b.values) <= batch_size for b in batches[p])
            assert [k for b in batches[p] for k in b.keys or []] == bk
            assert [v for b in batches[p] for v in b.values] == bv
            for batch in batches[p]:  # the wire form is what the batch holds
                assert batch.encoded is not None
                assert batch.encoded.payload == encode_batch(batch.values, batch.keys).payload
                assert decode_batch(batch.encoded) == (batch.keys, batch.values)


def test_a_keyed_send_that_msgpack_cannot_carry_fails_before_any_push() -> None:
    with pytest.raises(PayloadError, match="msgpack-serialisable"):
        _packed_batches(["a", "b"], ["fine", {1, 2}], 3, 100)
