"""Backup copies of JobContainers: appends, full copies, trims, fencing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridstream import codec
from gridstream.errors import StaleEpoch
from gridstream.v1 import worker_pb2
from services.worker.replication import BackupLog, BackupStore


def entries(start: int, end: int, channel: str = "src/a") -> list[worker_pb2.LogEntry]:
    return [worker_pb2.LogEntry(offset=o, channel=channel, sequence=o + 1,
                                batch=codec.encode_batch([o])) for o in range(start, end)]


def request(**fields: object) -> worker_pb2.ReplicateRequest:
    base = {"job_id": "j", "task": 0, "partition": 0, "epoch": 5, "primary": "w1"}
    base.update(fields)
    return worker_pb2.ReplicateRequest(**base)  # type: ignore[arg-type]


def test_appends_then_trim_keeps_the_suffix() -> None:
    log = BackupLog()
    assert log.apply(request(entries=entries(0, 10))) == 10
    assert log.apply(request(entries=entries(10, 12), trim_below=6)) == 12
    assert log.base == 6
    assert sorted(log.entries) == list(range(6, 12))
    assert log.sequences == {"src/a": 12}


def test_trim_never_goes_past_a_gap() -> None:
    log = BackupLog()
    log.apply(request(entries=entries(0, 4) + entries(6, 8)))
    assert log.next_offset == 4
    log.apply(request(trim_below=7))
    assert log.base == 4 and log.next_offset == 4


def test_reset_replaces_everything() -> None:
    log = BackupLog()
    log.apply(request(entries=entries(0, 5)))
    log.apply(request(reset=True, base_offset=20, sequences={"src/b": 9},
                      entries=entries(20, 22)))
    assert (log.base, log.next_offset) == (20, 22)
    assert log.sequences == {"src/b": 9, "src/a": 22}


def test_a_reset_to_an_earlier_base_forgets_the_contiguous_run_it_had() -> None:
    # The end is found from where the last walk stopped; a reset must not
    # keep that point when everything above the new base is gone.
    log = BackupLog()
    assert log.apply(request(entries=entries(0, 10))) == 10
    assert log.apply(request(reset=True, base_offset=3, entries=entries(3, 5))) == 5
    assert log.apply(request(entries=entries(6, 8))) == 5  # a gap at 5
    assert log.apply(request(entries=entries(5, 6))) == 8


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "trim", "reset"]),
                          st.integers(0, 40), st.integers(0, 6)), max_size=30),
       st.integers(0, 2**32))
def test_the_contiguous_end_matches_a_walk_from_the_base(
        steps: list[tuple[str, int, int]], seed: int) -> None:
    log = BackupLog()
    rng = random.Random(seed)
    for kind, at, count in steps:
        if kind == "append":
            batch = entries(at, at + count)
            rng.shuffle(batch)
            got = log.apply(request(entries=batch))
        elif kind == "trim":
            got = log.apply(request(trim_below=at))
        else:
            got = log.apply(request(reset=True, base_offset=at, entries=entries(at, at + count)))
        walked = log.base
        while walked in log.entries:
            walked += 1
        assert got == log.next_offset == walked


def test_a_restarted_holder_reports_how_little_it_has() -> None:
    store = BackupStore()
    # Incremental entries arriving at an empty holder leave a gap from 0.
    assert store.replicate(request(entries=entries(30, 32))) == 0


def test_an_older_primary_is_refused() -> None:
    store = BackupStore()
    store.replicate(request(epoch=9, primary="w2", entries=entries(0, 1)))
    with pytest.raises(StaleEpoch, match="no longer the primary"):
        store.replicate(request(epoch=7, primary="w1", entries=entries(1, 2)))
