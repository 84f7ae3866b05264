"""How the SDK cuts an unkeyed send into batches: large sends in batches of
``batch_size``, a send of fewer than ``batch_size`` records per partition in one
batch per partition, never in slivers below ``SPREAD_MIN_BATCH``; an explicit
small ``batch_size`` is kept."""

from __future__ import annotations

from gridstream.client import DEFAULT_BATCH_SIZE
from gridstream.sendbatches import SPREAD_MIN_BATCH, unkeyed_batch_size


def test_a_large_send_goes_in_full_batches() -> None:
    assert unkeyed_batch_size(DEFAULT_BATCH_SIZE, 10_000_000, 12) == DEFAULT_BATCH_SIZE


def test_a_medium_send_is_cut_into_one_batch_per_partition() -> None:
    assert unkeyed_batch_size(DEFAULT_BATCH_SIZE, 90_000, 12) == 7_500  # 12 batches


def test_a_small_send_is_not_cut_into_slivers() -> None:
    assert unkeyed_batch_size(DEFAULT_BATCH_SIZE, 1_300, 12) == SPREAD_MIN_BATCH  # one batch
    assert unkeyed_batch_size(DEFAULT_BATCH_SIZE, 30_000, 12) == SPREAD_MIN_BATCH


def test_an_explicit_small_batch_size_is_kept() -> None:
    assert unkeyed_batch_size(250, 100_000, 12) == 250
    assert unkeyed_batch_size(1, 5, 12) == 1
