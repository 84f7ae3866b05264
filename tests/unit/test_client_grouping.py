"""The SDK groups keyed records by partition as record-by-record
``partition_for_key`` would: same partitions, record order kept, and keys
that are equal as dict keys but not as partition keys (1, 1.0, True) apart."""

from __future__ import annotations

import random
from typing import Any

from gridstream.client import _group_by_partition
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
