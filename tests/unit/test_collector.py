"""The worker's garbage collector settings (services/worker/collector.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gridstream.config import Config, ConfigError, WorkerConfig
from services.worker.collector import OLDER_GENERATIONS_AFTER, tune_collector


@pytest.fixture(autouse=True)
def restored_thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_default_collects_the_young_generation_far_less_often() -> None:
    young = WorkerConfig().gc_young_threshold
    assert young >= 10_000
    assert tune_collector(young) == (young, OLDER_GENERATIONS_AFTER, OLDER_GENERATIONS_AFTER)
    assert gc.get_threshold()[0] == young


def test_zero_keeps_the_interpreters_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    assert tune_collector(0) == (700, 10, 10)


@pytest.mark.parametrize("value", [-1, 5, 20_000_000])
def test_a_threshold_out_of_range_is_refused_naming_the_key(value: int) -> None:
    config = Config(worker=WorkerConfig(gc_young_threshold=value))
    with pytest.raises(ConfigError, match=r"worker\.gc_young_threshold"):
        config.validate()
