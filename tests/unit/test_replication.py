"""Backup copies of JobContainers: appends, full copies, trims, fencing."""

from __future__ import annotations

import pytest

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


def test_a_restarted_holder_reports_how_little_it_has() -> None:
    store = BackupStore()
    # Incremental entries arriving at an empty holder leave a gap from 0.
    assert store.replicate(request(entries=entries(30, 32))) == 0


def test_an_older_primary_is_refused() -> None:
    store = BackupStore()
    store.replicate(request(epoch=9, primary="w2", entries=entries(0, 1)))
    with pytest.raises(StaleEpoch, match="no longer the primary"):
        store.replicate(request(epoch=7, primary="w1", entries=entries(1, 2)))
