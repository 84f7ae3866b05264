"""Event-time windows under kills: the trips example's 5-minute windows.

Kills land while trips are in flight (one on a worker while it restores);
the job must drain, every window of the sent trips must fire exactly once
(no row twice in the append sink of fired windows), with the value the
in-process reference computes from the same trips in event-time order, and
no trip may come out late (the watermarks a replay recomputes are the ones
of the first run). The windowed join after the windows (each window's
summary with the device records of its window, the watermark carried on past
the window stage) must give every device's changes as the fault-free
reference, each once and in order, by the history checker; so must every
device's trips in event-time order, released by event-time timers of a
stateful stage (timers are keyed state: a restored task neither fires one
again nor skips one).

backup_count=2: the faults follow each other without waiting for the cluster
to heal, and the second kill lands as soon as worker-1's restarted process is
in the routing table. On a loaded machine that restart takes seconds: the
restarted worker has restored partitions and acknowledged batches (copied to
one other worker) by the time it is killed, and the third kill at 8 s lands
before that death is even detected — two simultaneous failures, beyond
backup_count=1 (docs/recovery.md, "Guarantees and limits"); a run lost and
named batches so. With f=2 the sequence is within what is promised. The two
replication bugs this test found with backup_count=1 (a worker handing a
partition back acknowledging batches with its own copy only; a restored log
acknowledged before the new owner's holders held it) are covered without
timing by tests/unit/test_replication_handback.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gridstream.config import ClusterConfig, Config
from gridstream.faultsteps import Step
from gridstream.scenarios import run_trips

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]


async def test_windows_fire_once_with_reference_values_under_kills(tmp_path: Path) -> None:
    config = replace(Config(), cluster=ClusterConfig(window_size=5_000, partitions=8,
                                                     backup_count=2))
    steps = [Step("kill", 3.0), Step("kill", 4.5, again=True), Step("kill", 8.0)]
    run = await run_trips(steps, tmp_path, records=20_000, stream_s=12.0, config=config,
                          seed=3)
    print(run.table())
    assert len(run.faults) == 3 and all(f.in_flight for f in run.faults), run.table()
    assert not run.problems, run.table()
    assert not run.losses and not run.undrained, run.table()
    assert run.windows > 1_000, run.table()  # 50 devices x 66 windows
    assert run.changes.ok and run.changes.keys == 50, run.table()
